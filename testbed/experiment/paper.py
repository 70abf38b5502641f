"""GeoPipe's own experiment in its regime (the paper, arXiv 2510.12064: 8 nodes of 8 Ascend 910B over 3 regions,
TP 8 inside a node and PP 8 across, Llama 2 13B and "72B", the spine port rate swept, a fixed token budget):
per spine rate and distance, each schedule's micro-batch shape chosen by the shape planner (workloads/shapes.py:
geopipe's (b, s, dN) and the baselines' best (b, s) at the same token count, under the node's HBM), then run at
that shape with compute as time from the deployment profile over the emulated links, beside the model.

Each point sets every OTN link of the topology to the distance (5 us/km one way) and the spine rate; the
emulated rate is the spine over the topology's own scale (real_rate / rate), so a message carries the same
bytes at every spine and its transfer takes what the spine's would. A schedule runs in a launch of its own (its
shape is its own). Figures: bubble and iteration time per schedule, geopipe's cut of each against 1F1B, the
spine past which more rate no longer shortens geopipe's step (the paper's optimisation point), model beside
measurement at every point.
"""

from __future__ import annotations

import csv
import json
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from testbed.backends.base import Backend
from testbed.deploy import lifecycle
from testbed.deploy.linkset import set_link
from testbed.experiment.paper_report import plot, report
from testbed.experiment.real_beside import RealBesideResult, RealBesideSpec, render, train_beside
from testbed.plan.model import Plan
from testbed.run.dilation import plan_dilation
from testbed.run.runner import RunOptions, run_schedules
from testbed.run.shapeplan import links_of_plan, profile_costs
from testbed.topology.profile import DeploymentProfile, resolve_profile
from testbed.util.interrupts import cleanup
from testbed.util.paths import resolve_topology
from workloads.shapes import PLANNED, ShapeOutcome, ShapeSpace, plan_shapes

FIBRE_S_PER_KM = 5e-6


@dataclass(kw_only=True, slots=True)
class PaperSpec:
    """What the experiment sweeps; the defaults are `make demo`'s figure set."""

    topology: str = "3dc-8stages"
    profile: str = "llama2-13b-910b-tp8"
    tokens: int = 2**18
    """Tokens per step, the same for every schedule and shape (the paper's fixed token count)."""
    spines_gbps: list[float] = field(default_factory=lambda: [100.0, 400.0])
    distances_km: list[float] = field(default_factory=lambda: [0.0, 1000.0])
    schedules: tuple[str, ...] = PLANNED
    iterations: int = 2
    dilation: str = "auto"
    """Slow motion (testbed/run/dilation.py): 8 stages' messages on 2 cores at 1:1 time cost a 13B step +21 %
    beyond the model; at k = 4 (auto) +0.5 %."""
    microbatch_sizes: tuple[int, ...] = (1, 2, 4, 8)
    seq_lens: tuple[int, ...] = (1024, 2048, 4096)
    model_spines_gbps: list[float] = field(default_factory=lambda: [6.25, 12.5, 25, 100, 400])
    """Spine rates the model alone covers (the optimisation point's curve)."""
    results: str = "results"
    real_beside: RealBesideSpec | None = field(default_factory=RealBesideSpec)
    """After the figure set, the small GPT trained for real on the same links (testbed/experiment/real_beside.py);
    None: not."""

    @property
    def space(self) -> ShapeSpace:
        return ShapeSpace(tuple(self.microbatch_sizes), tuple(self.seq_lens))


HANG_STEPS = 10
"""A run of the figure set is stopped as hung after this many of its modelled (dilated) steps without progress,
60 s at least: a 70B stage at k = 4 takes ~45 s a step, and geopipe's warm-up, before its dN is sized, longer
(a 60 s bound stopped a right 70B geopipe run at 200 Gb/s and 1000 km)."""


