"""The analytical model: each schedule's step time and bubble from what the 0 km 1f1b run measured, by the
same discrete-event model that dry-runs schedules (workloads/simulate.py). Nothing is fitted to a step time:
- compute: every forward and backward span of that run, per stage, as a distribution; the model's step is
  the expected step over the same bootstrap draws of it that GeoPipe's plan uses (workloads/sampling.py);
- the executor's own time between spans, per stage, as measured;
- the transport's cost per message beyond delay and transfer: the workers' ping-pong probe at start-up
  (workloads/probe.py); with compute as time also each stage's measured lag from a span's end to its
  message's post (the executor's own time, which delays the message and not the device);
- each stage's start against stage 0's, as measured (the start barrier crosses the links);
- the link: the point's configured delay and rate.
It is also the "what if" for distances and rates no machine here emulates.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass
from typing import Any

from workloads import schedule as S
from workloads.memory import MemoryBudget
from workloads.records import TRANSPORTS, RankTrace, start_offsets
from workloads.sampling import ComputeSamples, simulate_expected
from workloads.simulate import Costs, Prediction
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
    samples: ComputeSamples | None = None
    """Per stage, every steady forward and backward span (the distribution the model draws from)."""
    message_cost_s: float = 0.0
    """The transport's measured cost per message beyond delay and transfer (largest over the links)."""
    message_cost_per_link_s: list[float] | None = None
    """The same per stage link (each link's own probe; never below 0)."""
    rate_scale: list[float] | None = None
    """Compute as time from a deployment profile: per stage link, the deployment's rate over the emulated one
    (the run's messages were the deployment's bytes over it); None: 1."""

    timed: bool = False
    """Compute as time: F and B ran on a device timeline the executor's own work does not delay, so the model
    adds no dispatch time between spans."""
    send_lag_s: list[float] | None = None
    """Compute as time, per stage: the median time from a span's end to its message's post, measured in the run
    (the executor's and the sender thread's own time; it delays the message, not the device)."""
    recv_lag_s: list[float] | None = None
    """Compute as time, per stage: the median time from its compute before a receive to the receive's post."""
    receives_first: bool | None = None
    """The executor posted the receives after a send before it (RankTrace.receives_before_sends); None: as
    `timed` (inputs of releases before it was recorded)."""
    start_offset_s: list[float] | None = None
    """Per stage: the median of its iteration's start minus stage 0's (the start barrier crosses the links, so
    later stages begin up to a link delay earlier and their first receives are posted before stage 0 starts)."""
    probed_cost_per_link_s: list[float] | None = None
    """Per stage link, the probe's reading as it was (signed: a link that delivers early reads below 0); what a
    launch at another link setting reads beyond it is that link's error (sweep.link_excess), never model input."""

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "samples": self.samples.to_json() if self.samples else None}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> StageTimes:
        """Also reads model inputs of 0.2 (no samples, no measured message cost)."""
        samples = data.get("samples")
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__ and k != "samples"}
        return cls(**known, samples=ComputeSamples.from_json(samples) if samples else None)


def stage_times(ranks: list[RankTrace]) -> StageTimes:
    """The model's inputs from one run's rank traces: mean and every forward/backward span over the steady
    iterations, the time each F or B costs beyond its span (iteration - compute - waits, per action), the
    stash, the reference and the probed per-message cost."""
    fwd, bwd, stash, dispatch, f_all, b_all = [], [], [], [], [], []
    for r in ranks:
        its = r.steady
        fwd.append(sum(it.forward_s or 0.0 for it in its) / len(its))
        bwd.append(sum(it.backward_s or 0.0 for it in its) / len(its))
        stash.append(max(it.stash_bytes or 0 for it in its))
        actions = 2 * sum(1 for sp in its[0].spans if sp.kind == "F")
        idle = [(it.end - it.start) - (it.compute_s or 0.0) - (it.wait_s or 0.0) for it in its]
        dispatch.append(max(0.0, sum(idle) / len(idle)) / max(actions, 1))
        pairs = {(i, sp.mb, sp.kind): sp.seconds for i, it in enumerate(its) for sp in it.spans if sp.kind in ("F", "B")}
        keys = sorted({(i, mb) for i, mb, _ in pairs if (i, mb, "F") in pairs and (i, mb, "B") in pairs})
        f_all.append([pairs[(i, mb, "F")] for i, mb in keys])
        b_all.append([pairs[(i, mb, "B")] for i, mb in keys])
    reference = ([statistics.mean(r.reference_compute_s) for r in ranks]
                 if all(r.reference_compute_s for r in ranks) else None)
    samples = ComputeSamples(f_all, b_all) if all(f_all) else None
    cost = max([0.0, *(c for r in ranks for c in r.message_cost_s)])     # a link that delivers early costs nothing
    table = ranks[0].config.cost_table
    per_link = [max(0.0, c) for c in ranks[0].message_cost_s] or None
    return StageTimes(fwd, bwd, int(ranks[0].activation_bytes or 0), stash, dispatch, reference, samples, cost,
                      per_link, list(table.rate_scale) if table and table.rate_scale else None, ranks[0].config.timed,
                      _median_lags(ranks, "send_lag_s"), _median_lags(ranks, "recv_lag_s"),
                      receives_first=ranks[0].posted_receives_first, start_offset_s=start_offsets(ranks),
                      probed_cost_per_link_s=list(ranks[0].message_cost_s) or None)


