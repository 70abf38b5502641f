"""GeoPipe's planner over the micro-batch shape: at a fixed token budget per step, the micro-batch size b,
the sequence length s (so the micro-batch count m = tokens / (b * s)) and, for geopipe, the extra forward
passes each stage keeps in flight (dN, workloads/sizing.py), chosen under the accelerator's memory to
minimise the modelled iteration time (workloads/simulate.py on the deployment's own times and links).

The search is exhaustive over a grid of shapes (every (b, s) of `ShapeSpace` whose b * s divides the budget);
a schedule's best and runner-up are kept with every shape's outcome, so a reader sees what the choice beat.
The baselines get the same search (1F1B's best shape under the same budget and memory), so a cut is never
measured against a baseline held at a worse shape. dN is sized (sizing.size_geopipe's fewest extra that
reach the bound's step) on at most SIZING_MICROBATCHES micro-batches of the shape: what hides a link is the
link's round trip against a micro-batch's compute, not the count; the step is then simulated at the full m.

Inputs are the cost model's and the plan's only (no measurement of any run): per stage its forward, backward,
stash and resident bytes, the HBM, the activation bytes, and per stage link its delay and rate.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from workloads import schedule as S
from workloads.compute import CostTable
from workloads.memory import activation_lookahead, footprint_bytes
from workloads.schedule import GeoPipeSizing, ScheduleError
from workloads.simulate import Costs, simulate
from workloads.sizing import lookaheads, size_geopipe

SIZING_MICROBATCHES = 32
"""dN is sized on at most this many micro-batches (about 0.3 s for 8 stages); the step at the full count."""
PLANNED = ("1f1b", "1f1b-prefetch", "geopipe")
RECEIVES_FIRST = True
"""The executor's order with compute as time over gloo (schedule.posting_order): sends leave from a sender
thread, so the receives that follow a send are posted before it; the step is modelled in that order."""


@dataclass(frozen=True, slots=True)
class ShapeSpace:
    """The grid the planner searches."""

    microbatch_sizes: tuple[int, ...] = (1, 2, 4, 8)
    seq_lens: tuple[int, ...] = (1024, 2048, 4096)

    def shapes(self, tokens: int) -> list[tuple[int, int, int]]:
        """(b, s, m) for every grid point whose b * s divides `tokens`, smallest micro-batches first."""
        return sorted((b, s, tokens // (b * s)) for b in self.microbatch_sizes for s in self.seq_lens
                      if tokens % (b * s) == 0)


@dataclass(frozen=True, slots=True)
class ShapeOutcome:
    """One schedule at one shape: its modelled step, or why it cannot run there."""

    schedule: str
    microbatch_size: int
    seq_len: int
    microbatches: int
    step_s: float | None
    """The modelled iteration time (None: infeasible)."""
    bubble: float | None
    """The model's computation bubble: 1 - a stage's compute / the step, the mean over stages (as runs report)."""
    extra: tuple[int, ...] = ()
    """geopipe's dN per stage (empty for the baselines)."""
    peak_bytes: int = 0
    """The largest stage's modelled peak: in-flight bytes plus its resident state."""
    why: str = ""
    """Why the shape is infeasible ('' where it runs)."""

    @property
    def feasible(self) -> bool:
        return self.step_s is not None

    @property
    def shape_text(self) -> str:
        return f"b={self.microbatch_size} s={self.seq_len} m={self.microbatches}"

    def to_json(self) -> dict[str, Any]:
        return {"schedule": self.schedule, "microbatch_size": self.microbatch_size, "seq_len": self.seq_len,
                "microbatches": self.microbatches, "step_s": self.step_s, "bubble": self.bubble,
                "extra": list(self.extra), "peak_bytes": self.peak_bytes, "why": self.why}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ShapeOutcome:
        return cls(**{**data, "extra": tuple(data.get("extra", ()))})


