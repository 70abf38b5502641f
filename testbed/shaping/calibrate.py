"""Measure the emulator's own one-way latency on each OTN direction.

Veth hops, forwarding, the NFQUEUE round trip through the daemon and the probe's own system calls cost
~0.05-0.15 ms one way on a 2-core VM. A real link of delay d should deliver d end to end, so shapers first
hold every packet for a known time, measure, and then hold for d minus the measured excess (never below
zero). The report names the figure subtracted.

One rule for two readings of one excess (`agreed`): within AGREE_S of each other the later stands, further
apart a third reading decides; `correction` says whether a residual is worth a new hold. The netem shaper's
`confirmed_excess` follows the same rule.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable

from testbed.backends.base import Backend
from testbed.plan.model import LinkDirection
from testbed.probe.latency import PROBE_INTERVAL_S, one_way
from testbed.shaping.base import ShaperError

CALIBRATION_PROBES = 10
CALIBRATION_ROUNDS = 4
"""The calibration is the median of every probe of a few rounds, after a discarded warm-up round: a hiccup
round moves it little, and it is what a later measurement typically sees (not the lowest round's median,
which sits below the typical one by about the rounds' own scatter, +-75 us for rounds of 10 probes)."""
AGREE_S = 100e-6
"""Two readings of one excess closer than this agree: rounds of CALIBRATION_PROBES probes vary by about
+-75 us. Further apart, one of them was disturbed (a stalled host reads high in every probe of a round)."""
CALIBRATION_HOLD_S = 1e-3
"""The delay line's calibration hold: its daemon's lateness does not depend on the hold's length."""


def excess_one_way(backend: Backend, direction: LinkDirection, installed_hold_s: float) -> float:
    """One direction's median one-way latency minus the hold the shaper has installed on it."""
    plan = backend.state.plan
    values: list[float] = []
    for round_ in range(CALIBRATION_ROUNDS + 1):
        sample = one_way(backend.netns_path(direction.src_node), backend.netns_path(direction.dst_node),
                         plan.receiver_address(direction), count=CALIBRATION_PROBES, interval_s=PROBE_INTERVAL_S,
                         timeout_s=max(1.0, 4 * installed_hold_s + 0.5))
        if sample.lost or not sample.values_s:
            raise ShaperError(f"calibration probe lost on {direction.label}: the link does not carry packets")
        if round_:                       # round 0 warms up code paths and caches
            values.extend(sample.values_s)
    return statistics.median(values) - installed_hold_s


def confirmed_excess(backend: Backend, direction: LinkDirection, first_s: float, agree_s: float) -> float:
    """The excess measured once more at the hold that will be kept (the asked delay less `first_s`), so that
    one calibration taken while the host stalled (it reads high in every probe, and the link would deliver
    short by as much for as long as it is up) cannot stand alone: `agreed`, the rule every calibration follows
    (the later of two readings that agree within `agree_s`, else the median of three)."""
    hold = max(0.0, direction.delay_s - first_s)
    second = excess_one_way(backend, direction, hold)
    return agreed(first_s, second, lambda: excess_one_way(backend, direction, hold), agree_s)


def outvoted(first_s: float, second_s: float, third: Callable[[], float]) -> float:
    """Two readings of one excess that disagree: a third at the same hold as the second decides, the median of
    the three, so one disturbed reading out of three moves nothing (a steady offset that both later readings
    show is kept)."""
    return statistics.median((first_s, second_s, third()))


def agreed(first_s: float, second_s: float, third: Callable[[], float], agree_s: float) -> float:
    """The later of two readings of one excess that agree within `agree_s`; otherwise `outvoted` decides."""
    return second_s if abs(second_s - first_s) <= agree_s else outvoted(first_s, second_s, third)


def correction(residual_s: float, floor_s: float, limit_s: float = math.inf) -> float:
    """What a hold is corrected by for a measured residual: nothing within `floor_s` (the readings' own
    resolution or scatter) or past `limit_s` (no calibration error but a missing or doubled delay, left for
    verify to see); otherwise the residual."""
    return residual_s if floor_s < abs(residual_s) <= limit_s else 0.0


def base_one_way(backend: Backend, installed_hold_s: float = 0.0) -> dict[str, float]:
    """Per OTN direction (by label): median one-way latency minus the hold the shaper has installed."""
    return {d.label: excess_one_way(backend, d, installed_hold_s) for d in backend.state.plan.directions}
