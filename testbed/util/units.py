"""Parse physical quantities the way users write them: `10gbit`, `400G`, `2.5ms`, `80km`, `64KiB`.

Every parser returns SI base units (bits/s, seconds, metres... here: km as float, bytes as int) and raises
`UnitError` with a message that says what was expected, so the loader can add the file and key path.
"""

from __future__ import annotations

import re

from testbed.errors import TestbedError

_NUMBER = r"([-+]?[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)"


class UnitError(TestbedError, ValueError):
    """A value could not be parsed as the expected quantity: what is wrong, and how to write it."""

    def __init__(self, problem: str, fix: str) -> None:
        super().__init__(problem, hint=fix)
        self.problem = problem
        self.fix = fix


_RATE_UNITS: dict[str, float] = {
    "": 1.0, "bit": 1.0,
    "k": 1e3, "kbit": 1e3,
    "m": 1e6, "mbit": 1e6,
    "g": 1e9, "gbit": 1e9,
    "t": 1e12, "tbit": 1e12,
}
_TIME_UNITS: dict[str, float] = {
    "s": 1.0, "sec": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9,
}
_DISTANCE_UNITS: dict[str, float] = {"km": 1.0, "m": 1e-3, "mi": 1.609344}
_SIZE_UNITS: dict[str, int] = {
    "": 1, "b": 1, "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3,
    "kib": 1024, "mib": 1024**2, "gib": 1024**3,
}


def _split(text: object, what: str, example: str) -> tuple[float, str]:
    if isinstance(text, bool):
        raise UnitError(f"expected a {what}, got {text!r}", f"write it like {example}")
    if isinstance(text, (int, float)):
        return float(text), ""
    if not isinstance(text, str):
        raise UnitError(f"expected a {what}, got {text!r}", f"write it like {example}")
    m = re.fullmatch(_NUMBER + r"\s*([a-zA-Zµ]*)", text.strip())
    if not m:
        raise UnitError(f"cannot parse {text!r} as a {what}", f"write it like {example}")
    return float(m.group(1)), m.group(2).lower()


def parse_rate(text: object) -> float:
    """Rate in bits/s. `10gbit`, `400G`, `100mbit`, `1e9` (bare numbers are bits/s)."""
    value, unit = _split(text, "rate", "'10gbit', '400G' or '100mbit'")
    if unit not in _RATE_UNITS:
        raise UnitError(f"unknown rate unit {unit!r} in {text!r}{_rate_hint(unit)}",
                        "use bit, kbit, mbit, gbit, tbit (or k/M/G/T), e.g. '10gbit'")
    return value * _RATE_UNITS[unit]


def _rate_hint(unit: str) -> str:
    if unit.endswith(("bps", "b", "byte", "bytes")):
        return " (ambiguous: Gbps, GBps, Gb and GB could mean bits or bytes; rates are written in bits, as in tc)"
    return ""


def parse_time(text: object) -> float:
    """Duration in seconds. `2.5ms`, `20us`, `1s`; a bare number is milliseconds (as tc/netem users expect)."""
    value, unit = _split(text, "duration", "'5ms', '20us' or '0.1ms'")
    if unit == "":
        return value * 1e-3
    if unit not in _TIME_UNITS:
        raise UnitError(f"unknown time unit {unit!r} in {text!r}", "use s, ms, us or ns, e.g. '2.5ms'")
    return value * _TIME_UNITS[unit]


def parse_distance_km(text: object) -> float:
    """Distance in km. `80km`, `1000`, `500mi`; a bare number is km."""
    value, unit = _split(text, "distance", "'1000km' or 1000")
    if unit == "":
        return value
    if unit not in _DISTANCE_UNITS:
        raise UnitError(f"unknown distance unit {unit!r} in {text!r}", "use km, m or mi, e.g. '80km'")
    return value * _DISTANCE_UNITS[unit]


def parse_size(text: object) -> int:
    """Size in bytes. `64KiB`, `16MB`, `1500`."""
    value, unit = _split(text, "size", "'64KiB' or 1500")
    if unit not in _SIZE_UNITS:
        raise UnitError(f"unknown size unit {unit!r} in {text!r}", "use B, KB, MB, GB, KiB, MiB or GiB")
    return int(round(value * _SIZE_UNITS[unit]))


_COUNT_UNITS: dict[str, int] = {"": 1, "k": 1000, "m": 1000**2, "g": 1000**3, "ki": 1024, "mi": 1024**2,
                                "gi": 1024**3}


def parse_count(text: object) -> int:
    """A whole count of at least 1, such as tokens per step: `262144`, `256Ki`, `1Mi`, `4M`."""
    value, unit = _split(text, "count", "'1Mi' or 262144")
    if unit not in _COUNT_UNITS:
        raise UnitError(f"unknown count unit {unit!r} in {text!r}", "use K, M, G (powers of 1000) or Ki, Mi, Gi")
    count = value * _COUNT_UNITS[unit]
    if count < 1 or count != int(count):
        raise UnitError(f"{text!r} is not a whole count of at least 1", "write it like '1Mi' or 262144")
    return int(count)


def parse_fraction(text: object) -> float:
    """A probability in [0, 1]: `0.1%` or `0.001`."""
    if isinstance(text, str) and text.strip().endswith("%"):
        value, _ = _split(text.strip()[:-1], "percentage", "'0.1%'")
        return value / 100.0
    value, unit = _split(text, "fraction", "'0.1%' or 0.001")
    if unit:
        raise UnitError(f"cannot parse {text!r} as a fraction", "write '0.1%' or 0.001")
    return value


def format_rate(bps: float) -> str:
    """Human rate: 1e9 -> '1 Gbit/s'."""
    for unit, scale in (("Tbit/s", 1e12), ("Gbit/s", 1e9), ("Mbit/s", 1e6), ("kbit/s", 1e3)):
        if bps >= scale:
            return f"{bps / scale:g} {unit}"
    return f"{bps:g} bit/s"


def format_time(seconds: float) -> str:
    """Human duration: 0.005 -> '5 ms'."""
    if seconds == 0:
        return "0"
    if seconds >= 1:
        return f"{seconds:.3g} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.4g} ms"
    return f"{seconds * 1e6:.4g} us"


def format_size(n: float) -> str:
    """Human size in binary units: 1048576 -> '1 MiB'."""
    for unit, scale in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{int(n)} B"