@dataclass(kw_only=True, slots=True)
class PaperPoint:
    """One schedule at one spine rate and distance: its planned shape and the model's and the run's figures."""

    spine_gbps: float
    distance_km: float
    schedule: str
    planned: ShapeOutcome
    step_s: float | None = None
    bubble: float | None = None
    """Measured: 1 - a stage's stated compute (the table's F+B x m) / the step, the mean over stages."""
    fb_ms: float | None = None
    """The shape's F+B per micro-batch of the median stage (the deployment's, as the table states it)."""
    extra_run: list[int] = field(default_factory=list)
    """geopipe's dN as the workers sized it from their warm-up."""
    links_on_time: bool | None = None
    lateness_ok: bool | None = None
    """Every stage's timed spans within the lateness bound (testbed/run/lateness.py)."""
    dilation: float = 1.0
    run_dir: str = ""
    blind_step_s: float | None = None
    """The network-blind model: the same schedule and shape with every OTN span at 0 km. Where its error is as
    small as the model's, the point cannot tell a right link from a wrong one; where it is large, it can."""

    @property
    def model_error(self) -> float | None:
        return None if self.step_s is None else self.planned.step_s / self.step_s - 1

    @property
    def blind_error(self) -> float | None:
        return None if self.step_s is None or self.blind_step_s is None else self.blind_step_s / self.step_s - 1

    def to_json(self) -> dict[str, Any]:
        return {**{k: v for k, v in asdict(self).items() if k != "planned"}, "planned": self.planned.to_json()}


def run_paper(spec: PaperSpec, log: Callable[[str], None] = print) -> Path:
    """Bring the topology up, measure every point, write summary.json, points.csv, report.md and the plot."""
    out = Path(spec.results) / (time.strftime("%Y%m%d-%H%M%S") + "-paper")
    out.mkdir(parents=True, exist_ok=True)
    points: list[PaperPoint] = []
    real: list[RealBesideResult] = []
    topology = str(resolve_topology(spec.topology))
    try:
        with lifecycle.testbed_for(topology, name=f"pp{int(time.time()) % 100000}", log=lambda _m: None) as backend:
            for spine in spec.spines_gbps:
                for km in spec.distances_km:
                    set_spine(backend, spine * 1e9, km)
                    measure_point(backend, spec, spine, km, out, log, points)
            if spec.real_beside is not None:
                real = train_beside(backend, spec.real_beside, out, spec.distances_km[-1])
                for r in real:
                    log(f"real arithmetic, {r.schedule}: loss {r.loss_first:.4f} -> {r.loss_last:.4f} (one process "
                        f"{r.one_process_first:.4f} -> {r.one_process_last:.4f}), gradient gap {r.gradient_gap:.1e}, "
                        f"step {r.step_s:.3f} s at F+B {r.fb_ms:.1f} ms: {'ok' if r.ok else 'NOT the same training'}")
    except BaseException:
        with cleanup():
            write_outputs(out, spec, points, [], real)    # what was measured, at once (the model's curve takes a minute)
        raise
    write_outputs(out, spec, points, model_curve(spec), real)
    return out


def set_spine(backend: Backend, spine_bps: float, km: float) -> None:
    """Every OTN link at `km`, standing for the spine rate: the emulated rate stays as the topology has it and the
    messages shrink by spine / emulated rate. (Scaling the emulated rate with the spine instead would shrink
    each message to a few HTB bursts at low spine rates: 10 MiB at 1:400 is 26 KB, of which the 15 KB burst
    leaves at line rate, and a 25 Gb/s spine then read as a faster one.)"""
    done = set()
    for d in backend.state.plan.directions:
        if d.link not in done:
            done.add(d.link)
            set_link(backend, d.src_dc, d.dst_dc, delay_s=km * FIBRE_S_PER_KM, real_rate_bps=spine_bps)


def measure_point(backend: Backend, spec: PaperSpec, spine: float, km: float, out: Path,
                  log: Callable[[str], None], points: list[PaperPoint]) -> None:
    """Plan each schedule's shape at the links as they are, run it there, and append it to `points` as soon as
    it is measured (a later schedule that fails or is stopped does not take the earlier ones with it)."""
    profile = resolve_profile(spec.profile)
    stages, links = links_of_plan(backend.state.plan, profile)
    for schedule in spec.schedules:
        plan = plan_shapes(schedule, spec.tokens, profile_costs(profile, stages), links, spec.space)
        best = plan.best
        if best is None:
            log(f"{spine:g} Gb/s, {km:g} km, {schedule}: no shape fits the HBM")
            continue
        point = PaperPoint(spine_gbps=spine, distance_km=km, schedule=schedule, planned=best,
                           blind_step_s=blind_step(backend.state.plan, profile, spec.tokens, schedule, best))
        run_point(backend, spec, point, stages, out)
        log(f"{spine:g} Gb/s, {km:g} km, {schedule:13} {best.shape_text}: step {point.step_s:.3f} s "
            f"(model {best.step_s:.3f} s, {point.model_error:+.1%}), bubble {point.bubble:.3f} "
            f"(model {best.bubble:.3f})" + (f", dN {point.extra_run}" if point.extra_run else ""))
        points.append(point)


