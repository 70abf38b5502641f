"""Deployment profiles as cost models: the FLOP formula worked by hand, compute linear in the micro-batch size
and superlinear in the sequence length, tensor parallelism dividing the span by tp x efficiency, message,
stash, HBM and resident bytes per node at a given shape, the shipped 910B profiles with every number sourced,
variants, a planner's cheap per-shape call, and bad files refused with file, key and fix."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import pytest
import yaml

from testbed.run.compute import run_table
from testbed.run.summary import StageLink
from testbed.topology.profile import (
    PROFILES_DIR,
    ProfileError,
    find_profile,
    load_profile,
    parse_compute,
    resolve_profile,
)
from workloads.compute import PROFILE, ComputeMode

MS, MIB, GIB = 1e-3, 1024**2, 1024**3
P13 = 2 * 5120 * 5120 + 2 * 5120 * 40 * 128 + 3 * 5120 * 13824      # 52,428,800 + 52,428,800 + 212,336,640
P70 = 2 * 8192 * 8192 + 2 * 8192 * 8 * 128 + 3 * 8192 * 28672        # 134,217,728 + 16,777,216 + 704,643,072


@pytest.fixture(scope="module")
def h100():
    return resolve_profile("gpt-7b-h100")


@pytest.fixture(scope="module")
def b13():
    return resolve_profile("llama2-13b-910b-tp8")


@pytest.fixture(scope="module")
def b70():
    return resolve_profile("llama2-70b-910b-tp8")


def test_the_layer_flops_worked_by_hand_for_one_shape(b13, b70) -> None:
    assert b13.layer_weights == P13 == 317_194_240
    assert b70.layer_weights == P70 == 855_638_016                       # GQA: k and v are 8 heads of 128
    # Llama 2 13B, b = 2, s = 2048: 2*b*s*P = 8192 * 317,194,240 = 2,598,455,214,080
    #                                4*b*s^2*h = 8 * 2048^2 * 5120 = 171,798,691,840
    assert b13.layer_forward_flops(2, 2048) == 2_598_455_214_080 + 171_798_691_840 == 2_770_253_905_920
    assert b13.head_forward_flops(2, 2048) == 2 * 2 * 2048 * 5120 * 32000 == 1_342_177_280_000
    # on 8 x 910B: 8 * 320e12 * 0.75 * 0.66 = 1267.2 TFLOPS a stage
    assert b13.stage_rate == pytest.approx(1267.2e12)
    est = b13.stage_costs(8, 2, 2048)
    assert est[0].forward_s == pytest.approx(5 * 2_770_253_905_920 / 1267.2e12, rel=1e-12)      # 10.930 ms
    assert est[-1].forward_s == pytest.approx((5 * 2_770_253_905_920 + 1_342_177_280_000) / 1267.2e12, rel=1e-12)
    assert all(e.backward_s == pytest.approx(2 * e.forward_s, rel=1e-12) for e in est)


def test_the_7b_layer_is_near_the_old_formula_and_the_difference_is_swiglu(h100) -> None:
    old = 24 * 1 * 4096 * 4096**2 * (1 + 4096 / (6 * 4096))            # 1,924,145,348,608: ffn = 4h, MHA
    new = h100.layer_forward_flops(1, 4096)                             # 1,932,735,283,200
    assert new - old == pytest.approx(2 * 4096 * (3 * 4096 * 11008 - 8 * 4096**2))   # 8192 * 1,048,576
    assert new / old == pytest.approx(1.00446, abs=1e-5)


def test_compute_is_linear_in_b_and_superlinear_in_s(b70) -> None:
    def stage_f(b: int, s: int) -> float:
        return b70.stage_costs(8, b, s)[0].forward_s

    assert stage_f(4, 4096) == pytest.approx(4 * stage_f(1, 4096), rel=1e-12)
    assert stage_f(3, 1024) == pytest.approx(3 * stage_f(1, 1024), rel=1e-12)
    ratio = stage_f(1, 8192) / stage_f(1, 4096)
    # (2*8192*P + 4*8192^2*h) / (2*4096*P + 4*4096^2*h): the attention term quadruples
    expected = (2 * 8192 * P70 + 4 * 8192**2 * 8192) / (2 * 4096 * P70 + 4 * 4096**2 * 8192)
    assert ratio == pytest.approx(expected, rel=1e-12) and ratio > 2.1


def test_tensor_parallelism_divides_compute_by_tp_times_efficiency(b70) -> None:
    alone = dataclasses.replace(b70, tp=1, tp_efficiency=1.0)
    assert alone.stage_rate == pytest.approx(320e12 * 0.75)
    for stage in range(8):
        one, node = alone.stage_costs(8, 1, 4096)[stage], b70.stage_costs(8, 1, 4096)[stage]
        assert one.forward_s / node.forward_s == pytest.approx(8 * 0.76, rel=1e-12)
        assert one.backward_s / node.backward_s == pytest.approx(8 * 0.76, rel=1e-12)
    # the default shape: 7,559,142,440,960 FLOP / (8 * 320e12 * 0.75 * 0.76) = 5.1803 ms a layer forward
    assert b70.layer_forward_flops(1, 4096) == 7_559_142_440_960
    assert b70.stage_costs(80, 1, 4096)[0].forward_s == pytest.approx(5.1803 * MS, rel=1e-4)


def test_message_and_stash_bytes_per_shape(b70) -> None:
    assert b70.activation_bytes(1, 4096) == 4096 * 8192 * 2 == 64 * MIB
    assert b70.activation_bytes(2, 8192) == 2 * 8192 * 8192 * 2 == 256 * MIB
    assert b70.stash_per_layer_bytes(1, 4096) == 34 * 4096 * 8192 == 1088 * MIB            # 136 MiB per device
    assert b70.stash_per_layer_bytes(2, 8192) == 34 * 8192 * 2 * 8192 == 4352 * MIB
    assert b70.stash_per_layer_bytes(2, 8192) // b70.tp == 544 * MIB
    table = b70.table(8, [400.0] * 7, 2, 8192)
    assert table.activation_bytes == 256 * MIB and table.microbatch_size == 2 and table.tokens_per_microbatch == 16384
    assert all(s.stash_bytes == 10 * 4352 * MIB + 2 * 256 * MIB for s in table.stages)     # 10 layers, input, output
    assert table.wire_bytes(0) == 671_088                               # 256 MiB / 400 = 671,088.6, to 4 bytes


def test_hbm_and_resident_state_are_per_node(b70, h100) -> None:
    assert b70.device_hbm_bytes == 64 * GIB and b70.hbm_bytes == 8 * 64 * GIB == 549_755_813_888
    assert h100.hbm_bytes == 80 * 10**9
    # Llama 2 70B's parameters: 80 * (855,638,016 + 2*8192) + 2 * 32000 * 8192 + 8192 (the released checkpoint's)
    assert b70.params == 68_976_648_192
    est = b70.stage_costs(8, 1, 4096)
    assert est[0].resident_bytes == 16 * (10 * (P70 + 16384) + 32000 * 8192) == 141_099_008_000    # + embedding
    assert est[-1].resident_bytes == 16 * (10 * (P70 + 16384) + 32000 * 8192 + 8192)                # + head, norm
    assert est[3].resident_bytes == 16 * 10 * (P70 + 16384)
    assert b70.table(8, []).resident_bytes == est[-1].resident_bytes == 141_099_139_072
    # tightest stage: (549,755,813,888 - 141,099,139,072) // (10 * 1088 MiB + 2 * 64 MiB) = 35.4
    assert b70.inflight_capacity(8) == 35
    assert b70.inflight_capacity(8, 1, 8192) == (549_755_813_888 - 141_099_139_072) // (10 * 2176 * MIB + 4 * 64 * MIB)
    assert b70.inflight_capacity(2) == 0                                # 40 layers and the optimizer do not fit
    # 7B on 5 stages [7, 7, 6, 6, 6]: the first binds, (80e9 - 16 * (7 * 202,383,360 + 32000 * 4096)) //
    # (7 * 544 MiB + 2 * 32 MiB) = 55,235,911,680 // 4,060,086,272 = 13 (a middle stage would hold 17)
    assert h100.inflight_capacity(5) == 13


@pytest.mark.parametrize(("name", "params"), [("gpt-7b-h100", 6_738_415_616), ("llama2-13b-910b-tp8", 13_015_864_320),
                                              ("llama2-70b-910b-tp8", 68_976_648_192)])
def test_parameters_follow_from_the_published_shape(name: str, params: int) -> None:
    assert resolve_profile(name).params == params


@pytest.mark.parametrize("name", ["llama2-13b-910b-tp8", "llama2-70b-910b-tp8"])
def test_the_910b_profiles_load_with_every_number_sourced(name: str) -> None:
    profile = load_profile(PROFILES_DIR / f"{name}.yaml")
    assert profile.name == name and find_profile(name) == PROFILES_DIR / f"{name}.yaml"
    assert len(profile.sources) == 15 and all(len(s) > 20 for s in profile.sources.values())
    assert profile.tp == 8 and profile.device_hbm_bytes == 64 * GIB and profile.peak_flops == 320e12
    assert profile.fabric_rate_bps == 1.6e12 and (profile.microbatch_size, profile.seq_len) == (1, 4096)
    for key in ("accelerator.peak_tflops", "accelerator.utilisation", "node.tp_efficiency"):
        assert "ASSUMPTION" in profile.sources[key], key                 # the numbers no datasheet states
    assert parse_compute(name) == ComputeMode(PROFILE, name)


def test_shapes_of_the_two_910b_models(b13, b70) -> None:
    assert (b13.layers, b13.hidden, b13.ffn_hidden, b13.heads, b13.kv_heads, b13.vocab) == (40, 5120, 13824, 40, 40, 32000)
    assert (b70.layers, b70.hidden, b70.ffn_hidden, b70.heads, b70.kv_heads, b70.vocab) == (80, 8192, 28672, 64, 8, 32000)
    assert b70.head_dim == 128 == b13.head_dim


def test_the_default_shape_is_the_profiles_and_a_given_one_is_used(b13) -> None:
    assert b13.table(8, []) == b13.table(8, [], 1, 4096)
    assert b13.inflight_capacity(8) == b13.inflight_capacity(8, 1, 4096)
    other = b13.table(8, [], microbatch_size=2, seq_len=2048)
    assert other.tokens_per_microbatch == 4096 and other.microbatch_size == 2
    assert other.stages[0].forward.median_s == pytest.approx(5 * 2_770_253_905_920 / 1267.2e12, rel=1e-12)
    assert "micro-batch 2 x 2048 tokens" in other.description


@pytest.mark.parametrize(("b", "s"), [(0, 4096), (1, 0), (1.5, 4096), (True, 4096)])
def test_a_shape_that_is_no_shape_is_refused(b13, b, s) -> None:
    with pytest.raises(ProfileError, match=r"shape: .* is no shape; give whole numbers >= 1 for b and s"):
        b13.stage_costs(8, b, s)


def test_a_planner_can_ask_thousands_of_shapes_a_second(b70) -> None:
    shapes = [(b, s) for b in range(1, 9) for s in range(1024, 33792, 128)]
    assert len(shapes) == 2048
    start = time.perf_counter()
    for b, s in shapes:
        b70.stage_costs(8, b, s)
    assert time.perf_counter() - start < 1.0


def test_a_variant_restates_a_number_with_its_source() -> None:
    base, mfu = resolve_profile("gpt-7b-h100"), resolve_profile("gpt-7b-h100@whole-job-mfu")
    assert mfu.utilisation == 0.40 and mfu.label == "gpt-7b-h100@whole-job-mfu" and base.label == "gpt-7b-h100"
    assert "arXiv:2407.21783" in mfu.sources["accelerator.utilisation"] != base.sources["accelerator.utilisation"]
    # 1.9327e12 FLOP / (989.4e12 * 0.40): 4.8836 ms, the 4.86 ms of earlier releases with the SwiGLU count
    assert mfu.layer_forward_flops(1, 4096) / mfu.stage_rate == pytest.approx(4.8836 * MS, rel=1e-4)
    assert mfu.table(8, []).source == "profile:gpt-7b-h100@whole-job-mfu"
    mode = parse_compute("gpt-7b-h100@whole-job-mfu")
    assert mode == ComputeMode(PROFILE, "gpt-7b-h100@whole-job-mfu") and ComputeMode.from_text(mode.text) == mode
    links = [StageLink(0.0, 10e9, None, False), StageLink(0.005, 1e9, 400e9, True)]
    assert run_table(mode, links, "t") == mfu.table(3, [40.0, 400.0])
    with pytest.raises(ProfileError, match=r"variants: no variant 'whole-job'; did you mean 'whole-job-mfu'\?"):
        parse_compute("gpt-7b-h100@whole-job")


def _write(path: Path, source: str, edit) -> Path:
    raw = yaml.safe_load((PROFILES_DIR / f"{source}.yaml").read_text())
    edit(raw)
    path.write_text(yaml.safe_dump(raw, sort_keys=False, allow_unicode=True))
    return path


BAD = [
    ("tp-zero", lambda r: r["node"]["tp"].update(value=0), "node.tp.value",
     "expected a whole number >= 1, got 0", "write a whole number >= 1"),
    ("utilisation-over-1", lambda r: r["accelerator"]["utilisation"].update(value=1.2), "accelerator.utilisation.value",
     "1.2 is more than the whole peak", "a share of the peak in (0, 1]"),
    ("efficiency-zero", lambda r: r["node"]["tp_efficiency"].update(value=0), "node.tp_efficiency.value",
     "expected a share of the peak in (0, 1], got 0", "e.g. 0.75"),
    ("no-source", lambda r: r["model"]["heads"].pop("source"), "model.heads.source", "no source", "say where"),
    ("unknown-key", lambda r: r["accelerator"].update(peak_tflop=r["accelerator"].pop("peak_tflops")),
     "accelerator.peak_tflop", "unknown key 'peak_tflop'", "did you mean 'peak_tflops'?"),
    ("heads-split-hidden", lambda r: r["model"]["heads"].update(value=48), "model.heads",
     "48 heads do not divide hidden 5120", "head dim = hidden / heads"),
    ("tp-splits-heads", lambda r: r["node"]["tp"].update(value=6), "node.tp",
     "40 heads do not split over 6 devices", "a tp that divides the heads"),
    ("kv-heads", lambda r: r["model"]["kv_heads"].update(value=7), "model.kv_heads",
     "7 key/value heads do not divide 40 heads", "the published kv heads"),
    ("variant-key", lambda r: r.update(variants={"slow": {"node": {"tp_eficiency": {"value": 0.5, "source": "x"}}}}),
     "variants.slow.node.tp_eficiency", "unknown key 'tp_eficiency'", "did you mean 'tp_efficiency'?"),
    ("variant-source", lambda r: r.update(variants={"slow": {"node": {"tp_efficiency": {"value": 0.5}}}}),
     "variants.slow.node.tp_efficiency.source", "no source", "say where"),
    ("variant-tp", lambda r: r.update(variants={"wide": {"node": {"tp": {"value": 16, "source": "x"}}}}),
     "variants.wide.node.tp", "40 heads do not split over 16 devices", "a tp that divides the heads"),
]


@pytest.mark.parametrize(("edit", "key", "problem", "fix"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_a_bad_profile_is_refused_with_file_key_and_fix(tmp_path: Path, edit, key: str, problem: str,
                                                         fix: str) -> None:
    path = _write(tmp_path / "bad.yaml", "llama2-13b-910b-tp8", edit)
    with pytest.raises(ProfileError) as err:
        load_profile(path)
    lines = str(err.value).splitlines()
    assert any(line.startswith(f"{path}: {key}: {problem}") and fix in line for line in lines), lines


def test_every_problem_of_a_file_at_once(tmp_path: Path) -> None:
    def spoil(raw: dict) -> None:
        for edit in (b[1] for b in BAD[:5]):
            edit(raw)

    path = _write(tmp_path / "bad.yaml", "llama2-70b-910b-tp8", spoil)
    with pytest.raises(ProfileError) as err:
        load_profile(path)
    keys = {p.path for p in err.value.problems}
    assert {"node.tp.value", "accelerator.utilisation.value", "node.tp_efficiency.value", "model.heads.source",
            "accelerator.peak_tflop", "accelerator.peak_tflops"} <= keys
    assert err.value.lines()[0] == f"invalid deployment profile {path} ({len(err.value.problems)} problems)"


def test_a_chosen_variant_does_not_hide_a_bad_number_of_the_file(tmp_path: Path) -> None:
    def spoil(raw: dict) -> None:
        raw["accelerator"]["utilisation"]["value"] = 1.2
        raw["variants"] = {"fast": {"accelerator": {"utilisation": {"value": 0.9, "source": "x"}}}}

    path = _write(tmp_path / "bad.yaml", "llama2-13b-910b-tp8", spoil)
    with pytest.raises(ProfileError) as err:
        load_profile(path, "fast")
    assert [p.path for p in err.value.problems] == ["accelerator.utilisation.value"]
    with pytest.raises(ProfileError, match=r"variants: no variant 'fast'; drop '@fast' \(the file has none\)"):
        load_profile(PROFILES_DIR / "llama2-13b-910b-tp8.yaml", "fast")
