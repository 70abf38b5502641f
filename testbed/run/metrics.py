"""From per-rank traces to the numbers of summary.json: bubble ratio per stage (against the schedule's own
F/B spans, and against the uncontended reference compute), step time, tokens/s, exposed communication, peak
in-flight memory and its budget, span stretch. Steady-state iterations only (warm-up excluded).

Per stage, the bubble ratio and exposed communication are the median over steady iterations, like the step
time: a host hiccup of one iteration is not the schedule's doing. Every iteration's figures stay in
`bubble_ratio_iterations` and `step_time_spread_s`."""

from __future__ import annotations

import statistics
from typing import Any

from testbed.run.breakdown import step_of
from testbed.run.lateness import span_lateness
from testbed.run.summary import ScheduleSummary
from workloads.layouts import stage_layout
from workloads.records import RankTrace


def summarize(schedule: str, ranks: list[RankTrace], tokens_per_step: int) -> ScheduleSummary:
    """`ranks`: the traces of one schedule's run, in rank order."""
    steady = [i for i, it in enumerate(ranks[0].iterations) if not it.warmup]
    step_times: list[float] = []
    bubbles: list[list[float]] = [[] for _ in ranks]
    waits: list[list[float]] = [[] for _ in ranks]
    for i in steady:
        its = [r.iterations[i] for r in ranks]
        step = step_of(its)
        step_times.append(step)
        for s, it in enumerate(its):
            if it.compute_s is not None:
                bubbles[s].append(1 - it.compute_s / step)
                waits[s].append(it.wait_s or 0.0)
    step_time = statistics.median(step_times)
    has_compute = all(bubbles)
    per_stage = [statistics.median(b) for b in bubbles] if has_compute else None
    peaks = [max((it.peak_inflight_bytes or 0) for it in r.iterations) for r in ranks]
    losing = next((r for r in reversed(ranks) if any(it.loss is not None for it in r.iterations)), ranks[-1])
    losses = [it.loss for it in losing.iterations if it.loss is not None]     # the rank holding the last stage
    compute = ([statistics.mean(ranks[s].iterations[i].compute_s or 0.0 for i in steady) for s in range(len(ranks))]
               if has_compute else None)
    reference = ([statistics.mean(r.reference_compute_s) for r in ranks]     # before and after the iterations
                 if all(r.reference_compute_s for r in ranks) else None)
    budgets = [r.budget_bytes for r in ranks]
    budget_list = [int(b) for b in budgets] if all(b is not None for b in budgets) else None
    summary = ScheduleSummary(
        schedule=schedule,
        bubble_ratio=statistics.mean(per_stage) if per_stage else None,
        bubble_ratio_per_stage=per_stage,
        step_time_s=step_time,
        step_time_spread_s=[min(step_times), max(step_times)],
        tokens_per_s=tokens_per_step / step_time,
        bubble_ratio_iterations=bubbles if has_compute else None,
        exposed_comm_s=statistics.mean(statistics.median(w) for w in waits) if has_compute else None,
        exposed_comm_s_per_stage=[statistics.median(w) for w in waits] if has_compute else None,
        compute_s_per_stage=compute,
        peak_inflight_activation_bytes=max(peaks) if any(peaks) else None,
        peak_inflight_activation_bytes_per_stage=peaks if any(peaks) else None,
        loss_first=losses[0] if losses else None,
        loss_last=losses[-1] if losses else None,
        iterations=len(steady),
        geopipe_sizing=ranks[0].geopipe_sizing,
        reference_compute_s_per_stage=reference,
        budget_bytes_per_stage=budget_list,
        budget_ok=budget_list is None or all(p <= b for p, b in zip(peaks, budget_list, strict=True)))
    late = [span_lateness(r.steady) for r in ranks]
    summary.span_lateness_per_stage = [x for x in late if x is not None] if all(late) else None
    if reference:
        rebase_reference(summary, reference, 1)
    return summary


def rebase_reference(summary: ScheduleSummary, yardstick: list[float], runs: int) -> None:
    """Take `summary`'s bubble against a common yardstick (per stage seconds), the least reference of `runs`."""
    summary.reference_yardstick_s_per_stage, summary.reference_pooled_runs = list(yardstick), runs
    per_stage = [1 - ref / summary.step_time_s for ref in yardstick]
    summary.bubble_vs_reference_per_stage = per_stage
    summary.bubble_vs_reference = statistics.mean(per_stage)
    if summary.compute_s_per_stage:
        summary.span_stretch_per_stage = [c / ref for c, ref in zip(summary.compute_s_per_stage, yardstick,
                                                                     strict=True)]


def pool_references(summaries: list[ScheduleSummary]) -> None:
    """Judge every schedule of one run by one yardstick per stage layout: the median of their references (the
    schedules of a run are interleaved in one launch and share the same reference measurements, so this is
    that figure; the median, not the least, so that the yardstick does not fall with the number of runs)."""
    by_layout: dict[str, list[ScheduleSummary]] = {}
    for s in summaries:
        if s.reference_compute_s_per_stage:
            by_layout.setdefault(stage_layout(s.schedule), []).append(s)
    for group in by_layout.values():
        yardstick = [statistics.median(values) for values in zip(*(s.reference_compute_s_per_stage or []
                                                                   for s in group), strict=True)]
        for s in group:
            rebase_reference(s, yardstick, len(group))


def chrome_trace(runs: dict[str, list[RankTrace]]) -> dict[str, Any]:
    """All ranks of all schedules on one timeline (chrome://tracing, Perfetto): pid = schedule, tid = rank."""
    events: list[dict[str, Any]] = []
    origin = min(it.start for ranks in runs.values() for r in ranks for it in r.iterations)
    for pid, (schedule, ranks) in enumerate(runs.items()):
        events.append({"ph": "M", "name": "process_name", "pid": pid, "args": {"name": schedule}})
        for r in ranks:
            tid = r.rank
            events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": f"stage {tid}"}})
            for it in r.iterations:
                events.append({"ph": "X", "name": f"iteration {it.iteration}", "cat": "iteration", "pid": pid,
                               "tid": tid, "ts": (it.start - origin) * 1e6, "dur": (it.end - it.start) * 1e6})
                for span in it.spans:
                    name = span.kind if span.mb < 0 else f"{span.kind}{span.mb}"
                    late = span.lateness_s      # a timed span is drawn as planned: how late it really ended
                    events.append({"ph": "X", "name": name, "cat": "compute" if span.kind in ("F", "B") else "wait",
                                   "pid": pid, "tid": tid, "ts": (span.start - origin) * 1e6,
                                   "dur": span.seconds * 1e6, **({} if late is None else {"args": {"late_us": late * 1e6}})})
                for t, value in it.memory:
                    events.append({"ph": "C", "name": f"in-flight activations stage {tid}", "pid": pid,
                                   "ts": (t - origin) * 1e6, "args": {"bytes": value}})
    return {"traceEvents": events, "displayTimeUnit": "ms"}
