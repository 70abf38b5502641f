"""Planning on the measured distribution (workloads/sampling.py, workloads/sizing.py): draws are seeded,
the expected step is the mean over them, and two warm-ups of the same compute give the same plan where one
quantile used to flip it."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from workloads import schedule as S
from workloads.sampling import ComputeSamples, from_spans, simulate_expected
from workloads.simulate import Costs, simulate
from workloads.sizing import size_geopipe


def _warmup(seed: int, mean: float, cv: float, n: int = 62) -> ComputeSamples:
    """One warm-up's per-micro-batch F+B times (normal, `cv` spread), split 1:2 into forward and backward."""
    rng = random.Random(seed)
    totals = [max(0.2 * mean, rng.gauss(mean, cv * mean)) for _ in range(n)]
    return ComputeSamples([[t / 3 for t in totals]] * 2, [[2 * t / 3 for t in totals]] * 2)


def _plan(samples: ComputeSamples) -> S.GeoPipeSizing:
    return size_geopipe(2, 64, link_delay_s=[0.005], link_bytes_per_s=[125e6], activation_bytes=131072,
                        forward_s=samples.mean_forward(), backward_s=samples.mean_backward(),
                        stash_bytes=[1 << 20] * 2, samples=samples)


def test_draws_are_seeded_and_paired() -> None:
    samples = ComputeSamples([[0.001, 0.002, 0.003]], [[0.010, 0.020, 0.030]])
    assert samples.draws(8) == samples.draws(8)
    for fwd, bwd in samples.draws(8, count=3):
        assert all(b == pytest.approx(10 * f) for f, b in zip(fwd[0], bwd[0], strict=True))   # one micro-batch's pair
    assert samples.draws(8, seed=1) != samples.draws(8, seed=2)


def test_expected_step_without_spread_is_the_plain_simulation() -> None:
    flat = ComputeSamples([[0.01] * 8] * 2, [[0.02] * 8] * 2)
    sched = S.build("1f1b-prefetch", 2, 16)
    costs = Costs([0.01] * 2, [0.02] * 2, [0.005], [125e6], 131072, 1 << 20)
    assert simulate_expected(sched, costs, flat, 16).iteration_s == pytest.approx(simulate(sched, costs).iteration_s)


def test_samples_from_spans_skip_the_cold_micro_batches() -> None:
    spans = [[("F", mb, 0.1 if mb < 2 else 0.01) for mb in range(6)] + [("B", mb, 0.02) for mb in range(6)]]
    s = from_spans(spans, skip=2)
    assert s.forward_s == [[0.01] * 4] and s.backward_s == [[0.02] * 4]


@pytest.mark.parametrize("mean", [0.010, 0.013, 0.036])
def test_two_warmups_of_the_same_compute_plan_alike(mean: float) -> None:
    """At 1000 km (5 ms, 128 KiB at 1 Gbit/s: 12.1 ms there and back) with per-micro-batch compute of 13 ms
    (the demo's machine of 2026-12-03, where the plan flipped between 1 and 2 extra with the warm-up), 10 ms
    and 36 ms (this machine), twelve warm-ups with a 10 % spread each give one plan."""
    plans = Counter(_plan(_warmup(seed, mean, 0.10)).extra_inflight for seed in range(12))
    assert len(plans) == 1, plans


def test_the_plan_says_why() -> None:
    plan = _plan(_warmup(0, 0.013, 0.10))
    assert plan.extra_inflight == (1, 0)
    assert plan.why[0].startswith("1 extra: with 0 the step would be +") and "12 draws" in plan.why[0]
