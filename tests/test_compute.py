"""Compute as time, its tables: the shipped deployment profile turns into per-stage costs from its cost model
at the default shape (layers split evenly, the LM head on the last stage only, stash, resident and wire
bytes; the formulas themselves in tests/test_profile_model.py); cost tables round-trip and a bad one
names its file; `--compute` values parse or name the fix; a profile with many problems reports them all;
rate scales come from the topology across DCs and the profile's fabric within one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from testbed.run.compute import rate_scales, run_table
from testbed.run.summary import StageLink
from testbed.topology.profile import PROFILES_DIR, ProfileError, find_profile, load_profile, parse_compute
from workloads.compute import PROFILE, REAL, REPLAY, ComputeError, ComputeMode, CostTable, PhaseCost, StageCost

MS, MIB = 1e-3, 1024**2
SHIPPED = PROFILES_DIR / "gpt-7b-h100.yaml"
H, F, V, S = 4096, 11008, 32000, 4096
P_LAYER = 2 * H * H + 2 * H * 32 * 128 + 3 * H * F        # q, o; k, v (32 kv heads of 128); SwiGLU: 202,375,168
LAYER_FLOP = 2 * S * P_LAYER + 4 * S * S * H                # b = 1: 1.6579e12 + 0.2749e12 = 1.9327e12
RATE = 989.4e12 * 0.75                                     # one H100 (tp 1, tp_efficiency 1): 742.05 TFLOPS
LAYER_F = LAYER_FLOP / RATE                                # 2.6046 ms
HEAD_F = 2 * S * H * V / RATE                              # 1.0737e12 FLOP: 1.4470 ms


@pytest.fixture(scope="module")
def profile():
    return load_profile(find_profile("gpt-7b-h100"))


def test_the_shipped_profile_loads_with_its_stated_numbers_and_sources(profile) -> None:
    assert find_profile("gpt-7b-h100") == SHIPPED
    assert profile.name == "gpt-7b-h100" and profile.layers == 32 and profile.microbatch_size == 1
    assert (profile.hidden, profile.ffn_hidden, profile.heads, profile.kv_heads, profile.vocab) == (H, F, 32, 32, V)
    assert profile.seq_len == S and profile.tp == 1 and profile.tp_efficiency == 1.0
    assert profile.peak_flops == pytest.approx(989.4e12) and profile.utilisation == 0.75
    assert profile.layer_forward_flops(1, S) / profile.stage_rate == pytest.approx(2.6046 * MS, rel=1e-4)
    assert profile.head_forward_flops(1, S) / profile.stage_rate == pytest.approx(1.4470 * MS, rel=1e-4)
    assert profile.activation_bytes(1, S) == 32 * MIB and profile.stash_per_layer_bytes(1, S) == 544 * MIB
    assert profile.hbm_bytes == 80 * 10**9 and profile.fabric_rate_bps == 400e9
    assert len(profile.sources) == 15 and all(profile.sources.values()) and profile.variants == ("whole-job-mfu",)


def _resident(layers: list[int]) -> int:
    """The largest stage's 16 B per parameter: its layers (weights and two norms), the embedding on the first,
    the LM head and the final norm on the last."""
    per_stage = [n * (P_LAYER + 2 * H) for n in layers]
    per_stage[0] += V * H
    per_stage[-1] += V * H + H
    return 16 * max(per_stage)


@pytest.mark.parametrize(("stages", "layers"), [(8, [4] * 8), (16, [2] * 16), (5, [7, 7, 6, 6, 6]), (1, [32])])
def test_table_splits_the_layers_and_puts_the_head_on_the_last_stage_only(profile, stages: int,
                                                                          layers: list[int]) -> None:
    assert profile.layers_per_stage(stages) == layers
    scale = [400.0] * (stages - 1)
    table = profile.table(stages, scale)
    assert len(table.stages) == stages and table.source == "profile:gpt-7b-h100"
    for s, (n, cost) in enumerate(zip(layers, table.stages, strict=True)):
        head = s == stages - 1
        assert cost.forward.median_s == pytest.approx(n * LAYER_F + (HEAD_F if head else 0), rel=1e-12), s
        assert cost.backward.median_s == pytest.approx(2 * (n * LAYER_F + (HEAD_F if head else 0)), rel=1e-12), s
        assert cost.forward.p10_s == cost.forward.p90_s == cost.forward.median_s and cost.forward.samples == 0
        assert cost.stash_bytes == n * 544 * MIB + 2 * 32 * MIB, s
        assert cost.fb_s == pytest.approx(cost.forward.median_s + cost.backward.median_s)
    assert table.activation_bytes == 32 * MIB and table.rate_scale == scale
    assert table.hbm_bytes == 80 * 10**9 and table.resident_bytes == _resident(layers)
    assert table.tokens_per_microbatch == 4096 and table.microbatch_size == 1
    if stages == 1:
        assert table.resident_bytes == 16 * 6_738_415_616                    # all of Llama 2 7B's parameters


def test_too_many_stages_for_the_layers_is_a_profile_error(profile) -> None:
    with pytest.raises(ProfileError, match=r"model\.layers: 32 layers cannot fill 33 stages"):
        profile.table(33, [])


@pytest.mark.parametrize(("scale", "expected"), [(400.0, 83888), (40.0, 838860), (1.0, 32 * MIB), (3.0, 11184812),
                                                 (1e12, 4)])
def test_wire_bytes_are_the_activation_over_the_scale_rounded_to_4_bytes(profile, scale: float, expected: int) -> None:
    table = profile.table(3, [scale, 1.0])
    assert table.wire_bytes(0) == expected and expected % 4 == 0
    assert abs(expected - 32 * MIB / scale) <= 2 or expected == 4
    assert table.wire_bytes(1) == 32 * MIB
    assert profile.table(3, []).wire_bytes(0) == 32 * MIB          # no scale: the model's own bytes


def _hand_table() -> CostTable:
    return CostTable("host", "by hand", [StageCost(PhaseCost.of([0.003, 0.001, 0.002]), PhaseCost.stated(0.004), 96),
                                         StageCost(PhaseCost.stated(0.005), PhaseCost.stated(0.01), 128)],
                     activation_bytes=64, microbatch_size=2, rate_scale=[2.5], tokens_per_microbatch=128)


@pytest.mark.parametrize("make", [_hand_table, lambda: load_profile(SHIPPED).table(8, [40, 40, 40, 400, 40, 40, 40])],
                         ids=["hand", "profile"])
def test_cost_table_json_round_trip_is_equal(make, tmp_path: Path) -> None:
    table = make()
    assert CostTable.from_json(json.loads(json.dumps(table.to_json()))) == table
    table.save(tmp_path / "compute.json")
    assert CostTable.load(tmp_path / "compute.json") == table


def test_phase_cost_of_measured_spans() -> None:
    cost = PhaseCost.of([0.005, 0.001, 0.004, 0.002, 0.003])
    assert (cost.median_s, cost.samples) == (0.003, 5) and cost.p10_s == 0.001 and cost.p90_s == 0.005


@pytest.mark.parametrize("content", [None, "not json {", "[1, 2]", '{"source": "host"}', '{"stages": [{}]}'],
                         ids=["missing", "garbage", "list", "no-stages", "bad-stage"])
def test_loading_a_missing_or_garbage_table_names_the_file(content: str | None, tmp_path: Path) -> None:
    path = tmp_path / "compute.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ComputeError) as err:
        CostTable.load(path)
    assert str(path) in str(err.value)
    assert ("no such cost table" if content is None else "not a cost table") in str(err.value)


def test_parse_compute_real_replay_file_and_profile(tmp_path: Path) -> None:
    assert parse_compute("real") == ComputeMode(REAL) and not parse_compute("real").timed
    assert parse_compute("replay") == ComputeMode(REPLAY) and parse_compute("replay").timed
    saved = tmp_path / "compute.json"
    _hand_table().save(saved)
    mode = parse_compute(f"replay:{saved}")
    assert mode == ComputeMode(REPLAY, str(saved)) and mode.text == f"replay:{saved}" and mode.timed
    assert ComputeMode.from_text(mode.text) == mode
    mode = parse_compute("gpt-7b-h100")
    assert mode == ComputeMode(PROFILE, "gpt-7b-h100") and mode.text == "gpt-7b-h100" and mode.timed
    assert ComputeMode.from_text("gpt-7b-h100") == mode
    by_path = parse_compute(str(SHIPPED))
    assert by_path.kind == PROFILE and by_path.text == "gpt-7b-h100"      # the shipped file: named by its stem


def test_parse_compute_names_what_is_wrong(tmp_path: Path) -> None:
    with pytest.raises(ProfileError, match=r"did you mean 'gpt-7b-h100'\?"):
        parse_compute("gpt-7b-h10")
    with pytest.raises(ProfileError, match=r"choose one of: real, replay, replay:FILE, .*gpt-7b-h100"):
        parse_compute("quantum-abacus")
    missing = tmp_path / "nothing.json"
    with pytest.raises(ComputeError, match=f"{missing}: no such cost table"):
        parse_compute(f"replay:{missing}")


def _write_profile(path: Path, edit) -> Path:
    raw = yaml.safe_load(SHIPPED.read_text())
    edit(raw)
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def test_a_profile_with_several_problems_reports_all_of_them_with_file_and_key(tmp_path: Path) -> None:
    def spoil(raw: dict) -> None:
        del raw["accelerator"]["utilisation"]["source"]                     # a number without its source
        raw["memory"]["resident_per_parm"] = raw["memory"].pop("resident_per_param")   # a typo of a key
        raw["accelerator"]["hbm"]["value"] = "5parsecs"                     # a unit that is no size
        del raw["network"]                                                  # a whole section missing

    path = _write_profile(tmp_path / "broken.yaml", spoil)
    with pytest.raises(ProfileError) as err:
        load_profile(path)
    problems = {p.path: p for p in err.value.problems}
    assert problems["accelerator.utilisation.source"].problem == "no source"
    assert "did you mean 'resident_per_param'?" in problems["memory.resident_per_parm"].fix
    assert "unknown key 'resident_per_parm'" in problems["memory.resident_per_parm"].problem
    assert problems["memory.resident_per_param"].problem == "missing"
    assert "'5parsecs'" in problems["accelerator.hbm.value"].problem
    assert "MiB" in problems["accelerator.hbm.value"].fix
    assert problems["network"].problem == "missing section" and "fabric_rate" in problems["network"].fix
    lines = str(err.value).splitlines()
    assert len(lines) == len(err.value.problems) == 5
    for key in problems:
        assert any(line.startswith(f"{path}: {key}: ") for line in lines), (key, lines)


def test_a_valid_copy_of_the_profile_loads_from_its_path(tmp_path: Path) -> None:
    path = _write_profile(tmp_path / "mine.yaml", lambda raw: raw["model"].update(layers={"value": 16, "source": "x"}))
    assert load_profile(path).layers_per_stage(3) == [6, 5, 5]
    assert parse_compute(str(path)) == ComputeMode(PROFILE, str(path))


def test_rate_scales_across_and_within_datacenters(profile) -> None:
    links = [StageLink(0.0, 10e9, None, crosses_dc=False),
             StageLink(0.005, 1e9, 400e9, crosses_dc=True),
             StageLink(0.0, 10e9, 1e12, crosses_dc=False),       # within a DC: the fabric's rate, not real_rate
             StageLink(0.002, 2.5e9, 100e9, crosses_dc=True)]
    assert rate_scales(links, profile, "t") == [40.0, 400.0, 40.0, 40.0]


def test_a_crossing_link_without_real_rate_names_the_topology_and_the_fix(profile) -> None:
    links = [StageLink(0.0, 10e9, None, crosses_dc=False), StageLink(0.005, 1e9, None, crosses_dc=True)]
    with pytest.raises(ComputeError) as err:
        rate_scales(links, profile, "my-topology")
    assert "topology my-topology" in str(err.value) and "add real_rate" in str(err.value)
    assert "stage 1 and 2" in str(err.value)


def test_run_table_for_each_mode(tmp_path: Path) -> None:
    links = [StageLink(0.0, 10e9, None, False), StageLink(0.005, 1e9, 400e9, True), StageLink(0.0, 10e9, None, False)]
    assert run_table(ComputeMode(REAL), links, "t") is None
    assert run_table(ComputeMode(REPLAY), links, "t") is None           # profiled by the workers
    table = run_table(ComputeMode(PROFILE, "gpt-7b-h100"), links, "t")
    assert table == load_profile(SHIPPED).table(4, [40.0, 400.0, 40.0])
    saved = tmp_path / "compute.json"
    _hand_table().save(saved)
    assert run_table(ComputeMode(REPLAY, str(saved)), links[:1], "t") == _hand_table()
    with pytest.raises(ComputeError, match=r"the table has 2 stages, this run 4; replay it with --stages 2"):
        run_table(ComputeMode(REPLAY, str(saved)), links, "t")
