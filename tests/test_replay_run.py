"""Compute as time across namespaces (root tier): `--compute replay` profiles the real model here, saves the table
as compute.json and replays it with no arithmetic (no losses); `--compute replay:FILE` replays that saved table
(every F span exactly its forward time); `--compute gpt-7b-h100` on 8 stages over two DCs carries each message
at the link's rate scale (400 across the OTN wavelength, 40 on the fabric) and the links keep their delay."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from conftest import netns_with_prefix, run_cli

from testbed.topology.profile import resolve_profile
from workloads.compute import CostTable

pytestmark = [pytest.mark.root, pytest.mark.slow]

EXACT = 1e-9


def _summary(results: Path) -> tuple[Path, dict]:
    (path,) = results.glob("*/summary.json")
    return path.parent, json.loads(path.read_text())


def _spans(run_dir: Path, schedule: str, rank: int, kind: str) -> list[float]:
    trace = json.loads((run_dir / schedule / f"rank-{rank}.json").read_text())
    return [s["end"] - s["start"] for it in trace["iterations"] for s in it["spans"] if s["kind"] == kind]


def test_replay_profiles_here_and_a_saved_table_replays_exactly(unique_name: str, tmp_path: Path) -> None:
    run_cli("up", "2dc-1000km", "--name", unique_name, "--verify", "skip", timeout=300)
    try:
        first = tmp_path / "replay"
        run_cli("run", unique_name, "--compute", "replay", "--schedule", "1f1b,geopipe", "--microbatches", "8",
                "--iterations", "2", "--transport", "tcp", "--results", str(first), timeout=300)
        run_dir, summary = _summary(first)
        assert summary["compute"] == "replay" and summary["arithmetic"] is False
        assert summary["fb_per_microbatch_s"] > 0
        table = CostTable.load(run_dir / "compute.json")
        assert len(table.stages) == 2 and table.source == "host"
        assert all(s.forward.samples > 0 and s.forward.median_s > 0 and s.backward.median_s > 0 for s in table.stages)
        assert summary["fb_per_microbatch_s"] == pytest.approx(table.host_fb_s)
        assert summary["compute_detail"] == table.description and table.description
        assert [s["schedule"] for s in summary["schedules"]] == ["1f1b", "geopipe"]
        for s in summary["schedules"]:
            assert s["loss_first"] is None and s["loss_last"] is None, s["schedule"]
        for rank in (0, 1):                         # the workers replayed the table they profiled
            forward = _spans(run_dir, "1f1b", rank, "F")
            assert len(forward) == 3 * 8 and all(abs(x - table.stages[rank].forward.median_s) < EXACT for x in forward)

        second = tmp_path / "again"
        saved = run_dir / "compute.json"
        run_cli("run", unique_name, "--compute", f"replay:{saved}", "--schedule", "1f1b", "--microbatches", "8",
                "--iterations", "2", "--transport", "tcp", "--results", str(second), timeout=300)
        again_dir, again = _summary(second)
        assert again["compute"] == f"replay:{saved}" and again["arithmetic"] is False
        assert again["compute_detail"] == summary["compute_detail"]
        assert again["fb_per_microbatch_s"] == pytest.approx(table.host_fb_s)
        assert CostTable.load(again_dir / "compute.json") == table          # the table it replayed, saved with it
        assert again["schedules"][0]["loss_first"] is None
        for rank in (0, 1):
            assert _spans(again_dir, "1f1b", rank, "F"), rank
            for kind, phase in (("F", "forward"), ("B", "backward")):
                want = getattr(table.stages[rank], phase).median_s
                got = _spans(again_dir, "1f1b", rank, kind)
                assert len(got) == 3 * 8 and all(abs(x - want) < EXACT for x in got), (rank, kind, want, got[:3])
    finally:
        run_cli("down", unique_name, check=False)
    assert netns_with_prefix(f"tb-{unique_name}-") == []


def test_a_deployment_profile_on_eight_stages_scales_the_messages_per_link(unique_name: str, tmp_path: Path) -> None:
    """2dc-8stages: four stages in each DC; the stage link across the 1000 km wavelength (400G emulated at 1 Gbit/s)
    carries 1/400 of the deployment's bytes, the six within a DC's fabric (400G NICs, 10 Gbit/s) 1/40."""
    name = f"{unique_name}p"
    try:
        run_cli("run", "2dc-8stages", "--name", name, "--compute", "gpt-7b-h100", "--stages", "8", "--microbatches",
                "16", "--iterations", "2", "--schedule", "1f1b", "--transport", "tcp", "--results", str(tmp_path),
                timeout=400)
    finally:
        if netns_with_prefix(f"tb-{name}-"):
            run_cli("down", name, check=False)
            for ns in netns_with_prefix(f"tb-{name}-"):
                subprocess.run(["ip", "netns", "del", ns], check=False)
    run_dir, summary = _summary(tmp_path)
    assert summary["compute"] == "gpt-7b-h100" and summary["arithmetic"] is False
    assert len(summary["stages"]) == 8
    crossing = [lk["crosses_dc"] for lk in summary["stage_links"]]
    assert crossing == [False, False, False, True, False, False, False]
    assert summary["rate_scale"] == [400.0 if c else 40.0 for c in crossing]
    table = CostTable.load(run_dir / "compute.json")
    assert table.source == "profile:gpt-7b-h100" and len(table.stages) == 8 and table.rate_scale == summary["rate_scale"]
    # the cost model's spans (worked by hand in tests/test_profile_model.py): 4 layers a stage, the head on the last
    est = resolve_profile("gpt-7b-h100").stage_costs(8, 1, 4096)
    assert summary["fb_per_microbatch_s"] == pytest.approx(est[0].forward_s + est[0].backward_s)
    assert est[0].forward_s == pytest.approx(4 * 2.605e-3, rel=2e-3)
    (one,) = summary["schedules"]
    assert one["schedule"] == "1f1b" and one["loss_first"] is None
    assert one["link_timing"] and one["links_on_time"] is True, one["link_timing"]
    forward = _spans(run_dir, "1f1b", 7, "F")
    assert forward and all(abs(x - est[7].forward_s) < EXACT for x in forward)          # the head on the last stage
    assert est[7].forward_s > est[0].forward_s
    assert netns_with_prefix(f"tb-{name}-") == []
