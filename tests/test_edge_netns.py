"""Root tier: the OTN edge with real packets. A 1000 km link at 100 Mbit/s whose receiving edge forwards 50 Mbit/s
(tests/fixtures/topologies/2dc-pfc.yaml and 2dc-taildrop.yaml): one bulk TCP flow over it fills the edge buffer.
With PFC nothing is dropped, the sender is paused and the buffer stays within XOFF + headroom; with a finite buffer
and no pause, packets are dropped and TCP retransmits them. Either way the DC side gets its 50 Mbit/s."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from conftest import REPO, run_cli

from testbed.backends.base import Backend
from testbed.deploy import lifecycle
from testbed.probe.throughput import tcp_throughput
from testbed.shaping.registry import shaper_for

pytestmark = pytest.mark.root

FIXTURES = REPO / "tests" / "fixtures" / "topologies"
AB = "dc-a -> dc-b"
EDGE_RATE = 50e6
MTU_GOODPUT = (1500 - 52) / (1500 + 14)
"""TCP payload per wire byte at MTU 1500 (IP, TCP with timestamps, Ethernet header)."""


@pytest.fixture
def testbed_of(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    names: list[str] = []

    def up(topology: str) -> Backend:
        name = f"edg{time.monotonic_ns() % 100000}"
        names.append(name)
        run_cli("up", str(FIXTURES / topology), "--name", name, "--shaper", "delayline", "--verify", "skip")
        return lifecycle.open_backend(name)

    yield up
    for name in names:
        run_cli("down", name, check=False)


def _bulk(backend: Backend, seconds: float = 4.0) -> tuple[float, int]:
    dst = next(n for n in backend.state.plan.nodes if n.name == "dc-b-h1")
    result = tcp_throughput(backend, "dc-a-h1", "dc-b-h1", dst.addresses[0].split("/")[0], seconds=seconds)
    return result.bits_per_s, result.retransmits


def test_pfc_pauses_the_sender_and_drops_nothing(testbed_of) -> None:  # type: ignore[no-untyped-def]
    backend = testbed_of("2dc-pfc.yaml")
    goodput, retransmits = _bulk(backend)
    shaper = shaper_for(backend)
    edge = shaper.edge_counters()[AB]
    planned = next(d.edge for d in backend.state.plan.directions if d.label == AB)
    assert planned is not None
    assert edge.drops == 0 and edge.lossy_drops == 0 and retransmits == 0
    assert edge.pauses >= 3 and edge.pause_s > 1.0
    assert planned.xoff_bytes < edge.buffer_peak_bytes <= planned.xoff_bytes + planned.headroom_bytes
    assert goodput == pytest.approx(EDGE_RATE * MTU_GOODPUT, rel=0.05)
    drops = {d.direction: d for d in shaper.drops()}[AB]
    assert drops.unintended == 0 and drops.buffer_drops == 0


def test_a_finite_buffer_without_pause_drops_and_tcp_retransmits(testbed_of) -> None:  # type: ignore[no-untyped-def]
    backend = testbed_of("2dc-taildrop.yaml")
    goodput, retransmits = _bulk(backend)
    shaper = shaper_for(backend)
    edge = shaper.edge_counters()[AB]
    assert edge.pauses == 0 and edge.drops > 0 and retransmits > 0
    assert edge.buffer_peak_bytes <= 150_000
    drops = {d.direction: d for d in shaper.drops()}[AB]
    assert drops.buffer_drops == edge.drops and drops.unintended == 0
    assert goodput > 0.8 * EDGE_RATE * MTU_GOODPUT


def test_a_spine_cut_on_a_live_link_halves_goodput_without_a_drop(testbed_of) -> None:  # type: ignore[no-untyped-def]
    """`testbed link set --edge-rate` (the paper's congestion test cuts the spine port 400 -> 200): the daemon
    takes the new rate on the same edge (its buffer and counters carry on) and PFC still holds."""
    backend = testbed_of("2dc-pfc.yaml")
    before, _ = _bulk(backend, seconds=3.0)
    run_cli("link", "set", "dc-a", "dc-b", "--name", backend.state.name, "--edge-rate", "25mbit")
    after, retransmits = _bulk(backend, seconds=3.0)
    backend = lifecycle.open_backend(backend.state.name)
    edge = shaper_for(backend).edge_counters()[AB]
    assert after / before == pytest.approx(0.5, rel=0.08)
    assert edge.drops == 0 and retransmits == 0
    planned = next(d.edge for d in backend.state.plan.directions if d.label == AB)
    assert planned is not None and planned.drain_rate_bps == 25e6
