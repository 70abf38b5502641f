"""Where a run's compute comes from: the model's arithmetic, or time from a stated cost table.

  real              the model's forward and backward on this CPU (numerics, gradient equality);
  replay            every F and B span becomes a wait to a deadline, its length from a table profiled from
                    the real model on this host at the start of the run (each stage alone: a quiet pass),
                    saved with the run as compute.json;
  replay:FILE       the same from a table saved by an earlier run (on any machine);
  PROFILE           the same from a named deployment's profile (profiles/<name>.yaml, workloads/profile.py):
                    its accelerator's per-layer times, its activation and stash bytes, the bytes on the wire
                    scaled by each link's rate scale so compute, transfer and round trip keep their ratios.

Everything else stays real: the schedule, the memory budget (accounted from the table's bytes), the messages
(of the table's sizes, over the same transport and emulated links). Torch-free: runners read it cheaply.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from workloads.errors import TestbedError

REAL, REPLAY, PROFILE = "real", "replay", "profile"


class ComputeError(TestbedError, ValueError):
    """A --compute value or a cost table that cannot be used; the message names the file or value and the fix."""


@dataclass(frozen=True, slots=True)
class PhaseCost:
    """One phase (F or B) of one stage: the time each replayed span takes, and the spread it was taken from."""

    median_s: float
    p10_s: float
    p90_s: float
    samples: int = 0
    """Spans measured (0: stated by a deployment profile)."""

    @classmethod
    def of(cls, values: list[float]) -> PhaseCost:
        ordered = sorted(values)
        at = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]  # noqa: E731
        return cls(statistics.median(ordered), at(0.1), at(0.9), len(ordered))

    @classmethod
    def stated(cls, seconds: float) -> PhaseCost:
        return cls(seconds, seconds, seconds, 0)


@dataclass(frozen=True, slots=True)
class StageCost:
    """One pipeline stage's compute per micro-batch and what it keeps for the backward."""

    forward: PhaseCost
    backward: PhaseCost
    stash_bytes: int
    """In-flight bytes per pending micro-batch (workloads/memory.py's stash: saved tensors, input, output)."""

    @property
    def fb_s(self) -> float:
        return self.forward.median_s + self.backward.median_s


