"""An experiment's summary.json, typed: the spec it ran, one `Point` per run, the model-only predictions and
the model's inputs, with `to_json`/`from_json`. `headline_points` is the one place that says which points
the main table, the headline and the distance plot are made of."""

from __future__ import annotations

import json
import statistics
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from testbed.experiment.model import StageTimes
from testbed.run.dilation import DEFAULT_DILATION
from testbed.run.summary import ScheduleSummary
from testbed.util.paths import DEFAULT_TOPOLOGY
from workloads.schedule import GeoPipeSizing

HEADLINE_SWEEPS = ("distance", "repeat")


@dataclass(kw_only=True, slots=True)
class ExperimentSpec:
    """What `testbed experiment` sweeps."""

    topology: str = DEFAULT_TOPOLOGY
    distances_km: list[float] = field(default_factory=lambda: [0, 500, 1000, 2000])
    schedules: list[str] = field(default_factory=lambda: ["1f1b", "1f1b-prefetch", "geopipe"])
    """Run at every distance and repetition."""
    focus_schedules: list[str] = field(default_factory=lambda: ["torch-1f1b", "torch-zbv"])
    """Run at the focus distance only, in every repetition (PyTorch's strongest that run here)."""
    focus_km: float = 1000
    """Distance of the repetitions, the budget sweep, the rate sweep and the timeline."""
    repetitions: int = 3
    budgets: list[str] = field(default_factory=lambda: ["1f1b+0", "1f1b+1", "1f1b+2", "1f1b+3"])
    """geopipe's memory budgets at the focus distance (workloads.memory.MemoryBudget)."""
    rates_mbit: list[float] = field(default_factory=lambda: [50.0])
    """Link rates at the focus (default: a bandwidth-bound one, where one transfer outlasts a micro-batch's
    compute and overlap stops paying)."""
    microbatch_counts: list[int] = field(default_factory=list)
    predict_km: list[float] = field(default_factory=lambda: [5000])
    """Model-only distances (what the machine does not emulate)."""
    microbatches: int = 64
    iterations: int = 3
    """Timed iterations of every schedule per launch (interleaved with the others), after one warm-up."""
    memory_budget: str | None = "1f1b+1"
    """The budget of every run but the budget sweep (enforced on our schedules): the headline's."""
    model: dict[str, Any] = field(default_factory=dict)
    results: str = "results"
    backend: str = "netns"
    switch: str = "auto"
    """Mininet's DC switch (backend mininet only)."""
    dilation: str = DEFAULT_DILATION
    """Time dilation of every run (testbed/run/dilation.py): off, auto or a factor."""
    transports: list[str] = field(default_factory=lambda: ["tcp"])
    """With more than tcp: a transport sweep at the focus, our schedules over each transport in turn (rdma needs
    rxe in namespaces; the testbed then comes up with `rdma: softroce`)."""
    compute: str = "real"
    """Every run's compute (`--compute`): real, replay, replay:FILE or a deployment profile (workloads/compute.py)."""
    stages: int | None = None
    """Pipeline stages (default: one per DC), spread evenly over the DCs."""
    shape: list[int] | None = None
    """A deployment profile's micro-batch [b, s] (`--shape BxS`); None: the profile's own."""
    tokens: int | None = None
    """Tokens per step (`--tokens`): `microbatches` derived as tokens / (b s) of the run's micro-batch, as a run
    derives it (testbed/run/runner.py's RunOptions), and recorded; None: `microbatches` as given."""

    def __post_init__(self) -> None:
        if self.tokens is None and self.shape is None:
            return
        from testbed.run.runner import RunError, RunOptions

        if self.tokens is not None and self.microbatch_counts:
            raise RunError(f"--tokens {self.tokens} fixes the micro-batch count; a --microbatch-counts sweep "
                           "would change it: give one or the other")
        self.shape = None if self.shape is None else [int(x) for x in self.shape]
        self.microbatches = RunOptions(schedules=["1f1b"], compute=self.compute, model=self.model,
                                       shape=None if self.shape is None else (self.shape[0], self.shape[1]),
                                       tokens=self.tokens, microbatches=self.microbatches).microbatches

    @property
    def headline_schedules(self) -> list[str]:
        return [*self.schedules, *(s for s in self.focus_schedules if s not in self.schedules)]

    @property
    def timed(self) -> bool:
        """Compute as time (no arithmetic): PyTorch's own schedules, which compute for real, are left out."""
        return self.compute != "real"

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ExperimentSpec:
        """Also reads specs of 0.2 (budgets in bytes or in stashes)."""
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        if isinstance(values.get("memory_budget"), int):
            values["memory_budget"] = str(values["memory_budget"])
        return cls(**values)


