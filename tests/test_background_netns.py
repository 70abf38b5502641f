"""Root tier: background traffic over an OTN edge with real packets, and the congestion experiment from its command.

A 1000 km link at 100 Mbit/s into an edge that forwards 50 Mbit/s, and a bulk background flow from a second host in
each DC: with PFC the flow is paused and nothing is dropped, the buffer within XOFF + headroom; the lossy class is
dropped at XOFF instead; with a finite buffer and no pause the flow loses packets and TCP retransmits them."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import run_cli

from testbed.backends.base import Backend
from testbed.deploy import lifecycle
from testbed.run.background import background_traffic
from testbed.shaping.registry import shaper_for
from testbed.state import store as statefile

pytestmark = pytest.mark.root

AB = "dc-a -> dc-b"
EDGE_RATE = 50e6

TOPOLOGY = """
name: bg
datacenters: {{dc-a: {{hosts: 2}}, dc-b: {{hosts: 2}}}}
links:
  - {{a: dc-a, b: dc-b, distance: 1000km, rate: 100mbit, edge_rate: 50mbit, {edge}}}
background:
  - {{from: dc-a-h2, to: dc-b-h2, class: {kind}}}
"""


@pytest.fixture
def testbed_with(tmp_path: Path) -> Iterator[object]:
    names: list[str] = []

    def up(edge: str, kind: str = "lossless") -> Backend:
        name = f"bg{time.monotonic_ns() % 100000}"
        path = tmp_path / f"{name}.yaml"
        path.write_text(TOPOLOGY.format(edge=edge, kind=kind))
        names.append(name)
        run_cli("up", str(path), "--name", name, "--shaper", "delayline", "--verify", "skip")
        return lifecycle.open_backend(name)

    yield up
    for name in names:
        run_cli("down", name, check=False)


def _load(backend: Backend, out: Path, seconds: float = 4.0):  # type: ignore[no-untyped-def]
    with background_traffic(backend, backend.state.plan.background, out, log=lambda _m: None) as reports:
        time.sleep(seconds)
    assert not [p for p in backend.state.processes if p.role == "background"]     # stopped and forgotten
    assert len(reports) == 1 and reports[0].seconds > seconds * 0.8, reports
    return reports[0], shaper_for(backend).edge_counters()[AB]


def test_background_over_a_pfc_edge_is_paused_not_dropped(testbed_with, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    backend = testbed_with("lossless: pfc")
    report, edge = _load(backend, tmp_path)
    planned = backend.state.plan.directions[0].edge
    assert edge.drops == 0 and edge.lossy_drops == 0
    assert edge.pauses >= 3 and edge.pause_s > 1.0
    assert planned.xoff_bytes < edge.buffer_peak_bytes <= planned.xoff_bytes + planned.headroom_bytes
    assert report.sent_bps == pytest.approx(EDGE_RATE, rel=0.15)       # what the edge forwards, headers aside


def test_the_lossy_class_is_dropped_at_xoff_and_never_pauses(testbed_with, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    backend = testbed_with("lossless: pfc", kind="lossy")
    report, edge = _load(backend, tmp_path)
    planned = backend.state.plan.directions[0].edge
    assert edge.lossy_drops > 0 and edge.drops == 0 and edge.pauses == 0
    assert edge.buffer_peak_bytes <= planned.xoff_bytes
    assert report.retransmits > 0


def test_background_over_a_tail_drop_edge_loses_packets(testbed_with, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    backend = testbed_with("lossless: false, buffer: 150KB")
    report, edge = _load(backend, tmp_path)
    assert edge.drops > 0 and edge.pauses == 0
    assert report.retransmits > 0


def test_the_congestion_command_compares_pfc_with_tail_drop(tmp_path: Path) -> None:
    result = run_cli("congestion", "--variants", "pfc,drop", "--iterations", "2", "--cut-iteration", "2",
                     "--microbatches", "4", "--results", str(tmp_path))
    assert "| pfc |" in result.stdout and "| drop |" in result.stdout, result.stdout
    (folder,) = tmp_path.glob("congestion-*")
    record = json.loads((folder / "congestion.json").read_text())
    by = {v["variant"]: v for v in record["variants"]}
    pfc_edge, drop_edge = by["pfc"]["links"][0]["edge"], by["drop"]["links"][0]["edge"]
    assert pfc_edge["drops"] == 0 and pfc_edge["pauses"] > 0
    assert drop_edge["drops"] > 0 and drop_edge["pauses"] == 0
    assert sum(b["retransmits"] for b in by["drop"]["background"]) > 0
    steps = by["pfc"]["steps"]
    assert steps[1]["step_s"] > 1.5 * steps[0]["step_s"]        # the cut, behind the background in the paused FIFO
    assert all(v["samples"] for v in by.values()) and (folder / "congestion.png").exists()
    assert not [v for v in ("pfc", "drop") if statefile.exists(f"cg-{v}")]       # each variant's testbed removed
