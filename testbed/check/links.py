"""Per-OTN-direction verification: measured delay, round trip, throughput and drops against the plan."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

from testbed.backends import nsfs
from testbed.backends.base import Backend
from testbed.check.checks import Check
from testbed.plan.builder import ETH_OVERHEAD
from testbed.plan.model import LinkDirection
from testbed.probe.latency import LatencySample, one_way, round_trip
from testbed.probe.throughput import ThroughputResult, tcp_throughput
from testbed.shaping.registry import Shaper
from testbed.util import units
from testbed.util.hostload import LoadMonitor

MIN_GOODPUT_FRACTION = 0.96
"""Of the expected goodput (`expected_goodput_bps`). A link shaped 5 % slow carries at most 0.95 of it, so it
fails however quiet the host; a correct link fails only when host noise costs it over 4 % in every run."""
MAX_GOODPUT_FRACTION = 1.02
IP_TCP_HEADER_BYTES = 40
TCP_TIMESTAMP_BYTES = 12
THROUGHPUT_RUNS = 3
"""At most this many iperf3 runs per direction; the first that reaches MIN_GOODPUT_FRACTION ends them: a
host stall on a shared machine can dent a run, and a link that cannot carry its rate fails every run."""
DISTURBED_RUNS = 3
"""Beyond THROUGHPUT_RUNS, at most this many more runs replace runs the host disturbed (testbed.util.hostload:
CPU steal or other processes): those measure the host, not the link, and the check says how many there were."""


RTT_FLOOR_S = 0.2e-3
ONE_WAY_FLOOR_S = 0.1e-3
"""The smallest tolerance a round trip and a one-way delay get (delay_tolerance's floor)."""


def delay_tolerance(expected_s: float, floor_s: float, spread_s: float = 0.0) -> float:
    """max(3 %, floor, 1.5 x the samples' IQR): the goal for RTT uses a 0.2 ms floor, one way half of it.

    A check cannot claim more precision than its own samples have: on a quiet host the IQR is ~0.05 ms and
    the floor decides; under QEMU's TCG (the stock-kernel tier) the path itself jitters by ~1 ms. A missing
    or misplaced delay stage still fails: it moves the median by the whole delay, not by the spread."""
    return max(0.03 * expected_s, floor_s, 1.5 * spread_s)


SPREAD_ALLOWANCE_FRACTION = 0.2
SPREAD_ALLOWANCE_FLOOR_S = 1e-3
"""A one-way probe's spread (IQR) may exceed what the plan's jitter gives (a uniform +-j has an IQR of j) by
max(20 % of the delay, 1 ms): host noise on a quiet 2-core VM reads an IQR of ~0.05 ms, a stall-prone one up to a
few tenths, QEMU's TCG ~1 ms at 20 ms. Without this bound the tolerance, which widens with the spread, let a
jitter the plan does not state pass as noise (tests/test_faults.py: +-4 ms on a 5 ms link read a median on time
and an IQR of ~4 ms)."""


def spread_limit(direction: LinkDirection) -> float:
    """The most spread a one-way probe of `direction` may show: the planned jitter's IQR plus host noise."""
    return direction.jitter_s + max(SPREAD_ALLOWANCE_FRACTION * direction.delay_s, SPREAD_ALLOWANCE_FLOOR_S)


def check_delays(backend: Backend, probes: int = 10) -> list[Check]:
    """One-way delay per direction and round trip per link, timed after the ingress queue."""
    plan = backend.state.plan
    checks = []
    by_link: dict[str, list[LinkDirection]] = {}
    for d in plan.directions:
        by_link.setdefault(d.link, []).append(d)
        sample = one_way(backend.netns_path(d.src_node), backend.netns_path(d.dst_node), plan.receiver_address(d),
                         count=probes, timeout_s=max(1.0, 4 * d.delay_s + 0.5))
        checks.append(delay_check("one-way", f"{d.link} {d.label}", d.delay_s, ONE_WAY_FLOOR_S, sample, probes, d.label,
                                  spread_limit_s=spread_limit(d)))
    for link, directions in by_link.items():
        fwd = directions[0]
        want = sum(d.delay_s for d in directions)
        sample = round_trip(backend.netns_path(fwd.src_node), plan.receiver_address(fwd), count=probes,
                            timeout_s=max(1.0, 4 * want + 0.5))
        checks.append(delay_check("rtt", f"{link} from {fwd.src_dc}", want, RTT_FLOOR_S, sample, probes, link))
    return checks


def delay_check(kind: str, subject: str, want: float, floor_s: float, sample: LatencySample, probes: int,
                key: str, above_s: float = 0.0, spread_limit_s: float | None = None) -> Check:
    """Median at most `delay_tolerance` (spread included) + `above_s` above `want` (time the path costs on this
    machine that no plan states, measured by the caller), and at most max(3 %, floor) below it, whatever the
    spread: a delay stage holds a packet until its due time or later, never earlier, so host noise moves a
    median up, and only a link shorter than its plan moves it down. Both bounds are stated in the check. With
    `spread_limit_s`, the samples' IQR must be within it too (a jitter the plan does not state)."""
    spread_ok = spread_limit_s is None or sample.iqr_s <= spread_limit_s
    tol = delay_tolerance(want, floor_s, sample.iqr_s if spread_limit_s is None else min(sample.iqr_s, spread_limit_s))
    below = delay_tolerance(want, floor_s)
    got = sample.median_s
    ok = sample.lost == 0 and not math.isnan(got) and want - below <= got <= want + tol + above_s and spread_ok
    expected = (f"{units.format_time(want)} ± {units.format_time(tol)}" if below == tol else
                f"{units.format_time(want)} -{units.format_time(below)}/+{units.format_time(tol)}")
    if above_s:
        expected += f" (+{units.format_time(above_s)} the unshaped legs)"
    measured = f"{units.format_time(got) if not math.isnan(got) else 'none'} median of {probes}"
    if spread_limit_s is not None:
        expected += f", IQR <= {units.format_time(spread_limit_s)}"
        if not spread_ok:
            measured += f", IQR {units.format_time(sample.iqr_s)}: a jitter the plan does not state"
    measured += f", {sample.lost} lost" if sample.lost else ""
    return Check(kind, subject, expected, measured, ok, key=key, value=None if math.isnan(got) else got)


def expected_goodput_bps(direction: LinkDirection, timestamps: bool = True) -> float:
    """The TCP payload rate a correct direction carries: HTB meters whole Ethernet frames (MTU + 14 bytes)
    while each carries MTU - 40 (IP, TCP) - 12 (timestamps option) bytes of payload: 95.6 % at MTU 1500. An OTN
    edge whose DC-side port is slower than the link (`edge_rate`) carries that port's rate instead."""
    payload = direction.mtu - IP_TCP_HEADER_BYTES - (TCP_TIMESTAMP_BYTES if timestamps else 0)
    return direction.bottleneck_bps * payload / (direction.mtu + ETH_OVERHEAD)


def _tcp_timestamps(netns_path: str) -> bool:
    with nsfs.entered(netns_path):
        return Path("/proc/sys/net/ipv4/tcp_timestamps").read_text().strip() != "0"


def check_throughput(backend: Backend, shaper: Shaper | None, seconds: float = 3.0) -> list[Check]:
    """TCP goodput per direction between the routers against what the rate allows at the link's MTU:
    96-102 % of `expected_goodput_bps`, best of up to THROUGHPUT_RUNS runs."""
    plan = backend.state.plan
    checks = []
    for d in plan.directions:
        addr = plan.receiver_address(d)
        expected = expected_goodput_bps(d, _tcp_timestamps(backend.netns_path(d.src_node)))
        cpu_before = daemon_cpu(shaper, d.dst_node)
        src_cpu_before = daemon_cpu(shaper, d.src_node)
        daemons = daemons_cpu(shaper, (d.src_node, d.dst_node))
        result, disturbed = _measured(backend, d, addr, seconds, daemons)
        cpu = _cpu_share(shaper, d.dst_node, cpu_before, result.seconds + 1.0)
        src_cpu = _cpu_share(shaper, d.src_node, src_cpu_before, result.seconds + 1.0)
        fraction = result.bits_per_s / expected
        first, runs, set_aside, disturbed_runs = fraction, 1, [], 0
        while fraction < MIN_GOODPUT_FRACTION:
            if disturbed:
                disturbed_runs += 1
                if len(set_aside) < DISTURBED_RUNS:
                    set_aside.append(disturbed)         # the host took it: a run more is measured in its place
            if runs >= THROUGHPUT_RUNS + len(set_aside):
                break
            again, disturbed = _measured(backend, d, addr, seconds, daemons)
            runs += 1
            if again.bits_per_s > result.bits_per_s:
                result, fraction = again, again.bits_per_s / expected
        retry = f", best of {runs} (first {first:.1%} of expected)" if runs > 1 else ""
        if disturbed_runs:
            retry += f", {disturbed_runs} of them on a disturbed host ({set_aside[0]})"
        ok = MIN_GOODPUT_FRACTION <= fraction <= MAX_GOODPUT_FRACTION
        cpu_text = "" if cpu is None else f", delay daemons {cpu:.0%} + {src_cpu:.0%} of a core"
        checks.append(Check("throughput", f"{d.link} {d.label}",
                            f"{MIN_GOODPUT_FRACTION:.0%}-{MAX_GOODPUT_FRACTION:.0%} of {units.format_rate(expected)} "
                            f"(TCP at MTU {d.mtu} over {units.format_rate(d.bottleneck_bps)})",
                            f"{units.format_rate(result.bits_per_s)} ({result.bits_per_s / d.bottleneck_bps:.1%} of the rate, "
                            f"{fraction:.1%} of expected), {result.retransmits} retransmits{cpu_text}{retry}", ok))
    return checks


def _measured(backend: Backend, d: LinkDirection, addr: str, seconds: float,
              daemons: Callable[[], float | None] | None) -> tuple[ThroughputResult, str]:
    """One iperf3 run and what disturbed the host meanwhile ('' when nothing did)."""
    monitor = LoadMonitor(daemons)
    result = tcp_throughput(backend, d.src_node, d.dst_node, addr, seconds=seconds)
    load = monitor.finish()
    return result, "; ".join(load.reasons) if load.disturbed else ""


def daemons_cpu(shaper: Shaper | None, nodes: tuple[str, ...]) -> Callable[[], float | None] | None:
    """CPU seconds of the shaper's daemons on `nodes`, read on demand (None without a shaper; the reading is
    None where the shaper runs no daemon there)."""
    if shaper is None:
        return None

    def total() -> float | None:
        values = [v for v in (daemon_cpu(shaper, n) for n in nodes) if v is not None]
        return sum(values) if values else None
    return total


def daemon_cpu(shaper: Shaper | None, node: str) -> float | None:
    """CPU seconds the shaper's daemon on `node` has used (None where it runs none)."""
    stats = shaper.daemon_stats(node) if shaper is not None else None
    return None if stats is None else stats.cpu_s


def _cpu_share(shaper: Shaper | None, node: str, before: float | None, wall_s: float) -> float | None:
    after = daemon_cpu(shaper, node)
    if before is None or after is None:
        return None
    return max(0.0, after - before) / wall_s


def check_drops(shaper: Shaper | None) -> list[Check]:
    if shaper is None:
        return []
    checks = []
    for d, loss in shaper.drops_with_planned_loss():
        detail = f"qdisc {d.qdisc_drops}, nfqueue {d.queue_drops}, daemon gaps {d.daemon_gaps}"
        if d.random_drops:
            detail += (f" (+{d.random_drops} intended, configured loss)" if loss else
                       f", {d.random_drops} random drops the plan does not state")
        checks.append(Check("drops", f"{d.link} {d.direction}", "0", detail, d.beyond_plan(loss) == 0))
    return checks


def check_health(shaper: Shaper | None, shaper_name: str) -> list[Check]:
    if shaper is None:
        return [Check("shaper", "all OTN links", "a shaper", f"none ({shaper_name}): links carry NO delay or rate "
                      "limit", False)]
    health = shaper.health()
    if health.ok:
        return [Check("shaper", "all OTN links", f"{shaper.name} installed", "qdiscs, rules and daemons present", True)]
    return [Check("shaper", "all OTN links", f"{shaper.name} installed", p, False) for p in health.problems]
