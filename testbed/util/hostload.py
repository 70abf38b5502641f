"""What else the host did during a run, from /proc (cf. Mininet-HiFi's invariant monitoring): CPU steal by
the hypervisor, CPU used by processes that are not the run's (busy time less the workers', the runner's and
the delay daemons'), the run queue, the delay daemons' CPU. A run is `disturbed` when steal took more than
STEAL_BOUND or foreign processes more than FOREIGN_BOUND of the CPU time: its figures then measure the
host, not the schedule, and the runner repeats it."""

from __future__ import annotations

import os
import resource
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

HOST_DRIFT_BOUND = 0.10
"""A run whose reference pass (each stage's F+B alone, all stages at once, no communication) ran more than this
fraction more or less CPU after its iterations than before them is disturbed: the host's speed changed under
it (on the project's 2-core VMs a fixed F+B pass varies from 1.96 to 2.72 s of CPU over two minutes with
nothing else running), and it is measured again like any disturbed run (testbed/run/attempts.py)."""
COMPUTE_SLOWDOWN_FLAG = 0.10
"""A run whose compute spans ran more CPU than its reference by this fraction is flagged in the run table: that
slowdown happened inside the run (caches, softirqs served in the workers' context, cores shared with the
emulator), so it is the run's own cost, not the host's speed, and the breakdown carries it."""
STEAL_BOUND = 0.05
"""Fraction of all CPU time taken by the hypervisor above which a run counts as disturbed."""
FOREIGN_BOUND = 0.10
"""Fraction of all CPU time used by processes other than the run's above which a run counts as disturbed."""


@dataclass(kw_only=True, slots=True)
class HostLoad:
    wall_s: float
    steal_fraction: float
    """Of all CPU time during the run (every core), what the hypervisor took."""
    foreign_fraction: float = 0.0
    """Of all CPU time, what processes other than the run's used (user + system time; interrupts excluded)."""
    run_queue_mean: float
    """Runnable tasks (all threads, the run's own included), sampled every supervision tick."""
    run_queue_max: int
    daemon_cpu_fraction: float | None
    """Delay daemons' CPU over the run, in cores (None without a delay line)."""
    disturbed: bool
    reasons: list[str] = field(default_factory=list)
    foreign_measured: bool = True
    """False where other processes cannot be told from the run's (workers on remote machines): then
    foreign_fraction is 0 by construction, not by measurement, and tables say so."""
    compute_slowdown: float | None = None
    """Largest over stages of the compute spans' CPU over the same run's reference, less 1: the run's own cost
    (None: not measured)."""
    host_drift: float | None = None
    """The reference after the iterations against the one before them, less 1, the largest in size over stages
    (CPU time): the host's own change of speed during the run (None: not measured, or compute as time)."""

    @property
    def lost_fraction(self) -> float:
        """CPU time the run did not get: steal plus other processes."""
        return self.steal_fraction + self.foreign_fraction

    @property
    def drifted(self) -> bool:
        """The host's speed changed during the run by more than HOST_DRIFT_BOUND (its reference moved)."""
        return self.host_drift is not None and abs(self.host_drift) > HOST_DRIFT_BOUND

    @property
    def slowed(self) -> bool:
        """The run's compute ran more than COMPUTE_SLOWDOWN_FLAG slower than alone (its own cost)."""
        return self.compute_slowdown is not None and self.compute_slowdown > COMPUTE_SLOWDOWN_FLAG

    def judge_drift(self, host_drift: float | None) -> None:
        """Record the host's drift over the run; beyond HOST_DRIFT_BOUND the run is disturbed, with why."""
        self.host_drift = host_drift
        if self.drifted:
            self.disturbed = True
            self.reasons.append(f"the host's speed changed during the run: its reference moved {host_drift:+.1%} "
                                f"between before and after (bound {HOST_DRIFT_BOUND:.0%})")

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "drifted": self.drifted}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> HostLoad:
        data = dict(data)
        if "compute_drift" in data:         # releases before 2026-12-06 called the spans' slowdown a drift
            data["compute_slowdown"] = data.pop("compute_drift")
        return cls(**{k: v for k, v in data.items() if k != "drifted"})


def _own_cpu_s() -> float:
    """CPU seconds of this process and its reaped children (the workers, once waited for)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _cpu_times(stat: Path) -> list[int]:
    fields = stat.read_text().split("\n", 1)[0].split()
    return [int(x) for x in fields[1:]]


def steal_fraction(before: list[int], after: list[int]) -> float:
    """Of all CPU time between two readings of /proc/stat's `cpu` line, what the hypervisor took (the first
    eight fields: user nice system idle iowait irq softirq steal; guest time is already in user)."""
    delta = [b - a for a, b in zip(before, after, strict=False)]
    total = sum(delta[:8])
    return delta[7] / total if total > 0 and len(delta) > 7 else 0.0


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
        self.own_before = _own_cpu_s()
        self.queue: list[int] = []

    def sample(self) -> None:
        self.queue.append(_procs_running(self.stat))

    def finish(self) -> HostLoad:
        end = _cpu_times(self.stat)
        wall = time.monotonic() - self.start
        delta = [b - a for a, b in zip(self.start_times, end, strict=False)]
        total = sum(delta[:8]) or 1                  # user nice system idle iowait irq softirq steal
        steal = steal_fraction(self.start_times, end)
        daemons, daemon_s = None, 0.0
        if self.daemon_cpu_s and self.daemons_before is not None:
            after = self.daemon_cpu_s()
            daemon_s = 0.0 if after is None else max(0.0, after - self.daemons_before)
            daemons = None if after is None else daemon_s / max(wall, 1e-9)
        tick = os.sysconf("SC_CLK_TCK")
        busy_s = (delta[0] + delta[1] + delta[2]) / tick               # user nice system, every core
        own_s = _own_cpu_s() - self.own_before + daemon_s
        foreign = max(0.0, busy_s - own_s) / (total / tick)
        reasons = [f"CPU steal {steal:.1%} > {STEAL_BOUND:.0%}"] if steal > STEAL_BOUND else []
        if foreign > FOREIGN_BOUND:
            reasons.append(f"other processes used {foreign:.1%} > {FOREIGN_BOUND:.0%} of the CPU")
        queue = self.queue or [_procs_running(self.stat)]
        return HostLoad(wall_s=wall, steal_fraction=steal, foreign_fraction=foreign,
                        run_queue_mean=sum(queue) / len(queue),
                        run_queue_max=max(queue), daemon_cpu_fraction=daemons, disturbed=bool(reasons),
                        reasons=reasons)
