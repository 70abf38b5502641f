"""RDMA verification per OTN link: round trip and goodput over the hosts' rxe devices, with the same endpoint
the workers use (testbed/rdma/probe.py), against the link's configured delays and rate.

Per link, the first host of each DC: ping-pongs of 64 B give the round trip (compared with the sum of both
directions' delays, after subtracting the probe's own round trip measured on the sending host over its own
rxe device: the verbs, rxe and Python work that no link causes), then back-to-back 256 KiB messages each way
give the goodput (compared with the rate, less RoCEv2's headers).

The round trip is the shortest of the ping-pongs, less the shortest of the probe's own: a stall of the host (or
of a QEMU TCG guest, where stalls of tens of ms are common) only ever adds time, so the floor is what the link
delivers; a median moved with the host's load (it failed a CI run at 54.6 ms for 40 ms under TCG, while the
floor there is 42-43 ms). Under TCG the tolerance still allows for the guest's slower verbs path.

The subtracted floor is itself one reading of a noisy quantity: the probe's own round trip varies by its median
less its shortest (0.05 ms on a host; several ms under TCG, where a CI run read the own floor at 11.3 ms and the
link at 37.4 ms for 40 ms). The check cannot resolve a link shorter than configured by less than that spread,
so the lower bound is -3 % less it, stated in the check; a link without its delay still fails by the whole delay.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass

from testbed.backends.base import Backend
from testbed.backends.vm import in_vm
from testbed.check.checks import Check
from testbed.plan.model import LinkDirection, Node
from testbed.rdma.probe import ProbeResult
from testbed.rdma.softroce import ROCE_OVERHEAD, rdma_mtu_for
from testbed.rdma.support import RdmaUnavailable
from testbed.util import units
from testbed.util.paths import REPO_ROOT

PROBE_PORT = 18515
BULK_BYTES = 256 * 1024
PINGS = 30
"""Ping-pongs per round trip reading: enough that one of them meets no stall (1.5 s on a 40 ms link under TCG)."""
OWN_PINGS = 90
"""Ping-pongs for the probe's own round trip: each is short (0.1 ms on a host, 5-10 ms under TCG), so more of
them span as long a stretch of the host's load as the cross-DC reading does; a floor read too high would pass
a link that lacks part of its delay."""
RTT_SLACK_S = 0.002
"""Above the configured round trip: the probe's own wake-ups (a host); 10 ms more under TCG."""
TCG_EXTRA_SLACK_S = 0.010
MIN_GOODPUT, MAX_GOODPUT = 0.80, 1.02
TCG_MIN_GOODPUT = 0.50


def check_rdma(backend: Backend, count: int = 16, timeout_s: float = 120.0) -> list[Check]:
    """One `rdma-rtt` check per OTN link and one `rdma-rate` per direction; none when the testbed has no rxe."""
    plan = backend.state.plan
    record = backend.state.rdma
    if record is None:
        return []
    checks = []
    seen = set()
    tcg = in_vm()
    own: dict[str, OwnRoundTrip] = {}
    for d in plan.directions:
        src, dst = _first_host(plan.hosts, d.src_dc), _first_host(plan.hosts, d.dst_dc)
        if src is None or dst is None:
            continue
        reverse = plan.direction(d.dst_dc, d.src_dc)
        rtt_s = d.delay_s + reverse.delay_s
        run = probe(backend, src, dst, rtt_s, d, count=count, timeout_s=timeout_s)
        if d.link not in seen:
            seen.add(d.link)
            if src.name not in own:
                own[src.name] = OwnRoundTrip.of(probe(backend, src, src, 0.001, d, count=1, size=4096,
                                                      pings=OWN_PINGS, timeout_s=timeout_s))
            checks.append(judge_rtt(f"{d.link} {src.name} <-> {dst.name}", rtt_s, 2 * run.one_way_min_s,
                                    own[src.name], tcg=tcg, where=src.name, qps=run.qps, rdma_mtu=run.rdma_mtu))
        checks.append(judge_rate(f"{d.link} {d.label}", d.rate_bps, run, tcg=tcg))
    return checks


def judge_rate(subject: str, rate_bps: float, run: ProbeResult, *, tcg: bool) -> Check:
    """The `rdma-rate` check: the bulk goodput against the rate less RoCEv2's headers at the run's RDMA MTU,
    within MIN_GOODPUT (TCG_MIN_GOODPUT in a TCG guest) .. MAX_GOODPUT (more means the direction is unshaped)."""
    expected = rate_bps * run.rdma_mtu / (run.rdma_mtu + ROCE_OVERHEAD + 14)
    fraction = run.goodput_bps / expected
    low = TCG_MIN_GOODPUT if tcg else MIN_GOODPUT
    return Check("rdma-rate", subject,
                 f"{low:.0%}-{MAX_GOODPUT:.0%} of {units.format_rate(expected)} (RoCEv2 at RDMA MTU "
                 f"{run.rdma_mtu} over {units.format_rate(rate_bps)})" + (" (TCG)" if tcg else ""),
                 f"{units.format_rate(run.goodput_bps)} ({fraction:.1%} of expected)",
                 low <= fraction <= MAX_GOODPUT, key=subject, value=run.goodput_bps)


