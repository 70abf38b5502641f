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
from testbed.run.summary import ScheduleSummary
from testbed.util.paths import DEFAULT_TOPOLOGY
from workloads.schedule import GeoPipeSizing

HEADLINE_SWEEPS = ("distance", "repeat")


@dataclass(kw_only=True, slots=True)
class ExperimentSpec:
    """What `testbed experiment` sweeps."""

    topology: str = DEFAULT_TOPOLOGY
    distances_km: list[float] = field(default_factory=lambda: [0, 100, 500, 1000, 2000])
    schedules: list[str] = field(default_factory=lambda: ["gpipe", "1f1b", "geopipe"])
    focus_km: float = 1000
    """Distance of the repetitions, the budget sweep and the Gantt chart."""
    repetitions: int = 3
    budgets_stash: list[int] = field(default_factory=lambda: [2, 3, 4])
    """Memory budgets for geopipe at the focus distance, in micro-batch stashes (measured at 0 km)."""
    rates_mbit: list[float] = field(default_factory=list)
    microbatch_counts: list[int] = field(default_factory=list)
    predict_km: list[float] = field(default_factory=lambda: [5000])
    """Model-only distances (what the machine does not emulate)."""
    microbatches: int = 64
    iterations: int = 4
    memory_budget: int | None = None
    """geopipe's budget in the distance sweep and repetitions (bytes per stage), None for none."""
    model: dict[str, Any] = field(default_factory=dict)
    results: str = "results"
    backend: str = "netns"
    switch: str = "auto"
    """Mininet's DC switch (backend mininet only)."""

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ExperimentSpec:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


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
    memory_budget: int | None
    rtt_s: float | None
    measured: ScheduleSummary
    predicted_bubble: float | None
    predicted_step_s: float | None
    run_dir: str
    label: str = ""
    """The run's name under runs/ (which planned run this is; what a resume skips)."""
    lossless_ok: bool = True
    """No packet was lost on a lossless link during the run."""
    lost_packets: int = 0
    daemon_restarts: int = 0

    @property
    def bubble(self) -> float | None:
        return self.measured.bubble_ratio

    @property
    def sizing(self) -> GeoPipeSizing | None:
        return self.measured.geopipe_sizing

    def to_json(self) -> dict[str, Any]:
        return {**{f.name: getattr(self, f.name) for f in fields(self)}, "measured": self.measured.to_json()}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Point:
        known = {f.name for f in fields(cls)}
        return cls(**{**{k: v for k, v in data.items() if k in known},
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
    """The model's one fitted parameter."""
    partial: bool = False
    """Stopped before every planned run was measured."""
    missing: list[str] = field(default_factory=list)
    """Labels of the planned runs not measured."""
    stopped: str | None = None
    """Why it stopped early (an error, or the signal)."""
    resumed: int = 0
    """How many times `--resume` continued it."""

    def headline_points(self, schedule: str | None = None, km: float | None = None) -> list[Point]:
        """The distance sweep and its repetitions at the sweep's own memory budget (optionally one schedule or
        one distance): what the main table, the headline and the distance plot show."""
        return [p for p in self.points if p.sweep in HEADLINE_SWEEPS and p.memory_budget == self.spec.memory_budget
                and (schedule is None or p.schedule == schedule) and (km is None or p.distance_km == km)]

    def sweep(self, name: str, schedule: str | None = None) -> list[Point]:
        return [p for p in self.points if p.sweep == name and (schedule is None or p.schedule == schedule)]

    def focus_table(self) -> dict[str, Any]:
        """Bubble ratios at the focus distance over repetitions: mean, spread, reduction of geopipe vs 1f1b."""
        focus = self.spec.focus_km
        by: dict[str, list[float]] = {}
        for p in self.headline_points(km=focus):
            if p.bubble is not None:
                by.setdefault(p.schedule, []).append(p.bubble)
        result: dict[str, Any] = {"distance_km": focus, "bubbles": by}
        if by.get("1f1b") and by.get("geopipe"):
            pairs = list(zip(by["1f1b"], by["geopipe"], strict=False))
            reductions = [1 - g / o for o, g in pairs]
            result.update(reduction_mean=statistics.mean(reductions), reduction_min=min(reductions),
                          reduction_max=max(reductions), repetitions=len(pairs))
        return result

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "spec": asdict(self.spec), "environment": self.environment,
                "points": [p.to_json() for p in self.points], "model_only": [asdict(m) for m in self.model_only],
                "model_inputs": asdict(self.model_inputs) if self.model_inputs else None,
                "message_overhead_s": self.message_overhead_s, "partial": self.partial, "missing": self.missing,
                "stopped": self.stopped, "resumed": self.resumed}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ExperimentRecord:
        inputs = data.get("model_inputs")
        return cls(id=data["id"], spec=ExperimentSpec.from_json(data["spec"]), environment=dict(data["environment"]),
                   points=[Point.from_json(p) for p in data["points"]],
                   model_only=[ModelPrediction(**m) for m in data.get("model_only", [])],
                   model_inputs=StageTimes(**inputs) if inputs else None,
                   message_overhead_s=float(data.get("message_overhead_s", 0.0)), partial=bool(data.get("partial")),
                   missing=list(data.get("missing", [])), stopped=data.get("stopped"),
                   resumed=int(data.get("resumed", 0)))

    @classmethod
    def load(cls, exp_dir: Path) -> ExperimentRecord:
        return cls.from_json(json.loads((exp_dir / "summary.json").read_text()))

    def save(self, exp_dir: Path) -> None:
        (exp_dir / "summary.json").write_text(json.dumps(self.to_json(), indent=1))