POINT_COLUMNS = ["sweep", "distance_km", "delay_ms", "rate_mbit", "microbatches", "schedule", "repetition",
                 "memory_budget", "rtt_ms", "bubble_vs_reference", "bubble_own_spans", "bubble_model", "step_s",
                 "step_model_s", "tokens_per_s", "exposed_comm_s", "peak_inflight_bytes", "span_stretch_max",
                 "steal_fraction", "repeated", "loss_last", "step_model_independent_s", "step_blind_model_s",
                 "link_excess_max_ms"]
"""The columns of an experiment's points.csv (one row per point)."""


@dataclass(kw_only=True, slots=True)
class Point:
    """One run of one schedule at one setting, with the model's prediction."""

    sweep: str
    """distance | repeat | budget | rate | microbatches."""
    distance_km: float
    delay_s: float
    rate_bps: float
    microbatches: int
    schedule: str
    repetition: int
    memory_budget: str | None
    """The run's in-flight budget (bytes or 1f1b+N), None for none."""
    rtt_s: float | None
    measured: ScheduleSummary
    predicted_bubble: float | None
    predicted_step_s: float | None
    """The model's step fed by this launch's own compute (its 1f1b's spans, else the first of ours), the probed
    per-message cost and the configured link: the schedule and the distance are the model's to predict."""
    run_dir: str
    label: str = ""
    """The run's name under runs/ (which planned run this is; what a resume skips)."""
    lossless_ok: bool = True
    """No packet was lost on a lossless link during the run."""
    lost_packets: int = 0
    daemon_restarts: int = 0
    transport: str = "tcp"
    """tcp (gloo) or rdma (RC queue pairs over SoftRoCE): what the run's workers used, and what the model assumed."""
    predicted_step_from_0km_s: float | None = None
    """The model's step fed by the 0 km 1f1b launch instead: what a user predicting from one 0 km run gets (it
    would carry the host's drift between launches, 10-30 % over minutes on the project's 2-core VMs, so each
    launch's own compute replaces it: `sweep.with_compute_of`). Its inputs are independent of this point's links:
    the host's costs calibrated once at 0 km, the launch's compute, the plan's delays and rates."""
    predicted_step_blind_s: float | None = None
    """The network-blind model: the same 0 km inputs with every stage link's delay at 0 (the schedule's 0 km step
    at every distance). Where its error is as small as the model's, the point cannot tell a right link from a
    wrong one."""
    link_excess_s: list[float] | None = None
    """Per stage link: what this launch's message-cost probe read beyond the 0 km launch's (signed, seconds): the
    link's own error against the plan (a delay 10 % long reads +10 % of the delay), judged against
    `link_excess_bound_s` and never fed to the model."""
    link_excess_bound_s: list[float] | None = None
    """Per stage link: verify's one-way delay tolerance at the point's delay (testbed.check.links.delay_tolerance),
    where the point ran in the 0 km launch itself; None in other launches, whose probes also carry the host's
    drift between launches (their links are judged by the run's own one-way check, LinkRecord.delay_ok)."""
    links_on_plan: bool | None = None
    """The run's own one-way check of every OTN direction before its launch (LinkRecord.delay_ok) passed."""

    @property
    def bubble(self) -> float | None:
        """The conservative bubble: 1 - uncontended compute / step time (own-span bubble where not measured)."""
        ref = self.measured.bubble_vs_reference
        return ref if ref is not None else self.measured.bubble_ratio

    @property
    def bubble_own(self) -> float | None:
        """1 - the schedule's own F/B span time / step time (flattered when overlap stretches the spans)."""
        return self.measured.bubble_ratio

    @property
    def sizing(self) -> GeoPipeSizing | None:
        return self.measured.geopipe_sizing

    def to_json(self) -> dict[str, Any]:
        return {**{f.name: getattr(self, f.name) for f in fields(self)}, "measured": self.measured.to_json()}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Point:
        known = {f.name for f in fields(cls)}
        budget = data.get("memory_budget")
        return cls(**{**{k: v for k, v in data.items() if k in known},
                      "memory_budget": None if budget is None else str(budget),
                      "measured": ScheduleSummary.from_json(data["measured"])})


