"""One machine's attempt (testbed/run/runner.py: run_schedules' attempt_once) with its inputs scripted: the load
monitor, the workers' launch, the delay line's hold counters, the figures. What it must hand best_attempt: each
entry's figures with the attempt's host load and link timing attached (a sweep's setting named), the compute drift
on the load, the attempt's own folder; the monitor watching the delay daemons of every node a link delivers to."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from conftest import REPO

from testbed.plan import build_plan
from testbed.run import runner
from testbed.run.dilation import Dilation
from testbed.run.lateness import SpanLateness
from testbed.run.runner import LinkSweep, RunOptions, SweepPoint
from testbed.run.summary import ScheduleSummary, StageLink
from testbed.run.transport import TransportChoice
from testbed.topology import load_topology
from testbed.util.hostload import HostLoad


class _Stop(Exception):
    """Raised by the scripted best_attempt once it holds attempt_once: the rest of the run is not under test."""


LATE = SpanLateness(spans=64, median_s=60e-6, p99_s=1.5e-3, worst_s=6e-3, span_median_s=7e-3)
"""Compute as time: a stage's spans late beyond their bound (0.35 ms at 7 ms spans)."""


def _measured(schedule: str) -> ScheduleSummary:
    """Figures of one entry; geopipe's timed spans were late on its second stage."""
    return ScheduleSummary(
        schedule=schedule, bubble_ratio=0.1, bubble_ratio_per_stage=[0.1, 0.1], step_time_s=1.0,
        step_time_spread_s=[0.9, 1.1], tokens_per_s=100.0, bubble_ratio_iterations=[[0.1], [0.1]], exposed_comm_s=0.0,
        exposed_comm_s_per_stage=[0.0, 0.0], compute_s_per_stage=[0.9, 0.9], peak_inflight_activation_bytes=12,
        peak_inflight_activation_bytes_per_stage=[12, 0], loss_first=4.0, loss_last=3.0, iterations=2,
        budget_bytes_per_stage=[10, 10], budget_ok=True,
        span_lateness_per_stage=[dataclasses.replace(LATE, p99_s=0.1e-3), LATE] if schedule == "geopipe" else None)


@pytest.fixture
def attempt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, dict[str, list], Any]:
    """run_schedules on a scripted 2dc-1000km backend, dilated by 2, a sweep of two points; attempt_once as it
    hands it to best_attempt, and what its scripted inputs were called with."""
    plan = build_plan(load_topology(REPO / "topologies" / "2dc-1000km.yaml"), "t")
    labels = [d.label for d in plan.directions]
    calls: dict[str, list] = {k: [] for k in ("monitor", "run_group", "measure", "slowdown", "drift", "best")}
    drifts = iter([0.02, -0.03, 0.15])      # the host's drift over attempts 0, 1 and a third
    counters = iter([{labels[0]: (100, 0.010)},                                  # before attempt 0
                     {labels[0]: (300, 0.050), labels[1]: (50, 0.001)},          # after it
                     {labels[0]: (300, 0.050)}, {labels[0]: (400, 0.070)},       # attempt 1
                     {labels[0]: (400, 0.070)}, {labels[0]: (500, 0.090)}])      # attempt 2
    loads = iter([HostLoad(wall_s=2.0, steal_fraction=0.07, run_queue_mean=3.0, run_queue_max=4,
                           daemon_cpu_fraction=0.2, disturbed=True, reasons=["CPU steal 7.0% > 5%"]),
                  HostLoad(wall_s=2.0, steal_fraction=0.0, run_queue_mean=2.0, run_queue_max=2,
                           daemon_cpu_fraction=0.2, disturbed=False),
                  HostLoad(wall_s=2.0, steal_fraction=0.0, run_queue_mean=2.0, run_queue_max=2,
                           daemon_cpu_fraction=0.2, disturbed=False)])

    class Monitor:
        def __init__(self, daemons: Any) -> None:
            calls["monitor"].append(daemons)

        def finish(self) -> HostLoad:
            return next(loads)

    def run_group(backend, schedules, options, hosts, where, progress, monitor, transport, dilation, table):
        calls["run_group"].append((schedules, [h.name for h in hosts], where, type(monitor), transport.name,
                                   dilation.factor, table))
        return {entry: [f"ranks of {entry}"] for entry in runner.entries(schedules, options.sweep)}

    def measure(schedule, ranks, tokens, links, receiver_driven):
        calls["measure"].append((schedule, ranks, tokens, links, receiver_driven))
        return _measured(schedule)

    def best_attempt(attempt_once, _log, cpu_matters=True):
        calls["best"].append(attempt_once)
        raise _Stop

    dilation = Dilation(2.0, 0.5, 1.0, 0.1, "scripted")
    point_links = {"near": [StageLink(1e-3, 1e9)], "far": [StageLink(5e-3, 1e9)]}
    state = SimpleNamespace(plan=plan, processes=[], rdma=None, undilated=None,
                            shaper=SimpleNamespace(release_error_s={labels[0]: 20e-6}))
    backend = SimpleNamespace(state=state, name="netns")
    monkeypatch.setattr(runner, "restore_links", lambda _b: False)
    monkeypatch.setattr(runner, "plan_dilation", lambda *_a, **_k: dilation)
    monkeypatch.setattr(runner, "choose_transport", lambda *_a: TransportChoice("tcp", "scripted"))
    monkeypatch.setattr(runner, "run_table", lambda *_a: None)
    shaper = SimpleNamespace(drops=lambda: [], drops_with_planned_loss=lambda: [], edge_counters=lambda: {})
    monkeypatch.setattr(runner, "shaper_for", lambda _b: shaper)
    monkeypatch.setattr(runner, "_restarts", lambda _s: 0)
    monkeypatch.setattr(runner, "check_delays", lambda *_a, **_k: [])
    monkeypatch.setattr(runner, "point_links", lambda _b, _s, point, _h: point_links[point.label])
    monkeypatch.setattr(runner, "daemons_cpu", lambda shaper, nodes: ("daemons of", shaper, nodes))
    monkeypatch.setattr(runner, "LoadMonitor", Monitor)
    monkeypatch.setattr(runner, "_hold_counters", lambda _s: next(counters))
    monkeypatch.setattr(runner, "run_group", run_group)
    monkeypatch.setattr(runner, "measure", measure)
    monkeypatch.setattr(runner, "compute_slowdown",
                        lambda summaries: calls["slowdown"].append(list(summaries)) or 0.12)
    monkeypatch.setattr(runner, "host_drift", lambda ranks: calls["drift"].append(list(ranks)) or next(drifts))
    monkeypatch.setattr(runner, "best_attempt", best_attempt)
    sweep = LinkSweep("dc-a", "dc-b", [SweepPoint("near", 1e-3, 1e9), SweepPoint("far", 5e-3, 1e9, ["geopipe"])])
    options = RunOptions(schedules=["1f1b", "geopipe"], microbatches=3, microbatch_size=2, sweep=sweep)
    with pytest.raises(_Stop):
        runner.run_schedules(backend, options, tmp_path, run_id="r", log=lambda _line: None)
    return calls["best"][0], calls, SimpleNamespace(plan=plan, labels=labels, run_dir=tmp_path / "r", options=options,
                                                    shaper=shaper)


