import pytest

from testbed.util import units


@pytest.mark.parametrize(("text", "bps"), [("10gbit", 10e9), ("400G", 400e9), ("100mbit", 100e6),
                                          ("2.5Gbit", 2.5e9), ("1e9", 1e9), (1000, 1000), ("10 mbit", 10e6)])
def test_rates(text: object, bps: float) -> None:
    assert units.parse_rate(text) == pytest.approx(bps)


@pytest.mark.parametrize("text", ["10Gbps", "10GB", "fast", "10gbits/s", True, None])
def test_bad_rates(text: object) -> None:
    with pytest.raises(units.UnitError) as err:
        units.parse_rate(text)
    assert err.value.fix


@pytest.mark.parametrize(("text", "seconds"), [("2.5ms", 2.5e-3), ("20us", 20e-6), ("1s", 1.0), (5, 5e-3),
                                              ("0.1ms", 1e-4)])
def test_times(text: object, seconds: float) -> None:
    assert units.parse_time(text) == pytest.approx(seconds)


def test_distance_and_size_and_fraction() -> None:
    assert units.parse_distance_km("80km") == 80
    assert units.parse_distance_km(1000) == 1000
    assert units.parse_distance_km("500m") == pytest.approx(0.5)
    assert units.parse_size("64KiB") == 65536
    assert units.parse_fraction("0.1%") == pytest.approx(0.001)
    with pytest.raises(units.UnitError):
        units.parse_distance_km("3 lightyears")


def test_format() -> None:
    assert units.format_rate(1e9) == "1 Gbit/s"
    assert units.format_time(0.005) == "5 ms"
    assert units.format_size(1024 * 1024) == "1 MiB"
