"""Where a thread's wall time went, from the kernel: CPU it ran (CLOCK_THREAD_CPUTIME_ID, exact to the
nanosecond) and time it sat runnable but not running (`run_delay` of /proc/thread-self/schedstat, exact
for the thread reading it, since it is running). Wall - CPU - run-queue wait is time the thread was blocked
(sleeping on a socket, a futex, a page). The executor reads it at every span's edges, so each compute span
says how much of its stretch was other threads on its core (run queue) and how much was its own slower
work (CPU); a host without schedstat gives CPU only (`run_delay_available` False)."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ThreadTimes:
    """One reading of the calling thread's clocks (seconds)."""

    wall: float
    """time.monotonic()."""
    cpu: float
    """CPU this thread has run, user + system."""
    runq: float
    """Time this thread has waited on a run queue while runnable (0 where schedstat is missing)."""


class ThreadClock:
    """Reads the calling thread's clocks; open it on the thread it measures (the schedstat file is that
    thread's). Each `now()` costs two system calls (~2-4 us)."""

    def __init__(self) -> None:
        try:
            self._fd: int | None = os.open("/proc/thread-self/schedstat", os.O_RDONLY)
        except OSError:
            self._fd = None

    @property
    def run_delay_available(self) -> bool:
        return self._fd is not None

    def now(self) -> ThreadTimes:
        runq = 0.0
        if self._fd is not None:
            runq = int(os.pread(self._fd, 96, 0).split()[1]) / 1e9
        return ThreadTimes(time.monotonic(), time.thread_time(), runq)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


@dataclass(slots=True)
class ThreadUsage:
    """CPU and run-queue wait of one group of a process's threads over an interval (seconds)."""

    name: str
    """`main` (the thread that computes), else the threads' name (`comm`), e.g. gloo's I/O threads."""
    threads: int
    cpu_s: float
    runq_s: float


def process_threads(pid: int | str = "self") -> dict[int, tuple[str, float, float]]:
    """Every thread of a process: tid -> (name, CPU seconds, run-queue seconds), from its schedstat."""
    out: dict[int, tuple[str, float, float]] = {}
    base = f"/proc/{pid}/task"
    try:
        tids = os.listdir(base)
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"{base}/{tid}/schedstat") as f:
                run_ns, wait_ns = f.read().split()[:2]
            with open(f"{base}/{tid}/comm") as f:
                name = f.read().strip()
        except (OSError, ValueError):
            continue                                   # a thread that ended between listing and reading
        out[int(tid)] = (name, int(run_ns) / 1e9, int(wait_ns) / 1e9)
    return out


def thread_usage(before: dict[int, tuple[str, float, float]], after: dict[int, tuple[str, float, float]],
                 main_tid: int) -> list[ThreadUsage]:
    """What each group of threads used between two `process_threads` readings (threads born in between
    count from zero), the main thread as `main`, largest CPU first."""
    groups: dict[str, ThreadUsage] = {}
    for tid, (name, cpu, runq) in after.items():
        _, cpu0, runq0 = before.get(tid, (name, 0.0, 0.0))
        key = "main" if tid == main_tid else name
        usage = groups.setdefault(key, ThreadUsage(key, 0, 0.0, 0.0))
        usage.threads += 1
        usage.cpu_s += max(0.0, cpu - cpu0)
        usage.runq_s += max(0.0, runq - runq0)
    return sorted(groups.values(), key=lambda u: -u.cpu_s)