def _median_lags(ranks: list[RankTrace], field: str) -> list[float] | None:
    """Compute as time: per stage, the median of its steady iterations' lags in `field` (0 where it has none);
    None in real mode or where no stage recorded one."""
    lags = [[lag for it in r.steady for lag in getattr(it, field)] for r in ranks]
    if not ranks[0].config.timed or not any(lags):
        return None
    return [statistics.median(x) if x else 0.0 for x in lags]


MODELLED = ("gpipe", "1f1b", "1f1b-prefetch", "geopipe", "torch-gpipe", "torch-1f1b")
"""Schedules the model can run (PyTorch's one-stage-per-rank schedules as the same action lists)."""


def predict(schedule: str, times: StageTimes, microbatches: int, link_delay_s: list[float],
            link_rate_bps: list[float], memory_budget: str | None = None,
            message_overhead_s: float | None = None, transport: str = "tcp",
            measured_here: bool = True) -> tuple[Prediction, S.GeoPipeSizing | None]:
    """The model's run of `schedule` (one of MODELLED) at these links and budget, over gloo's receiver-driven
    TCP or sender-driven RDMA (`transport`): the expected step over draws of the measured compute; geopipe is
    planned as the workers plan it. `message_overhead_s` defaults to the measured per-message cost.
    `measured_here`: `times` were measured at these links, so the stages start as they did there (each stage's
    measured start offset); False (a what-if at other links): every stage starts with stage 0."""
    stages = len(times.forward_s)
    scale = times.rate_scale or [1.0] * len(link_rate_bps)
    bytes_per_s = [r / 8 * k for r, k in zip(link_rate_bps, scale, strict=True)]
    overhead = times.message_cost_s if message_overhead_s is None else message_overhead_s
    geo = None
    if schedule == "geopipe":
        budgets = (MemoryBudget.parse(memory_budget).per_stage(stages, microbatches, times.stash_bytes,
                                                               times.activation_bytes) if memory_budget else None)
        geo = size_geopipe(stages, microbatches, link_delay_s=link_delay_s, link_bytes_per_s=bytes_per_s,
                           activation_bytes=times.activation_bytes, forward_s=times.forward_s,
                           backward_s=times.backward_s, stash_bytes=times.stash_bytes, budget_bytes=budgets,
                           samples=times.samples, message_overhead_s=overhead)
    first = times.timed if times.receives_first is None else times.receives_first
    first = first and not schedule.startswith("torch-") and TRANSPORTS[transport].receiver_driven    # our executor over gloo
    sched = [S.posting_order(acts, first) for acts in S.build(schedule.removeprefix("torch-"), stages, microbatches, geo)]
    per_link = times.message_cost_per_link_s if message_overhead_s is None else None
    costs = Costs(times.forward_s, times.backward_s, link_delay_s, bytes_per_s, times.activation_bytes,
                  max(times.stash_bytes), overhead, None if times.timed else times.dispatch_s,
                  receiver_driven=TRANSPORTS[transport].receiver_driven, link_overhead_s=per_link,
                  send_lag_s=times.send_lag_s if times.timed else None,
                  recv_lag_s=times.recv_lag_s if times.timed else None,
                  start_s=times.start_offset_s if measured_here else None)
    return simulate_expected(sched, costs, times.samples, microbatches), geo


def bubble_vs_reference(prediction: Prediction, times: StageTimes) -> float:
    """The predicted step against the measured uncontended compute, as runs report it; the own-compute
    bubble where no reference was measured."""
    if not times.reference_s:
        return prediction.mean_bubble_ratio
    return sum(1 - ref / prediction.iteration_s for ref in times.reference_s) / len(times.reference_s)
