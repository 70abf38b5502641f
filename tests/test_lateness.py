"""Timed spans' lateness from hand-made traces (testbed/run/lateness.py): the per-stage figures worked by hand, the
bound that makes a run late, where they are recorded (rank traces, the breakdown, summary.json) and shown (the
breakdown's table, the run table, the experiment's report)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from testbed.experiment.report import lateness_line
from testbed.run import metrics
from testbed.run.breakdown import Breakdown, breakdown, render, side_by_side
from testbed.run.lateness import LATE_FLOOR_S, LATE_P99_FRACTION, SpanLateness, span_lateness
from testbed.run.summary import RunSummary, ScheduleSummary, StageLink, StagePlacement
from workloads.records import IterationRecord, RankTrace, Span, WorkerConfig
from workloads.schedule import build

US = 1e-6


def _timed(kind: str, mb: int, start: float, seconds: float, late: float) -> Span:
    """A timed span as the executor records it: planned `start`/`end`, woken and ended `late` after its end."""
    end = start + seconds
    return Span(kind, mb, start, end, 0.0, 0.0, late, end + late, end + late)


def test_a_stages_lateness_worked_by_hand() -> None:
    """Five timed spans, 2, 2, 4, 4, 4 ms, ending 10, 20, 30, 40 and 1000 us late; a wait (ignored). Median
    30 us; p99 at rank 0.99 x 4 = 3.96 between 40 and 1000 us: 40 + 0.96 x 960 = 961.6 us; worst 1000 us; the
    median span 4 ms, so the bound is max(0.3 ms, 5 % x 4 ms = 0.2 ms) = 0.3 ms: late. Without the 1000 us
    outlier's weight (50 us instead) the p99 is 40 + 0.96 x 10 = 49.6 us: on time."""
    def iteration(lates: list[float]) -> IterationRecord:
        spans, t = [Span("wait-F", 0, 0.0, 0.001, 0.0, 0.0)], 0.001
        for (kind, mb, seconds), late in zip([("F", 0, 0.002), ("B", 0, 0.002), ("F", 1, 0.004), ("B", 1, 0.004),
                                              ("F", 2, 0.004)], lates, strict=True):
            spans.append(_timed(kind, mb, t, seconds, late))
            t += seconds
        return IterationRecord(iteration=1, warmup=False, start=0.0, end=t, spans=spans)

    late = span_lateness([iteration([10 * US, 20 * US, 30 * US, 40 * US, 1000 * US])])
    assert late is not None and late.spans == 5
    assert (late.median_s, late.p99_s, late.worst_s) == pytest.approx((30 * US, 961.6 * US, 1000 * US))
    assert late.span_median_s == pytest.approx(0.004) and late.bound_s == pytest.approx(0.3e-3) and not late.ok
    quiet = span_lateness([iteration([10 * US, 20 * US, 30 * US, 40 * US, 50 * US])])
    assert quiet is not None and quiet.p99_s == pytest.approx(49.6 * US) and quiet.ok


def test_lateness_is_actual_end_less_planned_end_and_older_traces_keep_their_late_s() -> None:
    recorded = Span("F", 0, 1.0, 1.004, late_s=0.0, woke=1.0041, actual_end=1.0052)     # late_s disagrees: not read
    older = Span("F", 0, 1.0, 1.004, late_s=0.0007)
    arithmetic = Span("F", 0, 1.0, 1.004, 0.004, 0.0)
    assert recorded.lateness_s == pytest.approx(0.0012) and older.lateness_s == 0.0007
    assert arithmetic.lateness_s is None
    assert span_lateness([IterationRecord(iteration=1, warmup=False, start=1.0, end=2.0, spans=[arithmetic])]) is None


def test_the_bound_is_a_fraction_of_the_span_with_a_floor() -> None:
    """On a loaded host a sleep's p99 lateness is 0.15-1.5 ms: 1.5 ms is late on 7 ms spans (bound 0.35 ms) and
    not on 60 ms ones (3 ms); 0.15 ms is late on none, not even on 3 ms spans (floor 0.3 ms)."""
    def at(p99: float, span: float) -> SpanLateness:
        return SpanLateness(spans=100, median_s=p99 / 2, p99_s=p99, worst_s=p99, span_median_s=span)

    assert (LATE_P99_FRACTION, LATE_FLOOR_S) == (0.05, 0.3e-3)
    assert at(1.5e-3, 0.007).bound_s == pytest.approx(0.35e-3) and not at(1.5e-3, 0.007).ok
    assert at(1.5e-3, 0.060).bound_s == pytest.approx(3e-3) and at(1.5e-3, 0.060).ok
    assert all(at(0.15e-3, span).ok for span in (0.003, 0.007, 0.060))
    assert at(0.15e-3, 0.003).bound_s == LATE_FLOOR_S


