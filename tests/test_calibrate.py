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


def test_agreeing_reading_keeps_the_first(monkeypatch, direction) -> None:
    holds = scripted(monkeypatch, [0.45e-3])
    assert calibrate.confirmed_excess(None, direction, 0.40e-3, 100e-6) == 0.40e-3
    assert holds == [pytest.approx(direction.delay_s - 0.40e-3)]


def test_a_disturbed_first_calibration_is_outvoted(monkeypatch, direction) -> None:
    """CI, 2026-12-04: the first reading was ~1 ms high; kept, it would deliver the delay 1 ms short."""
    holds = scripted(monkeypatch, [0.02e-3, 0.05e-3])
    assert calibrate.confirmed_excess(None, direction, 1.04e-3, 100e-6) == pytest.approx(0.05e-3)
    assert len(holds) == 2


def test_one_disturbed_confirmation_moves_nothing(monkeypatch, direction) -> None:
    scripted(monkeypatch, [1.5e-3, 0.42e-3])
    assert calibrate.confirmed_excess(None, direction, 0.40e-3, 100e-6) == pytest.approx(0.42e-3)
