"""Check a running testbed against its plan by reading the kernel back and measuring: routes (the kernel's
route to each DC subnet follows the planned shortest-delay path), reachability of all host pairs, and the
per-direction link checks of `check.links` (shaper health, delays, goodput, drops)."""

from __future__ import annotations

from pyroute2 import IPRoute

from testbed.backends import nsfs
from testbed.backends.base import Backend
from testbed.check import links
from testbed.check.checks import Check, VerifyReport
from testbed.check.paths import check_paths
from testbed.plan.builder import FIRST_HOST_OCTET
from testbed.plan.model import Plan
from testbed.probe.icmp import echo_all
from testbed.shaping.registry import shaper_for


def check_reachability(plan: Plan, count: int = 1, timeout_s: float = 2.0) -> list[Check]:
    """Echo from every host to every other host; one check per ordered pair."""
    hosts = plan.hosts
    addr = {h.name: h.ip() for h in hosts}
    targets = {h.netns: [addr[o.name] for o in hosts if o is not h] for h in hosts}
    results = {(r.src, r.dst): r for r in echo_all(targets, count=count, timeout_s=timeout_s)}
    name_of_ns = {h.netns: h.name for h in hosts}
    name_of_addr = {v: k for k, v in addr.items()}
    checks = []
    for (src, dst), r in sorted(results.items()):
        rtt = f"{min(r.rtts_s) * 1e3:.3f} ms" if r.rtts_s else "no reply"
        checks.append(Check("reach", f"{name_of_ns[src]} -> {name_of_addr[dst]}", f"{r.sent}/{r.sent} replies",
                            f"{r.received}/{r.sent} ({rtt})", r.ok))
    return checks


def check_routes(plan: Plan) -> list[Check]:
    """Ask each router's kernel for its route to every other DC subnet and compare with the plan."""
    checks = []
    for node in plan.routers:
        with nsfs.entered(node.netns):
            ipr = IPRoute()
        with ipr:
            for route in node.routes:
                probe = str(route.dst.network_address + FIRST_HOST_OCTET)
                got = ipr.route("get", dst=probe)
                gateway = got[0].get("RTA_GATEWAY") if got else None
                oif = got[0].get("RTA_OIF") if got else None
                dev = ipr.get_links(oif)[0].get("IFLA_IFNAME") if oif else None
                expected = f"via {route.gateway} dev {route.dev}"
                measured = f"via {gateway} dev {dev}"
                if route.src:
                    expected += f" src {route.src}"
                    measured += f" src {got[0].get('RTA_PREFSRC') if got else None}"
                checks.append(Check("route", f"{node.name} -> {route.dst}", expected, measured, expected == measured))
    return checks


def verify_basic(plan: Plan) -> VerifyReport:
    """Reachability and routes of a running testbed."""
    report = VerifyReport(testbed=plan.testbed)
    report.checks += check_routes(plan)
    report.checks += check_reachability(plan)
    return report


def verify_testbed(backend: Backend, level: str = "full", probes: int = 10) -> VerifyReport:
    """`quick`: routes, reachability, shaper health, delays per direction and link, round trips end to end
    between every pair of DCs along their routes, drops, and with rxe devices the RDMA round trip and
    goodput per link. `full` adds TCP throughput per direction."""
    shaper = shaper_for(backend)
    report = verify_basic(backend.state.plan)
    report.checks += links.check_health(shaper, backend.state.shaper_name)
    report.checks += links.check_delays(backend, probes=probes)
    report.checks += check_paths(backend, probes=probes)
    if level == "full":
        report.checks += links.check_throughput(backend, shaper)
    report.checks += links.check_drops(shaper)
    if backend.state.rdma:
        from testbed.check.rdma import check_rdma

        report.checks += check_rdma(backend)
    return report
