"""Schedules as data: golden action lists, validation, and the dry-run simulator (deadlocks, timing)."""

from pathlib import Path

import pytest

from workloads import schedule as S
from workloads.memory import MemoryBudget, footprint_bytes
from workloads.sampling import ComputeSamples
from workloads.simulate import Costs, Deadlock, simulate
from workloads.sizing import lookaheads, size_geopipe

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


@pytest.mark.parametrize("stages", [2, 3, 4, 8])
def test_all_schedules_deadlock_free_and_inherent_bubble(stages: int) -> None:
    m = 8
    for name in S.SCHEDULES:
        sizing = _size(stages, m, [0.0] * (stages - 1)) if name == "geopipe" else None
        pred = simulate(S.build(name, stages, m, sizing), _costs(0.0, stages))
        assert pred.mean_bubble_ratio >= (stages - 1) / (m + stages - 1) - 0.02, name


def _size(stages: int, m: int, delays: list[float], *, budget: list[int] | None = None,
          samples: ComputeSamples | None = None, compute: float = 0.03) -> S.GeoPipeSizing:
    return size_geopipe(stages, m, link_delay_s=delays, link_bytes_per_s=[125e6] * (stages - 1),
                        activation_bytes=131072, forward_s=[compute / 3] * stages, backward_s=[2 * compute / 3] * stages,
                        stash_bytes=[1 << 20] * stages, budget_bytes=budget, samples=samples)


def _spread(stages: int, compute: float, spread: float, n: int = 32) -> ComputeSamples:
    """Per-micro-batch times around `compute` (F+B), half of them `spread` slower, half as much faster."""
    totals = [compute * (1 + spread if i % 2 else 1 - spread) for i in range(n)]
    return ComputeSamples([[t / 3 for t in totals]] * stages, [[2 * t / 3 for t in totals]] * stages)


def test_prefetch_is_1f1b_order_and_memory_with_early_receives() -> None:
    one, pre = S.build("1f1b", 4, 8), S.build("1f1b-prefetch", 4, 8)
    for a, b in zip(one, pre, strict=True):
        compute = [x for x in a if x.op in (S.Op.FORWARD, S.Op.BACKWARD)]
        assert compute == [x for x in b if x.op in (S.Op.FORWARD, S.Op.BACKWARD)]      # the same order
    costs = Costs([0.01] * 4, [0.02] * 4, [0.005] * 3, [125e6] * 3, activation_bytes=131072, stash_bytes=1 << 20)
    jit, early = simulate(one, costs), simulate(pre, costs)
    assert early.iteration_s < jit.iteration_s                    # no receive posted late: no extra round trip
    for s in range(4):                                            # stashes as 1F1B; buffers: the early receives
        assert early.peak_inflight_bytes[s] == footprint_bytes(
            s, 4, 8, extra=0, lookahead=S.GeoPipeSizing.prefetch(4, 8).recv_lookahead[s], stash_bytes=1 << 20,
            activation_bytes=131072)


def test_jit_receive_costs_a_round_trip_and_geopipe_hides_it() -> None:
    m, d = 16, 0.005
    costs = _costs(d)
    base = simulate(S.build("1f1b", 2, m), _costs(0.0))
    far = simulate(S.build("1f1b", 2, m), costs)
    prefetch = simulate(S.build("1f1b-prefetch", 2, m), costs)
    geo = simulate(S.build("geopipe", 2, m, _size(2, m, [d])), costs)
    assert far.iteration_s > base.iteration_s + (m - 2) * 2 * d * 0.8      # ~ an extra RTT per steady step
    assert geo.mean_bubble_ratio < 0.5 * prefetch.mean_bubble_ratio < 0.5 * far.mean_bubble_ratio
    assert geo.peak_inflight_bytes[0] > prefetch.peak_inflight_bytes[0]     # paid for in memory


CASES = [(3, 0), (3, 1), (4, 0), (4, 1), (4, 2), (8, 0), (8, 3), (8, 6)]


