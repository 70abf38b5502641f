"""End-to-end round trips between datacenters along their routed paths: from the first host of one DC to the
first host of another, against the sum of the planned delays of every OTN direction the route crosses (both
ways) and the two fabrics. The per-link checks (`check.links`) time each link from its own routers; a path
through an intermediate DC also crosses that DC's router and two delay lines, so it is checked as a whole."""

from __future__ import annotations

from itertools import combinations

from testbed.backends.base import Backend
from testbed.check.checks import Check
from testbed.check.links import delay_check
from testbed.plan.model import Node, Plan
from testbed.probe.latency import round_trip

PATH_FLOOR_S = 0.3e-3
"""An end-to-end round trip is within max(3 %, 0.3 ms, 1.5 x its IQR) of its path's planned delay below it, and
that plus the path's unshaped legs above it (`unshaped_legs_s`)."""


def planned_round_trip(plan: Plan, a: str, b: str) -> float:
    """The delay a host of DC a should see to a host of DC b and back: every hop both ways, both fabrics."""
    fabrics = 2 * (plan.fabrics[a].latency_s + plan.fabrics[b].latency_s) if plan.fabrics else 0.0
    return sum(h.delay_s for h in plan.hops(a, b)) + sum(h.delay_s for h in plan.hops(b, a)) + fabrics


def check_paths(backend: Backend, probes: int = 10) -> list[Check]:
    """One round-trip check per pair of DCs, host to host over the routed path."""
    plan = backend.state.plan
    first: dict[str, Node] = {}
    for host in plan.hosts:
        first.setdefault(host.dc, host)
    legs = {dc: _unshaped_leg_s(backend, plan, host, probes) for dc, host in first.items()}
    checks = []
    for a, b in combinations(sorted(first), 2):
        want = planned_round_trip(plan, a, b)
        sample = round_trip(backend.netns_path(first[a].name), first[b].ip(), count=probes,
                            timeout_s=max(1.0, 4 * want + 0.5))
        route = " ".join(plan.paths[a][b])
        checks.append(delay_check("path-rtt", f"{a} <-> {b} (via {route})", want, PATH_FLOOR_S, sample, probes,
                                  f"{a}<->{b}", above_s=legs[a] + legs[b]))
    return checks


def _unshaped_leg_s(backend: Backend, plan: Plan, host: Node, probes: int) -> float:
    """The round trip from `host` to its own DC's router, less the fabric's planned latency both ways: what
    the path's software costs on this machine beyond any plan (the fabric, a forwarding hop, the probe's own
    echo; ~0.05 ms on a host, ~1 ms under QEMU's TCG). A path crosses one such leg at each end, so its round
    trip may sit that much above the plan; never below it."""
    gateway = str(next(r.gateway for r in host.routes))
    sample = round_trip(backend.netns_path(host.name), gateway, count=probes)
    fabric = 2 * plan.fabrics[host.dc].latency_s if plan.fabrics else 0.0
    return max(0.0, sample.median_s - fabric) if sample.values_s else 0.0
