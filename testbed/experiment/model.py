"""The analytical model: each schedule's bubble ratio and step time from measured per-micro-batch compute
times, link delay and rate, and the memory budget, by the same discrete-event model that dry-runs
schedules (workloads/simulate.py). It is also the "what if" for distances and rates no machine here emulates.
"""

from __future__ import annotations

from dataclasses import dataclass

from workloads import schedule as S
from workloads.memory import MemoryBudget
from workloads.records import RankTrace
from workloads.simulate import Costs, Prediction, simulate
from workloads.sizing import size_geopipe


@dataclass(frozen=True, slots=True)
class StageTimes:
    """Measured per micro-batch (seconds, bytes)."""

    forward_s: list[float]
    backward_s: list[float]
    activation_bytes: int
    stash_bytes: list[int]
    dispatch_s: list[float] | None = None
    """Per stage, per F or B: the executor's own time between spans (neither compute nor waiting)."""
    reference_s: list[float] | None = None
    """Per stage: one step's F+B with no communication (workloads/reference.py), the bubble's yardstick."""


def stage_times(ranks: list[RankTrace]) -> StageTimes:
    """Mean forward/backward span per micro-batch over steady iterations, from a run's rank traces, and the
    time each F or B costs beyond its span (iteration - compute - waits, per action)."""
    fwd, bwd, stash, dispatch = [], [], [], []
    for r in ranks:
        its = r.steady
        fwd.append(sum(it.forward_s or 0.0 for it in its) / len(its))
        bwd.append(sum(it.backward_s or 0.0 for it in its) / len(its))
        stash.append(max(it.stash_bytes or 0 for it in its))
        actions = 2 * sum(1 for sp in its[0].spans if sp.kind == "F")
        idle = [(it.end - it.start) - (it.compute_s or 0.0) - (it.wait_s or 0.0) for it in its]
        dispatch.append(max(0.0, sum(idle) / len(idle)) / max(actions, 1))
    reference = [min(r.reference_compute_s) for r in ranks] if all(r.reference_compute_s for r in ranks) else None
    return StageTimes(fwd, bwd, int(ranks[0].activation_bytes or 0), stash, dispatch, reference)


MODELLED = ("gpipe", "1f1b", "1f1b-prefetch", "geopipe", "torch-gpipe", "torch-1f1b")
"""Schedules the model can run (PyTorch's one-stage-per-rank schedules as the same action lists)."""


def predict(schedule: str, times: StageTimes, microbatches: int, link_delay_s: list[float],
            link_rate_bps: list[float], memory_budget: str | None = None,
            message_overhead_s: float = 0.0, transport: str = "tcp") -> tuple[Prediction, S.GeoPipeSizing | None]:
    """The model's run of `schedule` (one of MODELLED) at these links and budget, over gloo's receiver-driven
    TCP or sender-driven RDMA (`transport`)."""
    stages = len(times.forward_s)
    bytes_per_s = [r / 8 for r in link_rate_bps]
    geo = None
    if schedule == "geopipe":
        budgets = (MemoryBudget.parse(memory_budget).per_stage(stages, microbatches, times.stash_bytes,
                                                               times.activation_bytes) if memory_budget else None)
        geo = size_geopipe(stages, microbatches, link_delay_s=link_delay_s, link_bytes_per_s=bytes_per_s,
                           activation_bytes=times.activation_bytes, forward_s=times.forward_s,
                           backward_s=times.backward_s, stash_bytes=times.stash_bytes, budget_bytes=budgets)
    sched = S.build(schedule.removeprefix("torch-"), stages, microbatches, geo)
    costs = Costs(times.forward_s, times.backward_s, link_delay_s, bytes_per_s, times.activation_bytes,
                  max(times.stash_bytes), message_overhead_s, times.dispatch_s, receiver_driven=transport != "rdma")
    return simulate(sched, costs), geo


def bubble_vs_reference(prediction: Prediction, times: StageTimes) -> float:
    """The predicted step against the measured uncontended compute, as runs report it; the own-compute
    bubble where no reference was measured."""
    if not times.reference_s:
        return prediction.mean_bubble_ratio
    return sum(1 - ref / prediction.iteration_s for ref in times.reference_s) / len(times.reference_s)


def fit_message_overhead(schedule: str, times: StageTimes, microbatches: int, link_delay_s: list[float],
                         link_rate_bps: list[float], measured_step_s: float) -> float:
    """The one free parameter: per-message overhead that makes the model's step time match one measured run
    (bisection over 0-20 ms). Everything else the model uses is measured or configured."""
    lo, hi = 0.0, 0.02
    for _ in range(40):
        mid = (lo + hi) / 2
        step = predict(schedule, times, microbatches, link_delay_s, link_rate_bps, message_overhead_s=mid)[0].iteration_s
        lo, hi = (mid, hi) if step < measured_step_s else (lo, mid)
    return (lo + hi) / 2
