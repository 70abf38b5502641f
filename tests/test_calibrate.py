"""The netem shaper's calibration check, driven by scripted readings (the measured path is the VM tier's)."""

from __future__ import annotations

import pytest

from testbed.plan import build_plan
from testbed.shaping import calibrate
from testbed.topology import load_topology
from testbed.util.paths import TOPOLOGY_DIR


@pytest.fixture
def direction():
    return build_plan(load_topology(TOPOLOGY_DIR / "2dc-1000km.yaml")).directions[0]


def scripted(monkeypatch: pytest.MonkeyPatch, readings: list[float]) -> list[float]:
    """excess_one_way returns `readings` in order; the holds it was asked at are returned for inspection."""
    holds: list[float] = []

    def fake(_backend, _direction, hold: float) -> float:
        holds.append(hold)
        return readings.pop(0)

    monkeypatch.setattr(calibrate, "excess_one_way", fake)
    return holds


def test_agreeing_reading_keeps_the_later(monkeypatch, direction) -> None:
    """One rule for every calibration (calibrate.agreed): of two readings that agree, the later, taken at the
    hold that will be kept."""
    holds = scripted(monkeypatch, [0.45e-3])
    assert calibrate.confirmed_excess(None, direction, 0.40e-3, 100e-6) == 0.45e-3
    assert holds == [pytest.approx(direction.delay_s - 0.40e-3)]


def test_a_disturbed_first_calibration_is_outvoted(monkeypatch, direction) -> None:
    """CI, 2026-12-04: the first reading was ~1 ms high; kept, it would deliver the delay 1 ms short."""
    holds = scripted(monkeypatch, [0.02e-3, 0.05e-3])
    assert calibrate.confirmed_excess(None, direction, 1.04e-3, 100e-6) == pytest.approx(0.05e-3)
    assert len(holds) == 2


def test_one_disturbed_confirmation_moves_nothing(monkeypatch, direction) -> None:
    scripted(monkeypatch, [1.5e-3, 0.42e-3])
    assert calibrate.confirmed_excess(None, direction, 0.40e-3, 100e-6) == pytest.approx(0.42e-3)


# -- the delay line's closed-loop trim (the same rule, at the hold it keeps) ---------------------------------


def trimmed(monkeypatch: pytest.MonkeyPatch, first_s: float, readings: list[float]) -> tuple[float, int]:
    """The calibration the delay line keeps for one direction after its trim, given the first calibration and
    the scripted readings at the kept hold; and how many readings the trim took."""
    from types import SimpleNamespace

    from testbed.shaping import delayline_shaper
    from testbed.state.records import DaemonFiles, ShaperRecord

    plan = build_plan(load_topology(TOPOLOGY_DIR / "2dc-1000km.yaml"))
    d = plan.directions[0]
    record = ShaperRecord(name="delayline", calibration_s={d.label: first_s},
                          daemons={d.dst_node: DaemonFiles(config="/nonexistent", stats="", log="")})
    backend = SimpleNamespace(state=SimpleNamespace(shaper=record, plan=plan, save=lambda: None))
    taken: list[float] = []

    def fake(_backend, _direction, hold: float) -> float:
        taken.append(hold)
        return readings.pop(0)

    monkeypatch.setattr(delayline_shaper, "excess_one_way", fake)
    shaper = delayline_shaper.DelaylineShaper(backend)
    monkeypatch.setattr(shaper, "_fresh_counters", lambda _node: {})
    monkeypatch.setattr(shaper, "_write_config", lambda *_a, **_k: None)
    monkeypatch.setattr(shaper, "_reload", lambda _node: None)
    shaper._trim({d.dst_node: [d]})
    assert all(h == pytest.approx(d.delay_s - first_s) for h in taken)       # every reading at the kept hold
    return record.calibration_s[d.label], len(taken)


def test_trim_corrects_a_small_steady_residual_with_one_reading(monkeypatch) -> None:
    assert trimmed(monkeypatch, 0.10e-3, [0.13e-3]) == (pytest.approx(0.13e-3), 1)


def test_one_disturbed_trim_reading_moves_nothing(monkeypatch) -> None:
    """CI, 2026-12-04: a single trim reading 166-307 us high, kept, delivered 4.834 ms for 5 ms."""
    assert trimmed(monkeypatch, 0.10e-3, [0.41e-3, 0.13e-3]) == (pytest.approx(0.13e-3), 2)


def test_a_steady_offset_at_the_longer_hold_is_kept(monkeypatch) -> None:
    """CI, 2026-12-03: +135-183 us at 4-5 ms holds in every round: two readings at the kept hold agree."""
    assert trimmed(monkeypatch, 0.10e-3, [0.26e-3, 0.25e-3]) == (pytest.approx(0.25e-3), 2)