def test_an_attempt_hands_back_its_figures_with_its_load_and_link_timing(attempt) -> None:
    attempt_once, calls, run = attempt
    got = attempt_once(0)
    assert got.where == run.run_dir
    assert calls["monitor"] == [("daemons of", run.shaper, tuple(sorted({d.dst_node for d in run.plan.directions})))]
    assert calls["run_group"] == [(["1f1b", "geopipe"], ["dc-a-h1", "dc-b-h1"], run.run_dir, runner.LoadMonitor, "tcp",
                                   2.0, None)]
    ranks_by, measured_by = got.value
    assert list(measured_by) == ["near/1f1b", "near/geopipe", "far/geopipe"] == list(ranks_by)
    tokens = run.options.microbatches * run.options.microbatch_size * run.options.model.block_size
    assert [c[:3] for c in calls["measure"]] == [(e.rsplit("/", 1)[1], [f"ranks of {e}"], tokens) for e in measured_by]
    assert [c[3] for c in calls["measure"]] == [[StageLink(1e-3, 1e9)]] * 2 + [[StageLink(5e-3, 1e9)]]
    assert all(c[4] is True for c in calls["measure"])                           # TCP: receiver-driven
    # the delay line's releases over this attempt: 200 packets, 40 ms of error, less the calibrated 20 us, undilated;
    # the other direction's first 50 packets (no reading before) with no calibration to take off
    ab, ba = got.timing
    assert (ab.direction, ab.packets, ba.direction, ba.packets) == (run.labels[0], 200, run.labels[1], 50)
    assert ab.mean_error_s == pytest.approx((0.040 / 200 - 20e-6) / 2.0)
    assert ba.mean_error_s == pytest.approx(0.001 / 50 / 2.0)
    assert got.load.disturbed and got.load.compute_slowdown == 0.12 and got.load.slowed
    assert calls["slowdown"] == [list(measured_by.values())]
    # the host's drift from every rank of every entry; 2 % is within the bound: the steal alone disturbs it
    assert calls["drift"] == [[r for e in measured_by for r in ranks_by[e]]]
    assert got.load.host_drift == 0.02 and not got.load.drifted and got.load.reasons == ["CPU steal 7.0% > 5%"]
    for entry, measured in measured_by.items():
        assert measured.link_setting == entry.split("/")[0]
        assert measured.host_load is got.load and measured.link_timing is got.timing
    # each entry's late stages, named, for best_attempt to measure again (testbed/run/lateness.py)
    assert got.late == [f"{entry} stage 1: {LATE.describe()}" for entry in ("near/geopipe", "far/geopipe")]


def test_a_repeat_writes_to_its_own_folder_with_its_own_readings(attempt) -> None:
    attempt_once, calls, run = attempt
    first, again = attempt_once(0), attempt_once(1)
    assert again.where == run.run_dir / "repeat1" and calls["run_group"][1][2] == run.run_dir / "repeat1"
    assert len(calls["monitor"]) == 2 and not again.load.disturbed and first.load.disturbed
    (timing,) = again.timing
    assert timing.packets == 100 and timing.mean_error_s == pytest.approx((0.020 / 100 - 20e-6) / 2.0)
    assert all(m.host_load is again.load for m in again.value[1].values())
    assert all(m.host_load is first.load for m in first.value[1].values())


def test_a_host_whose_reference_moved_beyond_the_bound_disturbs_the_attempt(attempt) -> None:
    """An undisturbed load whose reference moved 15 % between before and after: measured again, with why."""
    attempt_once, _calls, _run = attempt
    attempt_once(0), attempt_once(1)
    third = attempt_once(2)
    assert third.load.host_drift == 0.15 and third.load.drifted and third.load.disturbed
    assert third.load.reasons == ["the host's speed changed during the run: its reference moved +15.0% between "
                                  "before and after (bound 10%)"]
