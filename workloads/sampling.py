"""Compute times as measured, not as one number: each stage's per-micro-batch forward and backward times,
and draws from them (bootstrap, seeded) for the simulator, so that a plan or a prediction sees the spread
the pipeline will meet. A mean hides that a window sized for the average stalls on every slow micro-batch,
and one quantile flips the plan with the warm-up's luck; the expected step over a fixed set of draws moves
only as much as the measured distribution does.

Draws use common random numbers: draw i of every candidate plan uses the same micro-batch times, so two
candidates differ by what they schedule, not by their luck."""

from __future__ import annotations

import dataclasses
import random
import statistics
from dataclasses import asdict, dataclass
from typing import Any

DRAWS = 12
"""Draws per expected step: the mean over 12 bootstrap draws of 64 micro-batches varies by ~0.2 % between two
sets of measurements of the same compute (tests/test_sampling.py), well inside sizing's SAME_STEP."""
SEED = 4242


@dataclass(frozen=True, slots=True)
class ComputeSamples:
    """Per stage, the measured forward and backward time of each micro-batch (paired: entry i of both is one
    micro-batch)."""

    forward_s: list[list[float]]
    backward_s: list[list[float]]

    def __post_init__(self) -> None:
        if len(self.forward_s) != len(self.backward_s) or any(
                len(f) != len(b) or not f for f, b in zip(self.forward_s, self.backward_s, strict=True)):
            raise ValueError("compute samples: every stage needs the same number (> 0) of forward and backward times")

    @property
    def stages(self) -> int:
        return len(self.forward_s)

    def mean_forward(self) -> list[float]:
        return [statistics.mean(f) for f in self.forward_s]

    def mean_backward(self) -> list[float]:
        return [statistics.mean(b) for b in self.backward_s]

    def scaled(self, factors: list[float]) -> ComputeSamples:
        """Every time of stage s times factors[s] (e.g. a reference compute over the spans' mean)."""
        return ComputeSamples([[x * k for x in f] for f, k in zip(self.forward_s, factors, strict=True)],
                              [[x * k for x in b] for b, k in zip(self.backward_s, factors, strict=True)])

    def draws(self, microbatches: int, count: int = DRAWS, seed: int = SEED
              ) -> list[tuple[list[list[float]], list[list[float]]]]:
        """`count` draws of (forward, backward) per stage per micro-batch, drawn with replacement from the
        measured pairs; the same seed gives the same draws. Where every stage measured the same micro-batches
        (one run: entry i of every stage is the same micro-batch, computed at about the same time), a draw
        picks one entry for all stages at once, so a slow stretch of the host slows every stage together as
        it did (drawing each stage alone made waits up that the run did not have: +11 % on a 0 km step)."""
        rng = random.Random(seed)
        lengths = {len(f) for f in self.forward_s}
        joint = len(lengths) == 1
        out = []
        for _ in range(count):
            shared = [rng.randrange(len(self.forward_s[0])) for _ in range(microbatches)] if joint else []
            fwd, bwd = [], []
            for f, b in zip(self.forward_s, self.backward_s, strict=True):
                picks = shared if joint else [rng.randrange(len(f)) for _ in range(microbatches)]
                fwd.append([f[i] for i in picks])
                bwd.append([b[i] for i in picks])
            out.append((fwd, bwd))
        return out

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ComputeSamples:
        return cls([list(map(float, f)) for f in data["forward_s"]], [list(map(float, b)) for b in data["backward_s"]])


def from_spans(spans_per_stage: list[list[tuple[str, int, float]]], skip: int = 0) -> ComputeSamples:
    """Samples from each stage's (kind, micro-batch, seconds) F and B spans; the first `skip` micro-batches
    of each stage are left out (a warm-up's first ones pay for cold caches and the allocator)."""
    forward, backward = [], []
    for spans in spans_per_stage:
        f = {mb: sec for kind, mb, sec in spans if kind == "F"}
        b = {mb: sec for kind, mb, sec in spans if kind == "B"}
        mbs = sorted(set(f) & set(b))
        kept = mbs[skip:] if len(mbs) > skip else mbs
        forward.append([f[mb] for mb in kept])
        backward.append([b[mb] for mb in kept])
    return ComputeSamples(forward, backward)


def simulate_expected(schedule: Any, costs: Any, samples: ComputeSamples | None, microbatches: int,
                      draws: int = DRAWS) -> Any:
    """The simulator's prediction (workloads/simulate.py) averaged over `draws` draws of the measured compute
    (the means alone when `samples` is None): iteration time, per-stage compute, waits and ends are means,
    peaks the largest."""
    from workloads.simulate import Prediction, simulate

    if samples is None:
        return simulate(schedule, costs)
    runs = [simulate(schedule, dataclasses.replace(costs, forward_mb_s=f, backward_mb_s=b))
            for f, b in samples.draws(microbatches, draws)]
    n = len(runs)
    stages = len(runs[0].compute_s)

    def mean_of(field: str) -> list[float]:
        return [sum(getattr(r, field)[s] for r in runs) / n for s in range(stages)]

    iteration = sum(r.iteration_s for r in runs) / n
    compute = mean_of("compute_s")
    return Prediction(iteration_s=iteration, compute_s=compute, bubble_ratio=[1 - c / iteration for c in compute],
                      exposed_comm_s=mean_of("exposed_comm_s"),
                      peak_inflight_bytes=[max(r.peak_inflight_bytes[s] for r in runs) for s in range(stages)],
                      end_s=mean_of("end_s"))
