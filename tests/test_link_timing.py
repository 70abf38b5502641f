"""The delay each delay-line direction delivered during a run (cf. Mininet-HiFi's invariant monitoring), from
the daemon's own release errors: hand-computed, and a late link is flagged."""

from __future__ import annotations

import pytest

from testbed.plan import build_plan
from testbed.run.runner import link_timing
from testbed.run.summary import LinkTiming
from testbed.topology import load_topology
from testbed.util.paths import resolve_topology

PLAN = build_plan(load_topology(resolve_topology("2dc-1000km")))
AB, BA = (d.label for d in PLAN.directions)


def test_error_is_the_runs_mean_less_what_calibration_absorbed() -> None:
    """1000 packets released during the run with 60 ms of release error in all: 60 us each; the calibration
    saw 20 us and subtracted it from the hold, so the link delivered 40 us late: within 150 us (3 % of 5 ms)."""
    before = {AB: (500, 0.010), BA: (100, 0.0)}
    after = {AB: (1500, 0.070), BA: (100, 0.0)}
    (timing,) = link_timing(PLAN, before, after, {AB: 20e-6})          # BA carried nothing: not listed
    assert timing.direction == AB and timing.packets == 1000
    assert timing.mean_error_s == pytest.approx(40e-6) and timing.tolerance_s == pytest.approx(150e-6)
    assert timing.ok


def test_a_late_link_is_flagged_and_dilation_is_undone() -> None:
    late = link_timing(PLAN, {AB: (0, 0.0)}, {AB: (100, 0.040)}, {})     # 400 us late on average
    assert not late[0].ok
    dilated = link_timing(PLAN, {AB: (0, 0.0)}, {AB: (100, 0.0125)}, {}, dilation=1.25)
    assert dilated[0].mean_error_s == pytest.approx(100e-6) and dilated[0].configured_delay_s == pytest.approx(0.005)
    assert LinkTiming.from_json(late[0].to_json()) == late[0] and late[0].to_json()["ok"] is False