@dataclass(frozen=True, slots=True)
class CostTable:
    """Per stage, the time of a forward and a backward of one micro-batch, and the bytes it moves and keeps."""

    source: str
    """`host` (profiled from the real model here) or `profile:<name>` (a deployment profile)."""
    description: str
    stages: list[StageCost]
    activation_bytes: int
    """One micro-batch's activation (or its gradient) between two stages, in the deployment's bytes."""
    microbatch_size: int
    rate_scale: list[float] = field(default_factory=list)
    """Per link between stage s and s+1: the deployment's rate over the emulated one; the bytes on the wire
    are `activation_bytes / rate_scale[s]`. Empty: 1 everywhere (the model's own messages)."""
    hbm_bytes: int | None = None
    """The accelerator's memory, where a profile states it."""
    resident_bytes: int | None = None
    """Per stage, what is not in flight (weights, gradients, optimizer state), where a profile states it."""
    tokens_per_microbatch: int = 0
    """Tokens one micro-batch carries (sequences x sequence length): what tokens/s counts."""

    def __post_init__(self) -> None:
        if not self.stages:
            raise ComputeError("a cost table needs at least one stage")
        if self.activation_bytes <= 0:
            raise ComputeError("a cost table needs activation_bytes > 0")

    @property
    def host_fb_s(self) -> float:
        """The median stage's F+B per micro-batch: the figure quoted beside every timing."""
        return statistics.median(s.fb_s for s in self.stages)

    def scale(self, link: int) -> float:
        return self.rate_scale[link] if self.rate_scale else 1.0

    def wire_bytes(self, link: int) -> int:
        """Bytes one message carries over the emulated link between stage `link` and `link + 1`."""
        return max(4, int(round(self.activation_bytes / self.scale(link) / 4)) * 4)

    def with_scale(self, rate_scale: list[float]) -> CostTable:
        return CostTable(self.source, self.description, list(self.stages), self.activation_bytes,
                         self.microbatch_size, list(rate_scale), self.hbm_bytes, self.resident_bytes,
                         self.tokens_per_microbatch)

    def slowed(self, k: float) -> CostTable:
        """Every span k times longer (a run in slow motion, testbed/run/dilation.py)."""
        def phase(p: PhaseCost) -> PhaseCost:
            return PhaseCost(p.median_s * k, p.p10_s * k, p.p90_s * k, p.samples)
        stages = [StageCost(phase(s.forward), phase(s.backward), s.stash_bytes) for s in self.stages]
        return CostTable(self.source, self.description, stages, self.activation_bytes, self.microbatch_size,
                         list(self.rate_scale), self.hbm_bytes, self.resident_bytes, self.tokens_per_microbatch)

    def reference_s(self, stage: int, microbatches: int) -> float:
        """One iteration's compute on `stage` with no communication: the replayed run's yardstick."""
        return microbatches * self.stages[stage].fb_s

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CostTable:
        def phase(d: dict[str, Any]) -> PhaseCost:
            return PhaseCost(float(d["median_s"]), float(d["p10_s"]), float(d["p90_s"]), int(d.get("samples", 0)))
        stages = [StageCost(phase(s["forward"]), phase(s["backward"]), int(s["stash_bytes"])) for s in data["stages"]]
        return cls(str(data["source"]), str(data.get("description", "")), stages, int(data["activation_bytes"]),
                   int(data.get("microbatch_size", 1)), [float(x) for x in data.get("rate_scale", [])],
                   data.get("hbm_bytes"), data.get("resident_bytes"), int(data.get("tokens_per_microbatch", 0)))

    @classmethod
    def load(cls, path: str | Path) -> CostTable:
        path = Path(path)
        try:
            return cls.from_json(json.loads(path.read_text()))
        except FileNotFoundError:
            raise ComputeError(f"{path}: no such cost table; give results/<run-id>/compute.json of a replayed run") from None
        except OSError as exc:
            raise ComputeError(f"{path}: cannot read it as a cost table ({exc.strerror}); give the compute.json file "
                               "of a replayed run, e.g. results/<run-id>/compute.json") from None
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise ComputeError(f"{path}: not a cost table ({type(exc).__name__}: {exc}); "
                               "give the compute.json a replayed run wrote") from None

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(self.to_json(), indent=1))


@dataclass(frozen=True, slots=True)
class ComputeMode:
    """What `--compute` chose: real, replay (profiled here or from FILE) or a deployment profile."""

    kind: str
    source: str = ""
    """replay: the table's file (empty: profiled at the run's start); profile: the profile's file."""

    @property
    def text(self) -> str:
        if self.kind == REPLAY and self.source:
            return f"replay:{self.source}"
        return self.source if self.kind == PROFILE else self.kind

    @property
    def timed(self) -> bool:
        """Compute is time from a table (no arithmetic runs)."""
        return self.kind != REAL

    def to_json(self) -> str:
        return self.text

    @classmethod
    def from_text(cls, text: str) -> ComputeMode:
        """As recorded (no file checks: a summary read on another machine names files it may not have)."""
        if text in (REAL, REPLAY):
            return cls(text)
        if text.startswith("replay:"):
            return cls(REPLAY, text.removeprefix("replay:"))
        return cls(PROFILE, text)


def profile_table(values: dict[int, tuple[list[float], list[float], int]], activation_bytes: int,
                  microbatch_size: int, tokens_per_microbatch: int, description: str) -> CostTable:
    """The host's table from each stage's measured spans: {stage: (forward times, backward times, stash bytes)}."""
    stages = [StageCost(PhaseCost.of(f), PhaseCost.of(b), stash) for _, (f, b, stash) in sorted(values.items())]
    return CostTable("host", description, stages, activation_bytes, microbatch_size,
                     tokens_per_microbatch=tokens_per_microbatch)
