"""GeoPipe's plan: how many extra micro-batches each stage keeps in flight, over the whole pipeline.

A micro-batch that stage s forwards comes back as a gradient only after its activation crossed every later
link and its gradient crossed them back; meanwhile stage s has to keep computing. The plan:
1. an upper bound that surely hides the links: per stage, the sum over every later link l of
   ceil(2 x (delay_l + activation / rate_l) / compute), one whole number of micro-batches per link crossing;
2. the fewest extra micro-batches, stage by stage, that the dry-run simulator (workloads/simulate.py, the
   executor's semantics) shows reaching the same step time as that bound;
3. bounds: the memory budget (each stage's peak footprint, workloads/memory.py), the micro-batch count, and
   the pipeline's order (a stage may hold at most one extra more than the stage before it, else it waits for
   an activation its predecessor makes only after a gradient that waits on it: a deadlock).
Compute is taken at the fast end of what the warm-up measured (FAST_QUANTILE of the per-micro-batch F+B
times, as a ratio to the mean): a window must stay filled when compute runs fast. The micro-batches owed to
that spread are the plan's `slack` (the plan at the fast quantile minus the plan at the mean).
"""

from __future__ import annotations

import math

from workloads.memory import activation_lookahead, footprint_bytes, pipeline_warmup
from workloads.schedule import GeoPipeSizing, ScheduleError, geopipe
from workloads.simulate import Costs, Deadlock, simulate

FAST_QUANTILE = 0.1
SAME_STEP = 0.005
"""A reduction is kept when the simulated step time stays within this fraction of the upper bound's."""


def lookaheads(stages: int, microbatches: int, extra: list[int]) -> list[int]:
    """Activation receives each stage posts ahead (workloads.memory.activation_lookahead)."""
    return [activation_lookahead(s, stages, microbatches, extra[s - 1] if s > 0 else 0) for s in range(stages)]


def size_geopipe(stages: int, microbatches: int, *, link_delay_s: list[float], link_bytes_per_s: list[float],
                 activation_bytes: int, forward_s: list[float], backward_s: list[float], stash_bytes: list[int],
                 budget_bytes: list[int] | None = None, fast_ratio: list[float] | None = None) -> GeoPipeSizing:
    """The plan for one pipeline (see the module docstring). `link_delay_s[s]` / `link_bytes_per_s[s]`: the
    link between stage s and s+1 (0 delay within a DC). `fast_ratio[s]`: fast-quantile F+B over mean F+B."""
    ratio = fast_ratio or [1.0] * stages
    fast_f = [f * r for f, r in zip(forward_s, ratio, strict=True)]
    fast_b = [b * r for b, r in zip(backward_s, ratio, strict=True)]
    cover = [sum(2 * (link_delay_s[lk] + activation_bytes / link_bytes_per_s[lk]) for lk in range(s, stages - 1))
             for s in range(stages)]
    at_mean = _fewest(stages, microbatches, link_delay_s, link_bytes_per_s, activation_bytes, forward_s, backward_s)
    at_fast = _fewest(stages, microbatches, link_delay_s, link_bytes_per_s, activation_bytes, fast_f, fast_b)
    wanted = [max(f, m) for f, m in zip(at_fast, at_mean, strict=True)]    # faster compute never needs fewer
    extra, bound = [], []
    for s in range(stages):
        k = wanted[s]
        reason = "hidden" if s < stages - 1 else "no link"
        room = microbatches - min(pipeline_warmup(s, stages), microbatches)
        if k > room:
            k, reason = room, "micro-batches"
        if s > 0 and k > extra[s - 1] + 1:
            k, reason = extra[s - 1] + 1, "next stage"
        if budget_bytes is not None:
            ahead = activation_lookahead(s, stages, microbatches, extra[s - 1] if s > 0 else 0)

            def footprint(e: int, s: int = s, ahead: int = ahead) -> int:
                return footprint_bytes(s, stages, microbatches, extra=e, lookahead=ahead, stash_bytes=stash_bytes[s],
                                       activation_bytes=activation_bytes)
            if footprint(0) > budget_bytes[s]:
                raise ScheduleError(f"memory budget {budget_bytes[s]} B on stage {s} is below what 1F1B order with "
                                    f"early receives holds there ({footprint(0)} B): raise it (e.g. 1f1b+0)")
            while k > 0 and footprint(k) > budget_bytes[s]:
                k, reason = k - 1, "memory budget"
        extra.append(k)
        bound.append(reason)
    look = lookaheads(stages, microbatches, extra)
    footprints = [footprint_bytes(s, stages, microbatches, extra=extra[s], lookahead=look[s], stash_bytes=stash_bytes[s],
                                  activation_bytes=activation_bytes) for s in range(stages)]
    return GeoPipeSizing(tuple(extra), tuple(look), tuple(wanted), tuple(bound), tuple(cover),
                         tuple(w - m for w, m in zip(wanted, at_mean, strict=True)), tuple(budget_bytes or ()),
                         tuple(footprints))


def quantile(values: list[float], q: float) -> float:
    """Linear-interpolated quantile of `values` (q in [0, 1])."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("quantile of no values")
    pos = q * (len(ordered) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def upper_bound(stages: int, link_delay_s: list[float], link_bytes_per_s: list[float], activation_bytes: int,
                compute_s: list[float]) -> list[int]:
    """One whole number of micro-batches per later link crossing, per stage."""
    return [sum(math.ceil(2 * (link_delay_s[lk] + activation_bytes / link_bytes_per_s[lk]) / max(compute_s[s], 1e-6))
                for lk in range(s, stages - 1)) for s in range(stages)]


def _fewest(stages: int, microbatches: int, link_delay_s: list[float], link_bytes_per_s: list[float],
            activation_bytes: int, forward_s: list[float], backward_s: list[float]) -> list[int]:
    """Step 2 of the plan: from the upper bound, lower each stage's extra count while the simulated step
    time stays within SAME_STEP of the bound's (stages in order, repeated until nothing changes)."""
    compute = [f + b for f, b in zip(forward_s, backward_s, strict=True)]
    extra = upper_bound(stages, link_delay_s, link_bytes_per_s, activation_bytes, compute)
    for s in range(stages):
        extra[s] = min(extra[s], microbatches - min(pipeline_warmup(s, stages), microbatches))
        if s > 0:
            extra[s] = min(extra[s], extra[s - 1] + 1)
    costs = Costs(forward_s, backward_s, link_delay_s, link_bytes_per_s, activation_bytes, 0)

    def step_time(candidate: list[int]) -> float:
        plan = GeoPipeSizing(tuple(candidate), tuple(lookaheads(stages, microbatches, candidate)),
                             tuple(candidate), ("plan",) * stages)
        try:
            return simulate(geopipe(stages, microbatches, plan), costs).iteration_s
        except Deadlock:
            return math.inf

    target = step_time(extra) * (1 + SAME_STEP)
    changed = True
    while changed:
        changed = False
        for s in range(stages - 1):
            while extra[s] > 0 and (s == stages - 1 or extra[s + 1] <= extra[s]):
                trial = [*extra[:s], extra[s] - 1, *extra[s + 1:]]
                if step_time(trial) > target:
                    break
                extra, changed = trial, True
    return extra
