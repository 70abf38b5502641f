"""GeoPipe's shape planner (workloads/shapes.py): at a fixed token budget it searches every (b, s) of the grid
that divides the budget, keeps the modelled best and runner-up per schedule, never chooses a shape whose 1F1B
in-flight memory does not fit the HBM, sizes geopipe's dN under that memory, and gives the baselines the same
search; `testbed plan --tokens` prints it from a shipped profile on a shipped topology."""

from __future__ import annotations

import pytest
from conftest import run_cli

from testbed.run.shapeplan import plan_topology_shapes, render_shape_plans
from workloads.compute import CostTable, PhaseCost, StageCost
from workloads.schedule import ScheduleError
from workloads.shapes import Links, ShapeOutcome, ShapePlan, ShapeSpace, evaluate, plan_shapes

GIB = 2**30
STAGES = 4


def per_token_table(b: int, s: int, *, hbm: int = 64 * GIB, per_mb_s: float = 2e-3, fixed_s: float = 0.0) -> CostTable:
    """Compute linear in the tokens (plus a fixed cost per micro-batch: a kernel launch, a small GEMM's
    inefficiency), stash and activation likewise: per stage, per micro-batch."""
    tokens = b * s
    f = fixed_s + per_mb_s * tokens / 1024
    stages = [StageCost(PhaseCost.stated(f), PhaseCost.stated(2 * f), 16 * 2**20 * tokens // 1024) for _ in range(STAGES)]
    return CostTable("test", "per token", stages, 2**20 * tokens // 1024, b, [], hbm, 8 * GIB, tokens)


def far(delay_s: float) -> Links:
    """Stage 1 -> 2 crosses a long link; the others are a fast fabric."""
    return Links([0.0, delay_s, 0.0], [50e9, 50e9, 50e9])


def test_the_grid_keeps_the_shapes_that_divide_the_budget() -> None:
    space = ShapeSpace((1, 2, 3), (1024, 4096))
    assert space.shapes(8192) == [(1, 1024, 8), (1, 4096, 2), (2, 1024, 4), (2, 4096, 1)]
    assert (3, 1024, 2) not in space.shapes(8192)          # 3 x 1024 does not divide 8192
    with pytest.raises(ScheduleError, match="divides 1000 tokens"):
        plan_shapes("1f1b", 1000, per_token_table, far(0.0), space)
    with pytest.raises(ScheduleError, match="models"):
        plan_shapes("gpipe", 8192, per_token_table, far(0.0), space)


def test_best_and_runner_up_are_the_two_fastest_feasible_shapes() -> None:
    plan = plan_shapes("1f1b", 2**17, lambda b, s: per_token_table(b, s, fixed_s=1e-3), far(0.005))
    steps = sorted(o.step_s for o in plan.outcomes if o.feasible)
    assert plan.best.step_s == steps[0] and plan.runner_up.step_s == steps[1]
    assert all(o.microbatches * o.microbatch_size * o.seq_len == 2**17 for o in plan.outcomes)
    assert ShapePlan.from_json(plan.to_json()) == plan


def test_a_long_link_moves_1f1b_to_fewer_larger_microbatches_and_geopipe_stays_small() -> None:
    """With a fixed cost per micro-batch, many small micro-batches cost compute; at 0 km their shorter fill and
    drain wins. Far away, 1F1B pays a round trip per micro-batch it cannot hide: it moves to fewer, larger ones.
    geopipe hides the round trip with dN in flight and keeps the short fill and drain."""
    costs = lambda b, s: per_token_table(b, s, fixed_s=0.2e-3)   # noqa: E731
    near = {sch: plan_shapes(sch, 2**17, costs, far(0.0)).best for sch in ("1f1b", "geopipe")}
    away = {sch: plan_shapes(sch, 2**17, costs, far(0.02)).best for sch in ("1f1b", "geopipe")}
    assert away["1f1b"].microbatches < near["1f1b"].microbatches
    assert away["geopipe"].microbatches > away["1f1b"].microbatches
    assert away["geopipe"].step_s < 0.9 * away["1f1b"].step_s
    assert max(away["geopipe"].extra) >= 1 and near["geopipe"].extra == (0,) * STAGES


def test_a_shape_whose_1f1b_memory_does_not_fit_the_hbm_is_never_chosen() -> None:
    """With the HBM only just above the resident state, the large micro-batches that 1F1B would prefer far away
    cannot hold 1F1B's own in-flight stash: they are refused with the reason, and the choice is one that fits."""
    tight = lambda b, s: per_token_table(b, s, hbm=8 * GIB + 600 * 2**20, fixed_s=0.2e-3)   # noqa: E731
    free = lambda b, s: per_token_table(b, s, fixed_s=0.2e-3)                                # noqa: E731
    unbounded = plan_shapes("1f1b", 2**17, free, far(0.02)).best
    bounded = plan_shapes("1f1b", 2**17, tight, far(0.02))
    refused = [o for o in bounded.outcomes if not o.feasible]
    assert refused and all("over the" in o.why for o in refused)
    assert bounded.best.microbatch_size * bounded.best.seq_len < unbounded.microbatch_size * unbounded.seq_len
    assert bounded.best.peak_bytes <= 8 * GIB + 600 * 2**20


def test_geopipes_dn_is_sized_under_the_same_memory() -> None:
    """Room for 1F1B's stash at b x s = 1024 and about one micro-batch more: far away geopipe wants several in
    flight, gets what fits, and its peak stays within the HBM."""
    hbm = 8 * GIB + 100 * 2**20
    geo = plan_shapes("geopipe", 2**15, lambda b, s: per_token_table(b, s, hbm=hbm, fixed_s=0.2e-3), far(0.02)).best
    roomy = plan_shapes("geopipe", 2**15, lambda b, s: per_token_table(b, s, fixed_s=0.2e-3), far(0.02)).best
    assert geo.peak_bytes <= hbm < roomy.peak_bytes
    assert sum(geo.extra) < sum(roomy.extra)


def test_geopipe_at_zero_km_is_1f1b_with_early_receives() -> None:
    table = per_token_table(1, 1024)
    geo = evaluate("geopipe", 1, 1024, 32, table, far(0.0))
    pre = evaluate("1f1b-prefetch", 1, 1024, 32, table, far(0.0))
    assert geo.extra == (0,) * STAGES and geo.step_s == pytest.approx(pre.step_s)
    assert ShapeOutcome.from_json(geo.to_json()) == geo


def test_the_shipped_13b_profile_on_three_regions_prints_each_schedules_choice() -> None:
    shapes = plan_topology_shapes("topologies/3dc-8stages.yaml", "llama2-13b-910b-tp8", 2**18,
                                  space=ShapeSpace((1, 2, 4, 8), (2048, 4096)))
    assert shapes.stages == 8
    assert [d > 0 for d in shapes.links.delay_s] == [False, False, True, False, False, True, False]
    assert shapes.links.bytes_per_s[2] == pytest.approx(400e9 / 8)         # the OTN at its real 400G
    geo, base = shapes.plan("geopipe").best, shapes.plan("1f1b").best
    assert geo.step_s < base.step_s
    text = render_shape_plans(shapes)
    assert "geopipe" in text and "runner-up" in text and "dN [" in text


def test_the_cli_prints_the_shape_plan_and_refuses_a_bad_budget() -> None:
    done = run_cli("plan", "3dc-8stages", "--tokens", "64Ki", "--compute", "gpt-7b-h100")
    assert "shape plan: gpt-7b-h100 on 3dc-8stages, 8 stages, 65536 tokens" in done.stdout
    bad = run_cli("plan", "3dc-8stages", "--tokens", "64x", check=False)
    assert bad.returncode != 0 and "--tokens" in bad.stderr and "Ki" in bad.stderr


def test_a_token_budget_derives_the_microbatch_count_and_is_recorded() -> None:
    from testbed.run.runner import RunError, RunOptions

    opts = RunOptions(schedules=["geopipe"], compute="llama2-13b-910b-tp8", tokens=2**18, shape=(1, 1024))
    assert opts.microbatches == 256 and opts.to_json()["tokens"] == 2**18 and opts.to_json()["shape"] == (1, 1024)
    assert RunOptions(schedules=["1f1b"], compute="llama2-13b-910b-tp8", tokens=2**18).microbatches == 64  # 1 x 4096
    real = RunOptions(schedules=["1f1b"], tokens=4 * 64 * 32, microbatch_size=4, model={"block_size": 64})
    assert real.microbatches == 32
    with pytest.raises(RunError, match=r"--tokens 1000: not a whole number of micro-batches of 4096 tokens"):
        RunOptions(schedules=["1f1b"], compute="llama2-13b-910b-tp8", tokens=1000)
    with pytest.raises(RunError, match="deployment profile's"):
        RunOptions(schedules=["1f1b"], shape=(1, 1024))


def test_the_run_table_takes_the_shape() -> None:
    from testbed.run.compute import run_table
    from testbed.run.summary import StageLink
    from workloads.compute import ComputeMode

    links = [StageLink(0.005, 1e9, 400e9)]
    table = run_table(ComputeMode("profile", "llama2-13b-910b-tp8"), links, "t", (2, 1024))
    default = run_table(ComputeMode("profile", "llama2-13b-910b-tp8"), links, "t")
    assert table.tokens_per_microbatch == 2048 and default.tokens_per_microbatch == 4096
    assert table.activation_bytes == 2 * 1024 * 5120 * 2