M, F, B = 4, 0.007, 0.014


def _rank(rank: int, late: float, *, outlier: float = 0.0) -> RankTrace:
    """Two steady iterations (and a warm-up) of 1f1b-prefetch on 2 stages with compute as time: spans back to back,
    each ending `late` after its deadline; the last span of the last iteration `outlier` late instead, if given."""
    its = []
    for i in range(3):
        t = start = 100.0 * i
        spans = []
        for mb in range(M):
            for kind, seconds in (("F", F), ("B", B)):
                spans.append(_timed(kind, mb, t, seconds, late))
                t += seconds + late
        if outlier and i == 2:
            last = spans[-1]
            spans[-1] = _timed(last.kind, last.mb, last.start, last.seconds, outlier)
        its.append(IterationRecord(iteration=i, warmup=i == 0, start=start, end=t, spans=spans,
                                   compute_s=M * (F + B), wait_s=0.0, forward_s=F, backward_s=B,
                                   main_cpu_s=0.001, main_runq_s=0.0))
    cfg = WorkerConfig(rank=rank, world=2, master_addr="x", master_port=1, schedules=["1f1b-prefetch"],
                       microbatches=M, compute="replay")
    return RankTrace(config=cfg, schedule="1f1b-prefetch", rank=rank, iterations=its,
                     actions=[str(a) for a in build("1f1b-prefetch", 2, M)[rank]], activation_bytes=1024,
                     reference_compute_s=[M * (F + B)] * 2)


def _summary(late: float, **kw: float) -> ScheduleSummary:
    return metrics.summarize("1f1b-prefetch", [_rank(0, late, **kw), _rank(1, late, **kw)], 1000)


def test_a_late_run_is_late_and_a_quiet_one_is_not() -> None:
    """7 ms and 14 ms spans (median 10.5 ms: bound 0.525 ms). Every span 60 us late (a quiet host): on time. Every
    span 1.5 ms late (a loaded one): late, stage by stage, with why. One 8 ms outlier among a stage's 16 steady
    spans carries the p99 (rank 0.99 x 15 = 14.85: 60 us + 0.85 x 7.94 ms = 6.8 ms): late too, one span in 16
    being that late."""
    quiet, loaded = _summary(60 * US), _summary(1.5e-3)
    assert quiet.span_lateness_per_stage is not None and quiet.lateness_ok and quiet.late_spans() == []
    stage = quiet.span_lateness_per_stage[0]
    assert (stage.spans, stage.median_s, stage.bound_s) == pytest.approx((2 * 2 * M, 60 * US, 0.525e-3))
    assert not loaded.lateness_ok
    assert [why.split(":")[0] for why in loaded.late_spans()] == ["1f1b-prefetch stage 0", "1f1b-prefetch stage 1"]
    assert "p99 1.50 ms > bound 0.53 ms" in loaded.late_spans()[0]
    spiked = _summary(60 * US, outlier=8e-3)
    assert spiked.span_lateness_per_stage is not None
    assert (spiked.span_lateness_per_stage[0].p99_s, spiked.span_lateness_per_stage[0].worst_s) == pytest.approx(
        (60 * US + 0.85 * (8e-3 - 60 * US), 8e-3))
    assert not spiked.lateness_ok and len(spiked.late_spans()) == 2


def test_real_compute_has_no_lateness() -> None:
    ranks = [_rank(r, 0.0) for r in range(2)]
    for r in ranks:
        r.config.compute = "real"
        for it in r.iterations:
            it.spans = [Span(s.kind, s.mb, s.start, s.end, s.seconds, 0.0) for s in it.spans]
    summary = metrics.summarize("1f1b-prefetch", ranks, 1000)
    assert summary.span_lateness_per_stage is None and summary.lateness_ok and summary.late_spans() == []


