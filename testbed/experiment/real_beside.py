"""Beside a compute-as-time figure set, the small GPT trained for real across the same emulated links: a few
steps of real arithmetic (this host's regime, not the paper's), its loss falling, and its losses and last
gradients against the same training in one process (workloads/equivalence.py). It shows that the schedules
timed in the figures also compute the right thing over these links."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from testbed.backends.base import Backend
from testbed.run.runner import RunOptions, run_schedules

LOSS_REL_TOL = 1e-3
"""Each recorded loss within this of one process's (float sums in another order over a few AdamW steps)."""
GRAD_REL_TOL = 1e-3
"""The last step's gradients within this of one process's, relative to each tensor's largest gradient."""


@dataclass(kw_only=True, slots=True)
class RealBesideSpec:
    """The small run: 3 stages (one per DC of the paper's line), a few steps, two schedules."""

    schedules: list[str] = field(default_factory=lambda: ["1f1b", "geopipe"])
    stages: int = 3
    microbatches: int = 8
    iterations: int = 4
    """Timed steps after the warm-up; every one an AdamW step."""
    model: dict[str, int] = field(default_factory=lambda: {"n_layer": 3, "n_embd": 64, "n_head": 4, "block_size": 32})


@dataclass(kw_only=True, slots=True)
class RealBesideResult:
    """Per schedule: its step time and F+B per micro-batch on this host, losses first and last against one
    process's, and the largest gradient gap."""

    schedule: str
    step_s: float
    fb_ms: float
    loss_first: float
    loss_last: float
    one_process_first: float
    one_process_last: float
    gradient_gap: float
    distance_km: float

    @property
    def ok(self) -> bool:
        close = all(abs(a - b) <= LOSS_REL_TOL * abs(b) for a, b in
                    ((self.loss_first, self.one_process_first), (self.loss_last, self.one_process_last)))
        return close and self.loss_last < self.loss_first and self.gradient_gap <= GRAD_REL_TOL

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok}


def train_beside(backend: Backend, spec: RealBesideSpec, out: Path, distance_km: float) -> list[RealBesideResult]:
    """Run the schedules for real on `backend` as its links are now, then replay the training in one process."""
    from workloads.equivalence import largest_gradient_gap, train_in_one_process

    opts = RunOptions(schedules=list(spec.schedules), microbatches=spec.microbatches, iterations=spec.iterations,
                      model=dict(spec.model), stages=spec.stages, dump_gradients=True)
    run_dir, summary = run_schedules(backend, opts, out / "real", run_id="real-beside", log=lambda _m: None)
    one = train_in_one_process(opts.model, opts.microbatches, opts.microbatch_size, 1 + spec.iterations, opts.lr,
                               opts.seed)
    results = []
    for measured in summary.schedules:
        gap = largest_gradient_gap(run_dir / measured.schedule, one, opts.model, spec.stages, opts.split)
        results.append(RealBesideResult(
            schedule=measured.schedule, step_s=measured.step_time_s, fb_ms=(summary.fb_per_microbatch_s or 0) * 1e3,
            loss_first=measured.loss_first or float("nan"), loss_last=measured.loss_last or float("nan"),
            one_process_first=one.losses[0], one_process_last=one.losses[-1], gradient_gap=gap,
            distance_km=distance_km))
    return results


def render(results: list[RealBesideResult]) -> str:
    """The report's section: a table and what it shows."""
    if not results:
        return ""
    lines = ["## The same links, real arithmetic (this host's regime)", "",
             f"The small GPT ({results[0].distance_km:g} km links as the last figure point left them) trained for "
             "real: every step an AdamW step; its losses and last gradients against the same training in one "
             f"process (losses within {LOSS_REL_TOL:.0e} relative, gradients within {GRAD_REL_TOL:.0e} of each "
             "tensor's largest).", "",
             "| schedule | step s | F+B per micro-batch | loss first -> last | one process | gradient gap | ok |",
             "|---|---|---|---|---|---|---|"]
    for r in results:
        lines.append(f"| {r.schedule} | {r.step_s:.3f} | {r.fb_ms:.1f} ms | {r.loss_first:.4f} -> {r.loss_last:.4f} "
                     f"| {r.one_process_first:.4f} -> {r.one_process_last:.4f} | {r.gradient_gap:.1e} "
                     f"| {'yes' if r.ok else 'NO'} |")
    return "\n".join(lines) + "\n"
