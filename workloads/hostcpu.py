"""Where the whole machine's CPU went over one iteration, read by the worker at the iteration's edges (so the
window is exactly the iteration's, not a sampler's tick): /proc/stat's per-state time summed over the CPUs
the worker may run on, and the CPU of named groups of the run's other processes (the delay daemons, the
runner) given by PID, each with its descendants. Together with each rank's own threads
(workloads/threadclock.py) it is the CPU ledger of testbed/run/breakdown.py."""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass, field
from typing import Any

STATES = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")
"""The first eight columns of a /proc/stat cpu line."""


@dataclass(slots=True)
class HostWindow:
    """CPU seconds over one window, summed over every CPU of the machine."""

    wall_s: float
    cpus: int
    states: dict[str, float] = field(default_factory=dict)
    """Per /proc/stat state (user, system, idle, softirq, steal, ...), seconds over all CPUs (tick-sampled)."""
    groups: dict[str, float] = field(default_factory=dict)
    """Per watched group (e.g. `delay daemons`, `runner`): CPU seconds of its processes and their children."""

    @property
    def capacity_s(self) -> float:
        return self.wall_s * self.cpus

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> HostWindow:
        return cls(**data)


@dataclass(frozen=True, slots=True)
class WatchGroup:
    """Processes of the run whose CPU is recorded under one name."""

    name: str
    pids: list[int]
    children: bool = True
    """Count their descendants too (a supervisor's daemon); False for the runner, whose children are the workers."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> WatchGroup:
        return cls(**data)


@dataclass(frozen=True, slots=True)
class HostReading:
    wall: float
    states: tuple[float, ...]
    groups: dict[str, float]


class HostCpu:
    """Reads the machine's CPU states and the watched groups' CPU; `window(a, b)` is what happened between."""

    def __init__(self, groups: list[WatchGroup] | None = None) -> None:
        self.groups = groups or []
        self.tick = os.sysconf("SC_CLK_TCK")
        self.cpus = os.cpu_count() or 1

    def read(self) -> HostReading:
        with open("/proc/stat") as f:
            first = f.readline().split()
        states = tuple(int(x) / self.tick for x in first[1:1 + len(STATES)])
        return HostReading(time.monotonic(), states, {g.name: tree_cpu_s(g.pids, g.children) for g in self.groups})

    def window(self, a: HostReading, b: HostReading) -> HostWindow:
        return HostWindow(wall_s=b.wall - a.wall, cpus=self.cpus,
                          states={s: y - x for s, x, y in zip(STATES, a.states, b.states, strict=False)},
                          groups={name: max(0.0, b.groups[name] - a.groups.get(name, 0.0)) for name in b.groups})


def tree_cpu_s(pids: list[int], children: bool = True) -> float:
    """CPU seconds (schedstat, nanosecond exact) of every thread of these processes (and their descendants);
    processes gone are skipped."""
    total, todo, seen = 0.0, list(pids), set()
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.add(pid)
        base = f"/proc/{pid}/task"
        try:
            tids = os.listdir(base)
        except OSError:
            continue
        for tid in tids:
            try:
                with open(f"{base}/{tid}/schedstat") as f:
                    total += int(f.read().split()[0]) / 1e9
                if children:
                    with open(f"{base}/{tid}/children") as f:
                        todo += [int(c) for c in f.read().split()]
            except (OSError, ValueError):
                continue
    return total