@dataclass(frozen=True, slots=True)
class OwnRoundTrip:
    """The probe's own round trip on one host (no link): its shortest, subtracted from a link's shortest, and
    its spread (median less shortest), how far one such reading can sit from another: the check's resolution."""

    shortest_s: float
    spread_s: float

    @classmethod
    def of(cls, run: ProbeResult) -> OwnRoundTrip:
        return cls(2 * run.one_way_min_s, max(0.0, 2 * (run.one_way_s - run.one_way_min_s)))


def judge_rtt(subject: str, configured_s: float, shortest_s: float, own: OwnRoundTrip, *, tcg: bool, where: str,
              qps: int, rdma_mtu: int) -> Check:
    """The `rdma-rtt` check: the shortest ping-pong less the probe's own shortest round trip, within -3 % less the
    own round trip's spread (the probe's resolution) and +RTT_SLACK_S (+TCG_EXTRA_SLACK_S in a TCG guest) of the
    configured round trip. Below means the RDMA traffic missed the link's delay (a route or a shaper bypassed);
    above, a delay the link should not have."""
    slack = RTT_SLACK_S + (TCG_EXTRA_SLACK_S if tcg else 0.0)
    low = 0.97 * configured_s - own.spread_s
    measured = shortest_s - own.shortest_s
    ok = low <= measured <= configured_s + slack
    return Check("rdma-rtt", subject,
                 f"{units.format_time(configured_s)} -3 % -{units.format_time(own.spread_s)} (the probe's own "
                 f"spread)/+{units.format_time(slack)}" + (" (TCG)" if tcg else ""),
                 f"{units.format_time(measured)} (shortest of {PINGS} ping-pongs, {units.format_time(shortest_s)}, "
                 f"less the probe's own shortest of {OWN_PINGS}, {units.format_time(own.shortest_s)}, on {where}; "
                 f"{qps} QP, RDMA MTU {rdma_mtu})", ok)


def probe(backend: Backend, src: Node, dst: Node, rtt_s: float, d: LinkDirection, *, count: int = 16,
          size: int = BULK_BYTES, pings: int = PINGS, timeout_s: float = 120.0) -> ProbeResult:
    """The probe client on `src` against a server on `dst` (the same host: its own round trip); bulk goes
    src -> dst."""
    record = backend.state.rdma
    assert record is not None
    server_dev, client_dev = record.device_of(dst.name), record.device_of(src.name)
    if server_dev is None or client_dev is None:
        raise RdmaUnavailable(f"no rxe device on {dst.name if server_dev is None else src.name}",
                              hint="bring the testbed up with --rdma softroce on a kernel with rdma_rxe (testbed doctor)")
    mtu = rdma_mtu_for(min(d.mtu, src.interfaces[0].mtu, dst.interfaces[0].mtu) if src != dst
                       else src.interfaces[0].mtu)
    common = ["--rtt", repr(rtt_s), "--rate", repr(d.rate_bps), "--mtu", str(mtu), "--size", str(size),
              "--count", str(count), "--pings", str(pings), "--timeout", repr(timeout_s), "--port", str(PROBE_PORT)]
    module = [sys.executable, "-m", "testbed.rdma.probe"]
    env = {"PYTHONPATH": str(REPO_ROOT)}
    server = backend.popen(dst.name, [*module, "serve", "--device", server_dev.name, "--gid-index",
                                      str(server_dev.gid_index), *common], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert server.stdout is not None
        server.stdout.readline()                   # {"listening": PORT}
        client = backend.exec(src.name, [*module, "client", "--device", client_dev.name, "--gid-index",
                                         str(client_dev.gid_index), "--server", f"{dst.ip()}:{PROBE_PORT}", *common],
                              capture_output=True, text=True, timeout=timeout_s, env=env)
        if client.returncode != 0:
            raise RdmaUnavailable(f"RDMA probe {src.name} -> {dst.name} failed: {(client.stderr or '').strip()[-800:]}",
                                  hint="testbed doctor says what this kernel's RDMA offers")
        result = json.loads(client.stdout.strip().splitlines()[-1])
        server.wait(timeout=30)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    return ProbeResult.from_json(result)


def _first_host(hosts: tuple[Node, ...], dc: str) -> Node | None:
    return next((h for h in hosts if h.dc == dc), None)
