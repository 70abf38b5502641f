"""Stage placement and the checks `testbed run` makes before bringing anything up (no root)."""

from __future__ import annotations

import pytest
from conftest import run_cli

from testbed.run.placement import PlacementError, place_stages
from testbed.run.runner import RunError, RunOptions
from testbed.topology import load_topology
from testbed.util.paths import shipped_topologies
from workloads.memory import MemoryBudget

SIX = [("a1", "dc-a"), ("a2", "dc-a"), ("b1", "dc-b"), ("b2", "dc-b"), ("c1", "dc-c"), ("c2", "dc-c")]


def test_spread_puts_one_stage_per_dc_by_default_and_fill_takes_hosts_in_order() -> None:
    assert place_stages(SIX, None) == [0, 2, 4]
    assert place_stages(SIX, 4) == [0, 1, 2, 4]                  # earlier DCs take the remainder
    assert place_stages(SIX, 6) == list(range(6))
    assert place_stages(SIX, 3, "fill") == [0, 1, 2]              # two DCs only: what 0.2 did
    assert place_stages(SIX, None, "fill") == list(range(6))
    with pytest.raises(PlacementError, match="use --stages 2..6"):
        place_stages(SIX, 7)
    with pytest.raises(PlacementError, match="spread or fill"):
        place_stages(SIX, 2, "random")


@pytest.mark.parametrize("topology", shipped_topologies(), ids=lambda p: p.stem)
def test_default_run_options_fit_every_shipped_topology(topology) -> None:
    """`testbed run TOPO` with default options: one stage per DC, every schedule (PyTorch's two-chunk ones too
    when the model has the layers) fits before anything is brought up."""
    hosts = list(load_topology(topology).hosts)
    options = RunOptions(schedules=["1f1b", "1f1b-prefetch", "geopipe"])
    count = len(place_stages(hosts, options.stages, options.placement))
    assert count == len(load_topology(topology).datacenters)
    options.check_stages(count)


def test_options_that_cannot_fill_the_stages_fail_before_bring_up() -> None:
    options = RunOptions(schedules=["torch-zbv"], model={"n_layer": 4})
    options.check_stages(2)
    with pytest.raises(RunError, match="4 layers cannot fill 6 stages .*use --layers 6 or more"):
        options.check_stages(3)
    with pytest.raises(RunError, match="--memory-budget: memory budget 'lots'"):
        RunOptions(schedules=["geopipe"], memory_budget="lots")
    assert RunOptions(schedules=["geopipe"], memory_budget="2KiB").memory_budget == MemoryBudget(bytes=2048)
    relative = RunOptions(schedules=["geopipe"], memory_budget="1F1B + 2")      # typed; the summary keeps its text
    assert relative.memory_budget == MemoryBudget(extra_microbatches=2) and relative.to_json()["memory_budget"] == "1f1b+2"
    out = run_cli("run", "3dc-line", "--stages", "6", "--schedule", "geopipe", check=False)   # no root needed:
    assert out.returncode == 1 and "4 layers cannot fill 6 stages" in out.stderr              # nothing came up


def test_the_kept_attempt_of_a_repeated_run_is_where_plots_and_the_model_read(tmp_path) -> None:
    from testbed.run.runner import keep_attempt

    first, second = tmp_path / "geopipe", tmp_path / "geopipe-repeat1"
    for d, text in ((first, "disturbed"), (second, "quiet")):
        d.mkdir()
        (d / "rank-0.json").write_text(text)
    keep_attempt(first, second)                          # the repeat was less disturbed: it takes the place
    assert (first / "rank-0.json").read_text() == "quiet"
    assert (tmp_path / "geopipe-set-aside" / "rank-0.json").read_text() == "disturbed"
    keep_attempt(first, first)                           # the first was kept: nothing moves
    assert (first / "rank-0.json").read_text() == "quiet"


def test_the_model_is_typed_and_a_bad_shape_fails_before_bring_up() -> None:
    from workloads.records import GPTConfig, WorkerConfig

    options = RunOptions(schedules=["1f1b"], model={"n_layer": 3, "n_embd": 64})
    assert options.model == GPTConfig(n_layer=3, n_embd=64)
    with pytest.raises(RunError, match=r"n_embd \(66\) must be divisible by n_head \(4\) \(--width, --heads"):
        RunOptions(schedules=["1f1b"], model={"n_embd": 66})
    with pytest.raises(RunError, match="model: unknown field 'layers'"):
        RunOptions(schedules=["1f1b"], model={"layers": 3})
    config = WorkerConfig(rank=0, world=2, master_addr="10.0.0.1", master_port=1, schedules=["1f1b"], model=options.model)
    assert WorkerConfig.from_json(config.to_json()).model == options.model          # across the worker boundary
    out = run_cli("run", "3dc-line", "--width", "66", check=False)
    assert out.returncode == 1 and "n_embd (66) must be divisible by n_head (4)" in out.stderr
