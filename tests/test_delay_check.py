"""The delay check's bounds (testbed/check/links.py): host noise may widen the bound above a planned delay (a
delay stage delivers late, never early), but never the bound below it, so a link shorter than its plan fails
however noisy its probes."""

from __future__ import annotations

from testbed.check.links import delay_check, spread_limit
from testbed.plan.model import LinkDirection
from testbed.probe.latency import LatencySample
from testbed.shaping.base import DirectionDrops

PLAN = 12e-3


def _check(values_ms: list[float], above_s: float = 0.0):
    return delay_check("path-rtt", "a <-> c", PLAN, 0.3e-3, LatencySample(tuple(v * 1e-3 for v in values_ms), 0),
                       len(values_ms), "a<->c", above_s=above_s)


NOISY_ON_PLAN = [12.0, 12.1, 12.2, 12.3, 12.5, 12.6, 12.9, 13.2, 13.5, 13.8]   # IQR 1.1 ms, median 12.55 ms
NOISY_SHORT = [v - 1.0 for v in NOISY_ON_PLAN]                                # the same noise, 1 ms short


def test_a_noisy_right_link_passes_and_the_same_noise_one_ms_short_fails() -> None:
    assert _check(NOISY_ON_PLAN).ok
    short = _check(NOISY_SHORT)
    assert not short.ok, short.expected
    assert "-360 us" in short.expected.replace("µ", "u") or "-0.36" in short.expected, short.expected


def test_above_the_plan_the_spread_and_the_unshaped_legs_are_allowed_and_no_more() -> None:
    late = [v + 1.5 for v in NOISY_ON_PLAN]          # median 14.05 ms: beyond 1.5 x IQR (1.65 ms) above 12 ms
    assert not _check(late).ok
    assert _check(late, above_s=0.5e-3).ok


def test_a_quiet_sample_has_one_symmetric_bound() -> None:
    quiet = [12.0 + 0.01 * i for i in range(10)]
    check = _check(quiet)
    assert check.ok and "±" in check.expected
    assert not _check([v - 0.5 for v in quiet]).ok and not _check([v + 0.45 for v in quiet]).ok


def _one_way(values_ms: list[float], limit_s: float):
    return delay_check("one-way", "a -> b", 5e-3, 0.1e-3, LatencySample(tuple(v * 1e-3 for v in values_ms), 0),
                       len(values_ms), "a -> b", spread_limit_s=limit_s)


def test_a_spread_beyond_the_planned_jitter_fails_however_centred_its_median() -> None:
    jittered = [1.2, 2.0, 2.9, 3.8, 4.9, 5.1, 6.2, 7.1, 8.0, 8.8]            # +-4 ms around 5 ms: IQR ~4 ms
    unplanned = _one_way(jittered, spread_limit(_direction(jitter_s=0.0)))
    assert not unplanned.ok and "a jitter the plan does not state" in unplanned.measured, unplanned
    assert _one_way(jittered, spread_limit(_direction(jitter_s=4e-3))).ok            # the same, planned
    assert _one_way([5.0 + 0.02 * i for i in range(10)], spread_limit(_direction(jitter_s=0.0))).ok


def test_random_drops_are_intended_only_where_the_plan_states_a_loss() -> None:
    drops = DirectionDrops(link="a--b", direction="a -> b", qdisc_drops=0, random_drops=3)
    assert drops.unintended == 0
    assert drops.beyond_plan(planned_loss=0.0) == 3
    assert drops.beyond_plan(planned_loss=0.01) == 0
    assert DirectionDrops(link="a--b", direction="a -> b", qdisc_drops=2).beyond_plan(0.01) == 2


def _direction(jitter_s: float) -> LinkDirection:
    return LinkDirection(link="a--b", src_dc="a", dst_dc="b", src_node="a-rtr", src_ifname="otn0", dst_node="b-rtr",
                         dst_ifname="otn0", delay_s=5e-3, rate_bps=1e8, jitter_s=jitter_s, loss=0.0, lossless=True,
                         mtu=1500, bdp_bytes=125000, rate_queue_packets=100, delay_queue_packets=100)
