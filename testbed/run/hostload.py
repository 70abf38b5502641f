"""What else the host did during a run, from /proc (cf. Mininet-HiFi's invariant monitoring): CPU steal by
the hypervisor, the run queue, the delay daemons' CPU. A run is `disturbed` when steal took more than
STEAL_BOUND of the CPU time: its figures measure the host, not the schedule, and the runner repeats it."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

STEAL_BOUND = 0.05
"""Fraction of all CPU time taken by the hypervisor above which a run counts as disturbed."""


@dataclass(kw_only=True, slots=True)
class HostLoad:
    wall_s: float
    steal_fraction: float
    """Of all CPU time during the run (every core), what the hypervisor took."""
    run_queue_mean: float
    """Runnable tasks (all threads, the run's own included), sampled every supervision tick."""
    run_queue_max: int
    daemon_cpu_fraction: float | None
    """Delay daemons' CPU over the run, in cores (None without a delay line)."""
    disturbed: bool
    reasons: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> HostLoad:
        return cls(**data)


def _cpu_times(stat: Path) -> list[int]:
    fields = stat.read_text().split("\n", 1)[0].split()
    return [int(x) for x in fields[1:]]


def _procs_running(stat: Path) -> int:
    for line in stat.read_text().splitlines():
        if line.startswith("procs_running"):
            return int(line.split()[1])
    return 0


class LoadMonitor:
    """Start before a run, `sample()` while it runs, `finish()` after it."""

    def __init__(self, daemon_cpu_s: Any = None, stat: Path = Path("/proc/stat")) -> None:
        self.stat, self.daemon_cpu_s = stat, daemon_cpu_s
        self.start_times = _cpu_times(stat)
        self.start = time.monotonic()
        self.daemons_before = daemon_cpu_s() if daemon_cpu_s else None
        self.queue: list[int] = []

    def sample(self) -> None:
        self.queue.append(_procs_running(self.stat))

    def finish(self) -> HostLoad:
        end = _cpu_times(self.stat)
        wall = time.monotonic() - self.start
        delta = [b - a for a, b in zip(self.start_times, end, strict=False)]
        total = sum(delta[:8]) or 1                  # user nice system idle iowait irq softirq steal
        steal = delta[7] / total if len(delta) > 7 else 0.0
        daemons = None
        if self.daemon_cpu_s and self.daemons_before is not None:
            after = self.daemon_cpu_s()
            daemons = None if after is None else max(0.0, after - self.daemons_before) / max(wall, 1e-9)
        reasons = [f"CPU steal {steal:.1%} > {STEAL_BOUND:.0%}"] if steal > STEAL_BOUND else []
        queue = self.queue or [_procs_running(self.stat)]
        return HostLoad(wall_s=wall, steal_fraction=steal, run_queue_mean=sum(queue) / len(queue),
                        run_queue_max=max(queue), daemon_cpu_fraction=daemons, disturbed=bool(reasons),
                        reasons=reasons)