@dataclass(frozen=True, slots=True)
class ModelPrediction:
    """The model at a distance no run measured."""

    distance_km: float
    schedule: str
    bubble: float
    step_s: float


@dataclass(kw_only=True, slots=True)
class ExperimentRecord:
    """results/<id>-experiment/summary.json."""

    id: str
    spec: ExperimentSpec
    environment: dict[str, Any]
    """Kernel, Python, backend, shaper and its calibration, transport, versions, CPUs, seconds taken."""
    points: list[Point]
    model_only: list[ModelPrediction] = field(default_factory=list)
    model_inputs: StageTimes | None = None
    message_overhead_s: float = 0.0
    """The transport's per-message cost the model uses (measured by the workers' probe, not fitted)."""
    partial: bool = False
    """Stopped before every planned run was measured."""
    missing: list[str] = field(default_factory=list)
    """Labels of the planned runs not measured."""
    stopped: str | None = None
    """Why it stopped early (an error, or the signal)."""
    resumed: int = 0
    """How many times `--resume` continued it."""

    def pool_references(self) -> None:
        """The model's bubbles against each point's own yardstick (the reference measured in its run), from its
        predicted step time; model-only predictions against the 0 km 1f1b run's."""
        for p in self.points:
            ref = p.measured.reference_yardstick_s_per_stage
            if p.predicted_step_s and p.predicted_bubble is not None and ref:
                p.predicted_bubble = statistics.mean(1 - r / p.predicted_step_s for r in ref)
        base = next((p.measured.reference_yardstick_s_per_stage for p in self.points
                     if p.schedule == "1f1b" and p.distance_km == 0 and p.measured.reference_yardstick_s_per_stage), None)
        if base:
            self.model_only = [ModelPrediction(m.distance_km, m.schedule,
                                               statistics.mean(1 - r / m.step_s for r in base), m.step_s)
                               for m in self.model_only]

    def headline_points(self, schedule: str | None = None, km: float | None = None) -> list[Point]:
        """The distance sweep and its repetitions, all at the headline memory budget (optionally one schedule or
        one distance): what the main table, the headline and the distance plot show."""
        return [p for p in self.points if p.sweep in HEADLINE_SWEEPS
                and (schedule is None or p.schedule == schedule) and (km is None or p.distance_km == km)]

    def sweep(self, name: str, schedule: str | None = None) -> list[Point]:
        return [p for p in self.points if p.sweep == name and (schedule is None or p.schedule == schedule)]

    def budget_points(self) -> list[Point]:
        """geopipe at each budget of the sweep at the focus distance: the sweep's own runs, and for the headline
        budget the focus distance's first run (the sweep does not run it twice), in the sweep's order."""
        by_budget = {p.memory_budget: p for p in self.sweep("budget")}
        headline = next((p for p in self.headline_points("geopipe", self.spec.focus_km)), None)
        if headline is not None and self.spec.memory_budget in self.spec.budgets:
            by_budget.setdefault(self.spec.memory_budget, headline)
        return [by_budget[b] for b in self.spec.budgets if b in by_budget]

    def focus_rows(self) -> dict[str, list[Point]]:
        """Per schedule, its runs at the focus distance and the headline budget (every repetition)."""
        by: dict[str, list[Point]] = {}
        for p in self.headline_points(km=self.spec.focus_km):
            by.setdefault(p.schedule, []).append(p)
        return by

    def focus_table(self) -> dict[str, Any]:
        """Medians at the focus distance over repetitions, and geopipe against each baseline: bubble cut,
        step-time speed-up, memory multiple; the split of the cut against 1f1b into early posting (1f1b ->
        1f1b-prefetch) and overlap (1f1b-prefetch -> geopipe)."""
        rows = self.focus_rows()
        med = {s: _medians(pts) for s, pts in rows.items()}
        result: dict[str, Any] = {"distance_km": self.spec.focus_km, "budget": self.spec.memory_budget,
                                  "medians": med, "repetitions": max((len(v) for v in rows.values()), default=0)}
        geo = med.get("geopipe")
        if geo:
            result["against"] = {s: _against(geo, m) for s, m in med.items() if s != "geopipe"}
        one, pre = med.get("1f1b"), med.get("1f1b-prefetch")
        if geo and one and pre and one["bubble"] - geo["bubble"] > 0:
            total = one["bubble"] - geo["bubble"]
            result["early_posting_share"] = (one["bubble"] - pre["bubble"]) / total
            result["overlap_share"] = (pre["bubble"] - geo["bubble"]) / total
        return result

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "spec": asdict(self.spec), "environment": self.environment,
                "points": [p.to_json() for p in self.points], "model_only": [asdict(m) for m in self.model_only],
                "model_inputs": self.model_inputs.to_json() if self.model_inputs else None,
                "message_overhead_s": self.message_overhead_s, "partial": self.partial, "missing": self.missing,
                "stopped": self.stopped, "resumed": self.resumed}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ExperimentRecord:
        inputs = data.get("model_inputs")
        return cls(id=data["id"], spec=ExperimentSpec.from_json(data["spec"]), environment=dict(data["environment"]),
                   points=[Point.from_json(p) for p in data["points"]],
                   model_only=[ModelPrediction(**m) for m in data.get("model_only", [])],
                   model_inputs=StageTimes.from_json(inputs) if inputs else None,
                   message_overhead_s=float(data.get("message_overhead_s", 0.0)), partial=bool(data.get("partial")),
                   missing=list(data.get("missing", [])), stopped=data.get("stopped"),
                   resumed=int(data.get("resumed", 0)))

    @classmethod
    def load(cls, exp_dir: Path) -> ExperimentRecord:
        return cls.from_json(json.loads((exp_dir / "summary.json").read_text()))

    def save(self, exp_dir: Path) -> None:
        (exp_dir / "summary.json").write_text(json.dumps(self.to_json(), indent=1))


