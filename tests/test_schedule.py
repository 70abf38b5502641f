"""Schedules as data: golden action lists, validation, and the dry-run simulator (deadlocks, timing)."""

from pathlib import Path

import pytest

from workloads import schedule as S
from workloads.simulate import Costs, Deadlock, simulate

GOLDEN = Path(__file__).parent / "golden"
GEO3 = S.GeoPipeSizing(extra_inflight=(2, 1, 0), recv_lookahead=(0, 4, 2), wanted_extra=(2, 1, 0),
                 bound=("hidden", "hidden", "no link"))


@pytest.mark.parametrize(("name", "file", "geo"), [("gpipe", "gpipe-p3-m4.txt", None), ("1f1b", "1f1b-p3-m4.txt", None),
                                                    ("geopipe", "geopipe-p3-m6.txt", GEO3)])
def test_golden_action_lists(name: str, file: str, geo: S.GeoPipeSizing | None) -> None:
    m = 6 if geo else 4
    assert S.to_text(S.build(name, 3, m, geo)) == (GOLDEN / file).read_text()
    assert S.from_text((GOLDEN / file).read_text()) == S.build(name, 3, m, geo)


def test_1f1b_matches_pytorch_warmup_shape() -> None:
    sched = S.one_f_one_b(4, 8)
    for s, acts in enumerate(sched):
        fwd_before_first_bwd = [a for a in acts[:[str(a) for a in acts].index("B0")] if a.op is S.Op.FORWARD]
        assert len(fwd_before_first_bwd) == min(4 - s, 8)     # p-1-s warm-up forwards, then one more before B0


@pytest.mark.parametrize(("text", "error"), [
    ("F0 SF0 F1 SF1 RB0 B0 RB1 B1\nRF0 F0 B0 SB0 F1 B1 SB1", "F1 needs RF1 posted before it"),
    ("F0 SF0 RB0 B0\nRF0 B0 F0 SB0", "B0 before F0"),
    ("F0 SF0 RB0 B0 B0\nRF0 F0 B0 SB0", "repeated"),
    ("F0 RB0 B0\nRF0 F0 B0 SB0", "SF0 missing"),
])
def test_validator_names_rank_and_problem(text: str, error: str) -> None:
    with pytest.raises(S.ScheduleError, match=error):
        S.validate(S.from_text(text), 1 if "F1" not in text else 2)


def _costs(delay: float, stages: int = 2) -> Costs:
    return Costs([0.01] * stages, [0.02] * stages, [delay] * (stages - 1), [125e6] * (stages - 1),
                 activation_bytes=131072, stash_bytes=1 << 20)


def test_simulator_finds_deadlock() -> None:
    # rank 0 waits for gradient 1 before sending activation 1 that rank 1 needs first.
    bad = S.from_text("F0 SF0 F1 RB1 B1 SF1 RB0 B0\nRF0 F0 RF1 F1 B1 SB1 B0 SB0")
    S.validate(bad, 2)
    with pytest.raises(Deadlock, match="rank 0 at B1.*rank 1 at F1"):
        simulate(bad, _costs(0.005))


@pytest.mark.parametrize("stages", [2, 3, 4])
def test_all_schedules_deadlock_free_and_inherent_bubble(stages: int) -> None:
    m = 8
    for name in ("gpipe", "1f1b"):
        pred = simulate(S.build(name, stages, m), _costs(0.0, stages))
        assert pred.mean_bubble_ratio >= (stages - 1) / (m + stages - 1) - 0.02


def test_jit_receive_costs_a_round_trip_and_geopipe_hides_it() -> None:
    m, d = 16, 0.005
    costs = _costs(d)
    base = simulate(S.build("1f1b", 2, m), _costs(0.0))
    far = simulate(S.build("1f1b", 2, m), costs)
    geo_plan = S.size_geopipe(2, m, link_delay_s=[d], link_bytes_per_s=[125e6], activation_bytes=131072,
                              compute_s=[0.03, 0.03], stash_bytes=[1 << 20] * 2, memory_budget=None)
    geo = simulate(S.build("geopipe", 2, m, geo_plan), costs)
    assert far.iteration_s > base.iteration_s + (m - 2) * 2 * d * 0.8      # ~ an extra RTT per steady step
    assert geo.mean_bubble_ratio < 0.35 * far.mean_bubble_ratio          # m=16: 0.08 vs 0.30 (fill/drain stays)
    assert geo.peak_inflight_bytes[0] > far.peak_inflight_bytes[0]          # paid for in memory


def test_memory_budget_bounds_geopipe_and_says_so() -> None:
    stash = 1 << 20
    plan = S.size_geopipe(2, 16, link_delay_s=[0.02], link_bytes_per_s=[125e6], activation_bytes=131072,
                          compute_s=[0.03, 0.03], stash_bytes=[stash, stash], memory_budget=3 * stash)
    assert plan.extra_inflight[0] == 1 and plan.bound[0] == "memory budget" and plan.wanted_extra[0] > 1
    pred = simulate(S.build("geopipe", 2, 16, plan), _costs(0.02))
    assert pred.peak_inflight_bytes[0] <= 3 * stash + 131072


def test_worker_refuses_a_schedule_the_simulator_shows_deadlocking() -> None:
    """GeoPipe sized per stage for 8 stages across 4 DCs (what 4dc-ring gives) deadlocks today (its sizing
    is not planned over the whole pipeline); the worker says so at once instead of hanging until time-out."""
    from workloads.records import WorkerConfig
    from workloads.worker import refuse_deadlock

    delays = [0, 0.0025, 0, 0.006, 0, 0.004, 0]
    rates = [10e9, 1e9, 10e9, 1e9, 10e9, 1e9, 10e9]
    cfg = WorkerConfig(rank=0, world=8, master_addr="x", master_port=1, schedule="geopipe", microbatches=16,
                       link_delay_s=delays, link_rate_bps=rates)
    sizing = S.size_geopipe(8, 16, link_delay_s=delays, link_bytes_per_s=[r / 8 for r in rates],
                            activation_bytes=32768, compute_s=[0.004] * 8, stash_bytes=[10**6] * 8, memory_budget=None)
    with pytest.raises(RuntimeError, match="would deadlock"):
        refuse_deadlock(S.build("geopipe", 8, 16, sizing), cfg, [0.004] * 8, 32768)
    two = S.size_geopipe(2, 16, link_delay_s=[0.005], link_bytes_per_s=[1.25e8], activation_bytes=32768,
                         compute_s=[0.004] * 2, stash_bytes=[10**6] * 2, memory_budget=None)
    refuse_deadlock(S.build("geopipe", 2, 16, two), WorkerConfig(
        rank=0, world=2, master_addr="x", master_port=1, schedule="geopipe", microbatches=16, link_delay_s=[0.005],
        link_rate_bps=[1e9]), [0.004] * 2, 32768)