def test_the_lateness_round_trips_and_older_files_still_read() -> None:
    """summary.json's schedules, the breakdown inside it and the rank traces: the new fields survive JSON, with
    the verdict written beside them; files written before them read as before (no lateness: nothing to judge)."""
    ranks = [_rank(0, 1.5e-3), _rank(1, 1.5e-3)]
    summary = metrics.summarize("1f1b-prefetch", ranks, 1000)
    summary.breakdown = breakdown(ranks, [0.0], [1e9])
    assert summary.breakdown is not None and summary.breakdown.stages[0].lateness == summary.span_lateness_per_stage[0]
    data = json.loads(json.dumps(summary.to_json()))
    assert data["lateness_ok"] is False and data["span_lateness_per_stage"][0]["ok"] is False
    assert data["span_lateness_per_stage"][0]["bound_s"] == pytest.approx(0.525e-3)
    assert ScheduleSummary.from_json(data) == summary
    assert Breakdown.from_json(data["breakdown"]) == summary.breakdown
    for key in ("span_lateness_per_stage", "lateness_ok"):
        del data[key]
    del data["breakdown"]["stages"][0]["lateness"]
    older = ScheduleSummary.from_json(data)
    assert older.span_lateness_per_stage is None and older.lateness_ok
    assert older.breakdown is not None and older.breakdown.stages[0].lateness is None
    trace = json.loads(json.dumps(ranks[0].to_json()))
    assert RankTrace.from_json(trace) == ranks[0]
    span = trace["iterations"][1]["spans"][0]
    del span["woke"], span["actual_end"]
    read = RankTrace.from_json(trace).iterations[1].spans[0]
    assert read.actual_end is None and read.lateness_s == pytest.approx(1.5e-3)


def test_the_tables_show_the_lateness_and_flag_a_late_run() -> None:
    ranks = [_rank(0, 1.5e-3), _rank(1, 1.5e-3)]
    split = breakdown(ranks, [0.0], [1e9])
    assert split is not None
    assert "timed spans' lateness (us): median / p99 / worst" in render("1f1b-prefetch", split)
    assert "1500 / 1500 / 1500 ! (bound 525)" in render("1f1b-prefetch", split)
    quiet = breakdown([_rank(0, 60 * US), _rank(1, 60 * US)], [0.0], [1e9])
    assert quiet is not None
    headers, rows = side_by_side([("late", [split]), ("quiet", [quiet])])
    row = next(r for r in rows if r[0].startswith("timed spans' p99 lateness"))
    assert row[1:] == ["1500 ! 1 late", "60"]
    summary = metrics.summarize("1f1b-prefetch", ranks, 1000)
    run = RunSummary(run_id="r", topology="t", testbed="t", stages=[StagePlacement(0, "h0", "dc-a")],
                     stage_links=[StageLink(5e-3, 1e9)], links=[], lossless_ok=True, shaper="delayline",
                     backend="netns", switch=None, shaper_calibration_s={}, transport="gloo-tcp", kernel="k", cpus=2,
                     oversubscribed=False, workers=2, delay_daemons=2, options={}, schedules=[summary])
    assert "spans late p99" in run.render() and "1.50 ms !" in run.render()
    spans = [e for e in metrics.chrome_trace({"1f1b-prefetch": ranks})["traceEvents"] if e.get("cat") == "compute"]
    assert spans and all(e["args"]["late_us"] == pytest.approx(1500) for e in spans)


def test_the_report_says_how_late_the_runs_were_and_which_were_kept_late() -> None:
    late, quiet = _summary(1.5e-3), _summary(60 * US)
    point = lambda m, km: SimpleNamespace(measured=m, schedule=m.schedule, distance_km=km, repetition=0)  # noqa: E731
    record = SimpleNamespace(points=[point(quiet, 0.0), point(late, 1000.0)])
    line = lateness_line(record)  # type: ignore[arg-type]
    assert line is not None and "p99 lateness 780 us median over the runs" in line
    assert "1 kept late (1f1b-prefetch @1000 km #0)" in line
    assert lateness_line(SimpleNamespace(points=[point(quiet, 0.0)])).endswith("none was kept late.")  # type: ignore[arg-type, union-attr]
    real = ScheduleSummary.from_json({**quiet.to_json(), "span_lateness_per_stage": None})
    assert lateness_line(SimpleNamespace(points=[point(real, 0.0)])) is None  # type: ignore[arg-type]