def _golden_case(stages: int, long_link: int, m: int = 24, d: float = 0.01) -> tuple[str, dict[str, float]]:
    """One long link (10 ms one-way) at `long_link`, the others intra-DC: the plan and each schedule's
    simulated step, also with every link at 0 km (the floor the plan aims for)."""
    delays = [0.0] * (stages - 1)
    delays[long_link] = d
    costs = _costs_split(delays)
    plan = _size(stages, m, delays, compute=0.015)
    near = simulate(S.build("geopipe", stages, m, _size(stages, m, [0.0] * (stages - 1), compute=0.015)),
                    _costs_split([0.0] * (stages - 1)))
    steps = {name: simulate(S.build(name, stages, m, plan if name == "geopipe" else None), costs).iteration_s
             for name in ("1f1b", "1f1b-prefetch", "geopipe")}
    steps["geopipe at 0 km"] = near.iteration_s
    text = (f"stages {stages}, long link after stage {long_link}, m {m}\n"
            f"extra {' '.join(map(str, plan.extra_inflight))}\nlookahead {' '.join(map(str, plan.recv_lookahead))}\n"
            f"bound {' '.join(b.replace(' ', '-') for b in plan.bound)}\n"
            + "".join(f"step {name.replace(' ', '-')} {value:.4f}\n" for name, value in steps.items()))
    return text, steps


def _costs_split(delays: list[float]) -> Costs:
    n = len(delays) + 1
    return Costs([0.005] * n, [0.010] * n, delays, [125e6] * (n - 1), activation_bytes=131072, stash_bytes=1 << 20)


@pytest.mark.parametrize(("stages", "long_link"), CASES)
def test_plan_over_the_whole_pipeline_hides_one_long_link_anywhere(stages: int, long_link: int) -> None:
    """Golden plans (tests/golden/plan-p<stages>-l<link>.txt), and their intent: geopipe hides the long link
    in the steady state: its step exceeds the same pipeline's at 0 km by at most what filling and draining the
    pipeline must pay (one round trip, plus one one-way delay for the first receive's hand-shake), where
    1f1b-prefetch pays far more."""
    text, steps = _golden_case(stages, long_link)
    golden = GOLDEN / f"plan-p{stages}-l{long_link}.txt"
    assert text == golden.read_text(), f"regenerate with: python tests/test_schedule.py, then read the diff of {golden}"
    round_trip = 2 * (0.01 + 131072 / 125e6)
    assert steps["geopipe"] - steps["geopipe at 0 km"] <= round_trip + 0.01
    assert steps["1f1b-prefetch"] > 1.15 * steps["geopipe"]
    assert steps["1f1b"] > steps["1f1b-prefetch"]


def test_several_long_links_are_all_hidden() -> None:
    """4dc-ring with 8 stages (two per DC): three long links of different lengths. The per-stage plan of 0.2
    deadlocked here; the whole-pipeline plan hides all three."""
    delays = [0, 0.0025, 0, 0.006, 0, 0.004, 0]
    plan = _size(8, 32, delays, compute=0.015)
    far = simulate(S.build("geopipe", 8, 32, plan), _costs_split(delays))
    near = simulate(S.build("geopipe", 8, 32, _size(8, 32, [0.0] * 7, compute=0.015)), _costs_split([0.0] * 7))
    prefetch = simulate(S.build("1f1b-prefetch", 8, 32), _costs_split(delays))
    fill_and_drain = 2 * (0.0025 + 0.006 + 0.004) + 6 * 131072 / 125e6      # one round trip over all three
    assert far.iteration_s - near.iteration_s <= fill_and_drain + 0.0025 + 0.006 + 0.004
    assert prefetch.iteration_s > far.iteration_s + 5 * fill_and_drain
    assert all(b <= a + 1 for a, b in zip(plan.extra_inflight, plan.extra_inflight[1:], strict=False))


def test_memory_budget_bounds_geopipe_and_says_so() -> None:
    stash, act = 1 << 20, 131072
    budget = MemoryBudget.parse("1f1b+1").per_stage(2, 16, [stash, stash], act)
    plan = _size(2, 16, [0.02], budget=budget)
    assert plan.extra_inflight[0] == 1 and plan.bound[0] == "memory budget" and plan.wanted_extra[0] > 1
    pred = simulate(S.build("geopipe", 2, 16, plan), _costs(0.02))
    assert pred.peak_inflight_bytes[0] <= budget[0] and pred.peak_inflight_bytes[0] == plan.footprint_bytes[0]
    unbounded = simulate(S.build("geopipe", 2, 16, _size(2, 16, [0.02])), _costs(0.02))
    assert unbounded.peak_inflight_bytes[0] > budget[0]                    # the budget really binds
    with pytest.raises(S.ScheduleError, match="below what 1F1B order"):
        _size(2, 16, [0.02], budget=[stash, stash])