def blind_step(plan: Plan, profile: DeploymentProfile, tokens: int, schedule: str, shape: ShapeOutcome) -> float | None:
    """The model's step for `schedule` at `shape`'s (b, s) with every OTN span at 0 km (the network-blind model;
    geopipe's dN sized for 0 km, as a planner blind to the links would size it)."""
    stages, links = links_of_plan(plan, profile, delay_s=0.0)
    blind = plan_shapes(schedule, tokens, profile_costs(profile, stages), links,
                        ShapeSpace((shape.microbatch_size,), (shape.seq_len,))).best
    return blind.step_s if blind else None


def run_point(backend: Backend, spec: PaperSpec, point: PaperPoint, stages: int, out: Path) -> None:
    """One launch of `point.schedule` at its planned shape, its in-flight memory budget the node's HBM beside the
    resident state (as the planner's); the measured figures into `point`."""
    shape = point.planned
    table = resolve_profile(spec.profile).table(stages, [], shape.microbatch_size, shape.seq_len)
    hbm_free = (table.hbm_bytes or 0) - (table.resident_bytes or 0)
    label = f"{point.spine_gbps:g}G-{point.distance_km:g}km-{point.schedule}"
    factor = plan_dilation(spec.dilation, stages, os.cpu_count() or 1, timed=True).factor
    opts = RunOptions(schedules=[point.schedule], compute=spec.profile, shape=(shape.microbatch_size, shape.seq_len),
                      tokens=spec.tokens, iterations=spec.iterations, stages=stages, memory_budget=hbm_free,
                      dilation=spec.dilation, hang_timeout_s=max(60.0, HANG_STEPS * shape.step_s * factor))
    run_dir, summary = run_schedules(backend, opts, out / "runs", run_id=label, log=lambda _m: None)
    measured = summary.schedules[0]
    point.step_s, point.bubble = measured.step_time_s, measured.bubble_vs_reference
    point.fb_ms = (summary.fb_per_microbatch_s or 0.0) * 1e3
    point.extra_run = list(measured.geopipe_sizing.extra_inflight) if measured.geopipe_sizing else []
    point.links_on_time = measured.links_on_time if measured.link_timing else None
    point.lateness_ok = measured.lateness_ok
    point.dilation = summary.dilation.factor
    point.run_dir = str(run_dir)


def model_curve(spec: PaperSpec) -> list[dict[str, Any]]:
    """The model alone over `model_spines_gbps` x the distances: each schedule's best step (its own shape)."""
    from testbed.plan import build_plan
    from testbed.topology.loader import load_topology

    profile = resolve_profile(spec.profile)
    plan = build_plan(load_topology(resolve_topology(spec.topology)))
    rows = []
    for km in spec.distances_km:
        for spine in spec.model_spines_gbps:
            stages, links = links_of_plan(plan, profile, delay_s=km * FIBRE_S_PER_KM, real_rate_bps=spine * 1e9)
            for schedule in spec.schedules:
                best = plan_shapes(schedule, spec.tokens, profile_costs(profile, stages), links,
                                   spec.space).best
                rows.append({"distance_km": km, "spine_gbps": spine, "schedule": schedule,
                             "step_s": best.step_s if best else None, "bubble": best.bubble if best else None})
    return rows


def write_outputs(out: Path, spec: PaperSpec, points: list[PaperPoint], curve: list[dict[str, Any]],
                  real: list[RealBesideResult] | None = None) -> None:
    """summary.json, points.csv, report.md and paper.png: what was measured, even if it stopped early."""
    real = real or []
    (out / "summary.json").write_text(json.dumps({"spec": asdict(spec), "points": [p.to_json() for p in points],
                                                  "model_curve": curve, "real_beside": [r.to_json() for r in real]},
                                                 indent=1))
    with (out / "points.csv").open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["spine_gbps", "distance_km", "schedule", "b", "s", "m", "fb_ms", "step_s", "step_model_s",
                    "bubble", "bubble_model", "dN_planned", "dN_run", "links_on_time", "step_blind_model_s"])
        for p in points:
            w.writerow([p.spine_gbps, p.distance_km, p.schedule, p.planned.microbatch_size, p.planned.seq_len,
                        p.planned.microbatches, p.fb_ms, p.step_s, p.planned.step_s, p.bubble, p.planned.bubble,
                        " ".join(map(str, p.planned.extra)), " ".join(map(str, p.extra_run)), p.links_on_time,
                        p.blind_step_s])
    (out / "report.md").write_text(report(spec, points, curve) + ("\n" + render(real) if real else ""))
    plot(out / "paper.png", spec, points, curve)