def _medians(points: list[Point]) -> dict[str, Any]:
    """Median and [min, max] of a schedule's figures over its repetitions."""
    def spread(values: list[float]) -> tuple[float, float, float]:
        return statistics.median(values), min(values), max(values)

    bubbles = [p.bubble for p in points if p.bubble is not None]
    own = [p.bubble_own for p in points if p.bubble_own is not None]
    steps = [p.measured.step_time_s for p in points]
    peaks = [p.measured.peak_inflight_activation_bytes for p in points if p.measured.peak_inflight_activation_bytes]
    stretch = [max(p.measured.span_stretch_per_stage) for p in points if p.measured.span_stretch_per_stage]
    b = spread(bubbles) if bubbles else (float("nan"),) * 3
    st = spread(steps)
    return {"bubble": b[0], "bubble_range": [b[1], b[2]], "bubble_own": statistics.median(own) if own else None,
            "step_s": st[0], "step_range": [st[1], st[2]],
            "tokens_per_s": statistics.median(p.measured.tokens_per_s for p in points),
            "peak_bytes": max(peaks) if peaks else None, "stretch": statistics.median(stretch) if stretch else None,
            "runs": len(points), "repeated": sum(p.measured.repeated for p in points),
            "disturbed": sum(1 for p in points if p.measured.host_load and p.measured.host_load.disturbed),
            "late": sum(1 for p in points if not p.measured.lateness_ok)}


def _against(geo: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
    """geopipe against one baseline: bubble cut, step-time speed-up, memory multiple."""
    cut = 1 - geo["bubble"] / base["bubble"] if base["bubble"] and base["bubble"] > 0 else None
    memory = geo["peak_bytes"] / base["peak_bytes"] if geo["peak_bytes"] and base["peak_bytes"] else None
    return {"bubble_cut": cut, "speedup": base["step_s"] / geo["step_s"], "memory_multiple": memory}
