"""Background traffic on the OTN: bulk flows between named hosts that share the links with the pipeline.

A topology's `background:` list, each item one load:

    background:
      - {from: dc-a-h2, to: dc-b-h2, flows: 2, rate: 80mbit, class: lossy}

`flows` bulk TCP flows (default 1) from one host to a host in another DC, at most `rate` in all (absent: as fast
as TCP and the path let them), of `class` lossless (default: the pipeline's class, paused by PFC like it) or
lossy (DSCP CS1, TOS 0x20: an edge with PFC drops it at XOFF instead of pausing for it). The runner starts every
load when the workers start and stops it when they end (testbed/run/background.py)."""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any

from testbed.util import units

BACKGROUND_KEYS = {"from", "to", "flows", "rate", "class"}
CLASSES = ("lossless", "lossy")
MAX_FLOWS = 64


@dataclass(frozen=True, slots=True)
class BackgroundLoad:
    """One background load: bulk TCP flows from `src` to `dst` (host names)."""

    src: str
    dst: str
    flows: int = 1
    rate_bps: float | None = None
    """The flows' total rate; None: unpaced (TCP fills what the path leaves)."""
    lossy: bool = False
    """DSCP CS1 (TOS 0x20): the class a PFC edge drops at XOFF rather than pausing for."""

    @property
    def label(self) -> str:
        return f"{self.src} -> {self.dst}"

    def describe(self) -> str:
        rate = f"at most {self.rate_bps / 1e6:g} Mbit/s" if self.rate_bps else "unpaced"
        return (f"{self.label}: {self.flows} bulk TCP flow{'s' if self.flows > 1 else ''}, {rate}, "
                f"{'lossy' if self.lossy else 'lossless'} class")


Problem3 = tuple[str, str, str]
"""(key path, what is wrong, the fix)."""


def parse_background(raw: Any, host_dc: dict[str, str]) -> tuple[list[BackgroundLoad], list[Problem3]]:
    """The `background:` list against the topology's hosts (`host_dc`: host -> its DC): the loads that
    validated, and every problem found (the loader refuses the file on any)."""
    if raw is None:
        return [], []
    if not isinstance(raw, list):
        return [], [("background", f"expected a list of loads, got {type(raw).__name__}",
                     "write 'background:' followed by '- {from: dc-a-h2, to: dc-b-h2}' items")]
    loads, problems = [], []
    for i, item in enumerate(raw):
        load, found = _parse_load(item, f"background[{i}]", host_dc)
        problems += found
        if load is not None:
            loads.append(load)
    return loads, problems


def _parse_load(item: Any, path: str, host_dc: dict[str, str]) -> tuple[BackgroundLoad | None, list[Problem3]]:
    if not isinstance(item, dict):
        return None, [(path, f"expected a mapping, got {item!r}", "write '{from: dc-a-h2, to: dc-b-h2, flows: 1}'")]
    problems: list[Problem3] = []
    for key in item:
        if key not in BACKGROUND_KEYS:
            close = difflib.get_close_matches(str(key), sorted(BACKGROUND_KEYS), n=1)
            problems.append((f"{path}.{key}", f"unknown key {key!r}", f"did you mean {close[0]!r}?" if close
                             else f"allowed keys: {', '.join(sorted(BACKGROUND_KEYS))}"))
    ends = [_host(item.get(end), f"{path}.{end}", host_dc, problems) for end in ("from", "to")]
    src, dst = ends
    if src is not None and dst is not None and host_dc[src] == host_dc[dst]:
        problems.append((f"{path}.to", f"{dst!r} is in {host_dc[dst]!r}, the same datacenter as {src!r}: the load "
                         "would not cross an OTN link", "name a host in another datacenter"))
    flows = item.get("flows", 1)
    if isinstance(flows, bool) or not isinstance(flows, int) or not 1 <= flows <= MAX_FLOWS:
        problems.append((f"{path}.flows", f"{flows!r} flows is not a count from 1 to {MAX_FLOWS}",
                         f"give 1 to {MAX_FLOWS} bulk flows"))
    rate = None
    if "rate" in item:
        try:
            rate = units.parse_rate(item["rate"])
            if rate <= 0:
                problems.append((f"{path}.rate", f"{item['rate']!r} is out of range", "it must be > 0"))
        except units.UnitError as exc:
            problems.append((f"{path}.rate", exc.problem, exc.fix))
    kind = item.get("class", "lossless")
    if kind not in CLASSES:
        problems.append((f"{path}.class", f"unknown traffic class {kind!r}",
                         "write 'lossless' (paused by PFC with the pipeline) or 'lossy' (DSCP CS1, dropped at XOFF)"))
    if problems or src is None or dst is None:
        return None, problems
    return BackgroundLoad(src, dst, int(flows), rate, kind == "lossy"), []


def _host(value: Any, path: str, host_dc: dict[str, str], problems: list[Problem3]) -> str | None:
    if value is None or not isinstance(value, str):
        problems.append((path, "missing host" if value is None else f"expected a host name, got {value!r}",
                         f"name one of: {', '.join(host_dc)}"))
        return None
    if value not in host_dc:
        close = difflib.get_close_matches(str(value), list(host_dc), n=1)
        problems.append((path, f"unknown host {value!r}", f"did you mean {close[0]!r}?" if close
                         else f"name one of the topology's hosts: {', '.join(host_dc)}"))
        return None
    return str(value)