@dataclass(frozen=True, slots=True)
class ShapePlan:
    """A schedule's shape search at one token budget and one setting of the links."""

    schedule: str
    tokens: int
    outcomes: tuple[ShapeOutcome, ...]
    seconds: float
    """The planner's own time for this schedule."""
    method: str = field(default="exhaustive")

    @property
    def ranked(self) -> list[ShapeOutcome]:
        return sorted((o for o in self.outcomes if o.feasible), key=lambda o: (o.step_s, o.microbatches))

    @property
    def best(self) -> ShapeOutcome | None:
        ranked = self.ranked
        return ranked[0] if ranked else None

    @property
    def runner_up(self) -> ShapeOutcome | None:
        ranked = self.ranked
        return ranked[1] if len(ranked) > 1 else None

    def to_json(self) -> dict[str, Any]:
        return {"schedule": self.schedule, "tokens": self.tokens, "seconds": self.seconds, "method": self.method,
                "outcomes": [o.to_json() for o in self.outcomes]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ShapePlan:
        return cls(str(data["schedule"]), int(data["tokens"]), tuple(ShapeOutcome.from_json(o) for o in data["outcomes"]),
                   float(data["seconds"]), str(data.get("method", "exhaustive")))


@dataclass(frozen=True, slots=True)
class Links:
    """Per stage link (stage s to s+1): one-way delay and rate in the deployment's units."""

    delay_s: list[float]
    bytes_per_s: list[float]


def plan_shapes(schedule: str, tokens: int, costs_at: Callable[[int, int], CostTable], links: Links,
                space: ShapeSpace | None = None) -> ShapePlan:
    """Every shape of `space` that divides `tokens`, modelled for `schedule` (one of PLANNED); `costs_at(b, s)`
    gives the cost table at that shape (a profile's, unscaled: the deployment's own bytes and rates)."""
    if schedule not in PLANNED:
        raise ScheduleError(f"the shape planner models {', '.join(PLANNED)}, not {schedule!r}")
    space = space or ShapeSpace()
    shapes = space.shapes(tokens)
    if not shapes:
        raise ScheduleError(f"no shape of the grid (b in {list(space.microbatch_sizes)}, s in {list(space.seq_lens)}) "
                            f"divides {tokens} tokens: give a budget that is a multiple of b * s, e.g. "
                            f"{space.microbatch_sizes[0] * space.seq_lens[-1] * 64}")
    started = time.perf_counter()
    outcomes = tuple(evaluate(schedule, b, s, m, costs_at(b, s), links) for b, s, m in shapes)
    return ShapePlan(schedule, tokens, outcomes, time.perf_counter() - started)


def evaluate(schedule: str, b: int, s: int, m: int, table: CostTable, links: Links) -> ShapeOutcome:
    """`schedule` at shape (b, s) with m micro-batches: infeasible where 1F1B's own in-flight memory does not fit
    the HBM beside the resident state, else the modelled step (geopipe with its dN sized under that memory)."""
    stages = len(table.stages)
    stash = [st.stash_bytes for st in table.stages]
    free = (table.hbm_bytes or 0) - (table.resident_bytes or 0)
    base = [footprint_bytes(k, stages, m, extra=0, lookahead=activation_lookahead(k, stages, m, 0),
                            stash_bytes=stash[k], activation_bytes=table.activation_bytes) for k in range(stages)]
    if table.hbm_bytes is not None and max(base) > free:
        return ShapeOutcome(schedule, b, s, m, None, None, why=f"1F1B's in-flight {max(base) / 2**30:.1f} GiB over "
                            f"the {max(free, 0) / 2**30:.1f} GiB left beside the resident state")
    fw, bw = [st.forward.median_s for st in table.stages], [st.backward.median_s for st in table.stages]
    costs = Costs(fw, bw, links.delay_s, links.bytes_per_s, table.activation_bytes, max(stash))
    geo = None
    if schedule == "geopipe":
        geo = _sized(stages, m, table, links, [free] * stages if table.hbm_bytes is not None else None)
    elif schedule == "1f1b-prefetch":
        geo = GeoPipeSizing.prefetch(stages, m)
    acts = [S.posting_order(a, RECEIVES_FIRST) for a in S.build("geopipe" if geo is not None else schedule, stages, m,
                                                                 geo)]
    pred = simulate(acts, costs)
    extra = geo.extra_inflight if schedule == "geopipe" and geo else ()
    peaks = [footprint_bytes(k, stages, m, extra=extra[k] if extra else 0,
                             lookahead=geo.recv_lookahead[k] if geo else activation_lookahead(k, stages, m, 0),
                             stash_bytes=stash[k], activation_bytes=table.activation_bytes) for k in range(stages)]
    return ShapeOutcome(schedule, b, s, m, pred.iteration_s, pred.mean_bubble_ratio, tuple(extra),
                        max(peaks) + (table.resident_bytes or 0))


def _sized(stages: int, m: int, table: CostTable, links: Links, budget: list[int] | None) -> GeoPipeSizing:
    """geopipe's dN sized on min(m, SIZING_MICROBATCHES) micro-batches, applied at m (look-ahead recomputed)."""
    fw, bw = [st.forward.median_s for st in table.stages], [st.backward.median_s for st in table.stages]
    stash = [st.stash_bytes for st in table.stages]
    n = min(m, SIZING_MICROBATCHES)
    geo = size_geopipe(stages, n, link_delay_s=links.delay_s, link_bytes_per_s=links.bytes_per_s,
                       activation_bytes=table.activation_bytes, forward_s=fw, backward_s=bw, stash_bytes=stash,
                       budget_bytes=budget)
    if n == m:
        return geo
    extra = list(geo.extra_inflight)
    return GeoPipeSizing(tuple(extra), tuple(lookaheads(stages, m, extra)), geo.wanted_extra, geo.bound, geo.cover_s)
