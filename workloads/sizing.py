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
Compute is what the warm-up measured, as a distribution (workloads/sampling.py): every candidate is judged
by its expected step over the same DRAWS bootstrap draws of the measured per-micro-batch times, so a window
sized for the average that stalls on the slow micro-batches is seen, and two warm-ups of the same compute
judge alike. Messages cost the transport's measured per-message time beyond delay and transfer (the workers
measure it by ping-pong at start-up). The micro-batches owed to the spread are the plan's `slack` (the plan
over the draws minus the plan at the mean times), and `why` says per stage what one fewer would cost.
"""

from __future__ import annotations

import dataclasses
import math

from workloads.memory import activation_lookahead, footprint_bytes, pipeline_warmup
from workloads.sampling import ComputeSamples
from workloads.schedule import GeoPipeSizing, ScheduleError, geopipe
from workloads.simulate import Costs, Deadlock, simulate

SAME_STEP = 0.005
"""A reduction is kept when the simulated step time stays within this fraction of the upper bound's."""


def lookaheads(stages: int, microbatches: int, extra: list[int]) -> list[int]:
    """Activation receives each stage posts ahead (workloads.memory.activation_lookahead)."""
    return [activation_lookahead(s, stages, microbatches, extra[s - 1] if s > 0 else 0) for s in range(stages)]


def size_geopipe(stages: int, microbatches: int, *, link_delay_s: list[float], link_bytes_per_s: list[float],
                 activation_bytes: int, forward_s: list[float], backward_s: list[float], stash_bytes: list[int],
                 budget_bytes: list[int] | None = None, samples: ComputeSamples | None = None,
                 message_overhead_s: float = 0.0) -> GeoPipeSizing:
    """The plan for one pipeline (see the module docstring). `link_delay_s[s]` / `link_bytes_per_s[s]`: the
    link between stage s and s+1 (0 delay within a DC). `samples`: the measured per-micro-batch times (None:
    the means alone); `message_overhead_s`: the transport's measured cost per message."""
    cover = [sum(2 * (link_delay_s[lk] + activation_bytes / link_bytes_per_s[lk]) for lk in range(s, stages - 1))
             for s in range(stages)]
    judge = _Judge(stages, microbatches, Costs(forward_s, backward_s, link_delay_s, link_bytes_per_s, activation_bytes,
                                               0, message_overhead_s), samples)
    at_mean = _fewest(stages, microbatches, link_delay_s, link_bytes_per_s, activation_bytes,
                      _Judge(stages, microbatches, judge.costs, None), forward_s, backward_s)
    wanted = _fewest(stages, microbatches, link_delay_s, link_bytes_per_s, activation_bytes, judge, forward_s,
                     backward_s) if samples is not None else at_mean
    wanted = [max(w, m) for w, m in zip(wanted, at_mean, strict=True)]      # a spread never needs fewer
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
                         tuple(footprints), tuple(judge.why(wanted, extra, bound)))


class _Judge:
    """The simulated step of a candidate plan: at the mean times, or expected over the draws of `samples`
    (common random numbers: every candidate meets the same draws). Results are cached per candidate."""

    def __init__(self, stages: int, microbatches: int, costs: Costs, samples: ComputeSamples | None) -> None:
        self.stages, self.microbatches, self.costs = stages, microbatches, costs
        self.draws = samples.draws(microbatches) if samples is not None else []
        self.cache: dict[tuple[int, ...], float] = {}

    def step(self, candidate: list[int]) -> float:
        key = tuple(candidate)
        if key not in self.cache:
            plan = GeoPipeSizing(key, tuple(lookaheads(self.stages, self.microbatches, candidate)), key,
                                 ("plan",) * self.stages)
            schedule = geopipe(self.stages, self.microbatches, plan)
            try:
                if not self.draws:
                    self.cache[key] = simulate(schedule, self.costs).iteration_s
                else:
                    self.cache[key] = sum(simulate(schedule, _with(self.costs, f, b)).iteration_s
                                          for f, b in self.draws) / len(self.draws)
            except Deadlock:
                self.cache[key] = math.inf
        return self.cache[key]

    def why(self, wanted: list[int], extra: list[int], bound: list[str]) -> list[str]:
        """Per stage, in words: what the plan's count buys against one fewer (expected steps)."""
        basis = f"expected over {len(self.draws)} draws of the measured compute" if self.draws else "at the mean compute"
        out = []
        for s in range(self.stages):
            if s == self.stages - 1:
                out.append("last stage: no link after it")
                continue
            here = self.step(wanted)
            if wanted[s] == 0:
                text = f"0 extra: the links after it are hidden without ({basis})"
            else:
                fewer = [*wanted[:s], wanted[s] - 1, *wanted[s + 1:]]
                cost = self.step(fewer) / here - 1 if here > 0 else 0.0
                text = (f"{wanted[s]} extra: with {wanted[s] - 1} the step would be {cost:+.1%} "
                        f"({basis}; kept when under {SAME_STEP:.1%})")
            if extra[s] != wanted[s]:
                text += f"; held to {extra[s]} by the {bound[s]}"
            out.append(text)
        return out


def _with(costs: Costs, forward: list[list[float]], backward: list[list[float]]) -> Costs:
    return dataclasses.replace(costs, forward_mb_s=forward, backward_mb_s=backward)


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
            activation_bytes: int, judge: _Judge, forward_s: list[float], backward_s: list[float]) -> list[int]:
    """Step 2 of the plan: from the upper bound, lower each stage's extra count while the judged step time
    stays within SAME_STEP of the bound's (stages in order, repeated until nothing changes)."""
    compute = [f + b for f, b in zip(forward_s, backward_s, strict=True)]
    extra = upper_bound(stages, link_delay_s, link_bytes_per_s, activation_bytes, compute)
    for s in range(stages):
        extra[s] = min(extra[s], microbatches - min(pipeline_warmup(s, stages), microbatches))
        if s > 0:
            extra[s] = min(extra[s], extra[s - 1] + 1)
    target = judge.step(extra) * (1 + SAME_STEP)
    changed = True
    while changed:
        changed = False
        for s in range(stages - 1):
            while extra[s] > 0 and (s == stages - 1 or extra[s + 1] <= extra[s]):
                trial = [*extra[:s], extra[s] - 1, *extra[s + 1:]]
                if judge.step(trial) > target:
                    break
                extra, changed = trial, True
    return extra
