"""The OTN edge's timeline (testbed/shaping/otn_edge.py) on scripted arrivals: a sender at the link's rate into an
edge that forwards at half of it, 5 ms each way. PFC must hold every lossless packet within XOFF + headroom while
the DC side gets its full rate; a finite buffer without pause must drop; a deep queue must hold and delay; an
uncongested edge must change nothing; and a pause that does not stop the sender must show as drops."""

from __future__ import annotations

import pytest

import testbed.topology.edge as edge_model
from testbed.shaping.otn_edge import EdgeConfig, OtnEdge

RATE = 100e6
DELAY = 5e-3
FRAME = 1514
GAP = FRAME * 8 / RATE
HOLD = DELAY + GAP


def config(mode: str, drain: float = RATE / 2, buffer: int | None = None, xoff: int | None = None) -> EdgeConfig:
    spec = edge_model.EdgeSpec(mode, buffer, xoff, None, drain)
    d = edge_model.resolve_edge(spec, RATE, DELAY, DELAY)
    return EdgeConfig(d.mode, RATE, d.drain_rate_bps, d.buffer_bytes, d.xoff_bytes, d.xon_bytes, d.headroom_bytes,
                      d.pause_delay_s)


def blast(edge: OtnEdge, seconds: float = 1.0, lossy_every: int = 0) -> list[float | None]:
    """A sender at line rate for `seconds`: each packet's release (None: dropped)."""
    n = int(seconds / GAP)
    return [edge.admit(i * GAP, FRAME, HOLD, lossy=bool(lossy_every) and i % lossy_every == 0) for i in range(n)]


def test_headroom_is_both_trips_and_two_units() -> None:
    assert edge_model.headroom_bytes(RATE, DELAY, DELAY) == pytest.approx(
        (2 * DELAY + edge_model.PFC_RESPONSE_S) * RATE / 8 + 2 * edge_model.LARGEST_UNIT_BYTES, abs=1)
    # 1000 km at 400 Gbit/s: ~0.5 GB, as the arithmetic says
    assert edge_model.headroom_bytes(400e9, 5e-3, 5e-3) == pytest.approx(0.5e9, rel=0.01)


def test_pfc_never_drops_and_stays_within_headroom() -> None:
    edge = OtnEdge(config("pfc"))
    released = blast(edge)
    c = edge.counters
    assert c.drops == 0 and all(r is not None for r in released)
    assert c.pauses >= 2
    assert c.buffer_peak_bytes > edge.config.xoff_bytes
    assert c.buffer_peak_bytes <= edge.config.xoff_bytes + edge.config.headroom_bytes
    # the DC side is kept busy: releases come at the edge's rate once the buffer has filled
    times = [r for r in released if r is not None]
    steady = times[len(times) // 2:]
    rate = (len(steady) - 1) * FRAME * 8 / (steady[-1] - steady[0])
    assert rate == pytest.approx(RATE / 2, rel=0.02)
    # half the line's rate gets through, so the port sits paused about half the time
    assert 0.3 < c.pause_s / (times[-1] - times[0]) < 0.6
    assert all(b >= a for a, b in zip(times, times[1:], strict=False))


def test_finite_buffer_without_pause_drops() -> None:
    edge = OtnEdge(config("drop", buffer=300_000))
    released = blast(edge)
    assert edge.counters.drops > 0 and edge.counters.pauses == 0
    assert sum(r is None for r in released) == edge.counters.drops
    assert edge.counters.buffer_peak_bytes <= 300_000


def test_deep_queue_delays_instead() -> None:
    edge = OtnEdge(config("queue"))
    blast(edge, seconds=0.5)
    c = edge.counters
    assert c.drops == 0 and c.pauses == 0
    # after 0.5 s at twice the drain rate, the last packet waits about 0.5 s behind the rest
    assert c.queue_delay_max_s == pytest.approx(0.5, rel=0.05)


def test_uncongested_edge_changes_nothing() -> None:
    edge = OtnEdge(config("pfc", drain=RATE))
    released = blast(edge, seconds=0.2)
    assert released == [pytest.approx(i * GAP + HOLD, abs=1e-9) for i in range(len(released))]
    assert edge.counters.pauses == 0


def test_lossy_class_is_dropped_above_xoff_lossless_never() -> None:
    edge = OtnEdge(config("pfc"))
    blast(edge, lossy_every=3)
    assert edge.counters.lossy_drops > 0
    assert edge.counters.drops == 0


class DeafPort(OtnEdge):
    """A fault: the PAUSE reaches the sender and is ignored."""

    def _resolve_pause(self) -> None:
        self.pause_at = None
        self.pause_log = None


def test_a_pause_that_does_not_stop_the_sender_shows() -> None:
    edge = DeafPort(config("pfc"))
    blast(edge)
    assert edge.counters.drops > 0
    assert edge.counters.buffer_peak_bytes > edge.config.xoff_bytes + edge.config.headroom_bytes - FRAME