@pytest.mark.parametrize("stages", [3, 4])
def test_memory_budget_bounds_every_stage_of_a_longer_pipeline(stages: int) -> None:
    """Each stage's look-ahead under a budget follows from the stage before it (a 3-stage plan with a budget once
    read the extra count of a stage not planned yet and crashed)."""
    stash, act = 1 << 20, 131072
    budget = MemoryBudget.parse("1f1b+1").per_stage(stages, 16, [stash] * stages, act)
    plan = _size(stages, 16, [0.02] * (stages - 1), budget=budget)
    assert all(f <= b for f, b in zip(plan.footprint_bytes, budget, strict=True))
    assert "memory budget" in plan.bound
    pred = simulate(S.build("geopipe", stages, 16, plan), _costs(0.02, stages))
    assert all(p <= b for p, b in zip(pred.peak_inflight_bytes, budget, strict=True))


def test_memory_budget_parses_bytes_and_relative() -> None:
    assert MemoryBudget.parse("1f1b+2") == MemoryBudget(extra_microbatches=2)
    assert MemoryBudget.parse("1F1B") == MemoryBudget(extra_microbatches=0)
    assert MemoryBudget.parse("4096") == MemoryBudget(bytes=4096)
    for bad in ("1f1b-1", "lots", "0"):
        with pytest.raises(ValueError, match="memory budget"):
            MemoryBudget.parse(bad)
    relative = MemoryBudget.parse("1f1b+1").per_stage(3, 8, [100, 100, 100], 10)
    assert relative == [(3 + 1) * (100 + 10), (2 + 1) * (100 + 10) + 4 * 10, (1 + 1) * 100 + 3 * 10]


def test_slack_comes_from_the_measured_spread() -> None:
    """Compute whose micro-batches run 40 % faster or slower than their mean needs more micro-batches in flight
    than the mean alone says (a window sized for the mean stalls on the fast ones); the plan says how many are
    owed to the spread, none when there is none, and why it chose its count."""
    steady = _size(2, 32, [0.01], compute=0.011, samples=_spread(2, 0.011, 0.0))
    spread = _size(2, 32, [0.01], compute=0.011, samples=_spread(2, 0.011, 0.4))
    assert steady.slack == (0, 0)
    assert spread.wanted_extra[0] > steady.wanted_extra[0] and spread.slack[0] == (
        spread.wanted_extra[0] - steady.wanted_extra[0])
    assert "expected over 12 draws" in spread.why[0] and spread.why[1].startswith("last stage")


def test_worker_refuses_a_schedule_the_simulator_shows_deadlocking() -> None:
    """A stage holding two more extra micro-batches than the stage before it waits for an activation that
    stage produces only after a gradient it waits for: the worker refuses such a plan at once."""
    from workloads.records import WorkerConfig
    from workloads.runs import refuse_deadlock

    delays = [0, 0.0025, 0, 0.006, 0, 0.004, 0]
    rates = [10e9, 1e9, 10e9, 1e9, 10e9, 1e9, 10e9]
    cfg = WorkerConfig(rank=0, world=8, master_addr="x", master_port=1, schedules=["geopipe"], microbatches=16,
                       link_delay_s=delays, link_rate_bps=rates)
    extra = (0, 3, 0, 6, 0, 3, 0, 0)
    bad = S.GeoPipeSizing(extra, tuple(lookaheads(8, 16, list(extra))), extra, ("x",) * 8)
    with pytest.raises(RuntimeError, match="would deadlock"):
        refuse_deadlock(S.build("geopipe", 8, 16, bad), cfg, [0.004] * 8, 32768)
    good = size_geopipe(8, 16, link_delay_s=delays, link_bytes_per_s=[r / 8 for r in rates], activation_bytes=32768,
                        forward_s=[0.002] * 8, backward_s=[0.002] * 8, stash_bytes=[10**6] * 8)
    refuse_deadlock(S.build("geopipe", 8, 16, good), cfg, [0.004] * 8, 32768)


if __name__ == "__main__":                       # regenerate the golden plans (then read the diff)
    for stages, link in CASES:
        (GOLDEN / f"plan-p{stages}-l{link}.txt").write_text(_golden_case(stages, link)[0])
