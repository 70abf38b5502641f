"""Processes by PID: start time (to detect PID reuse), liveness, those inside given network namespaces, and
stopping them (SIGTERM, then SIGKILL). Never by name or pattern."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterable


def process_start_ticks(pid: int) -> int | None:
    """Start time of a process in clock ticks since boot (field 22 of /proc/PID/stat), None if gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])


def process_is_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except (FileNotFoundError, ProcessLookupError):
        return True


def same_process_alive(pid: int, start_ticks: int | None) -> bool:
    """Still the process that started at `start_ticks` (PID not reused) and not a zombie."""
    return start_ticks is not None and process_start_ticks(pid) == start_ticks and not process_is_zombie(pid)


def pids_in_netns(inodes: Iterable[int]) -> list[int]:
    """PIDs of processes whose network namespace is one of these (by inode, as in /proc/PID/ns/net)."""
    wanted = set(inodes)
    found = []
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            ino = os.stat(f"/proc/{entry}/ns/net").st_ino
        except (FileNotFoundError, PermissionError, ProcessLookupError):
            continue
        if ino in wanted:
            found.append(int(entry))
    return found


def terminate(pids: Iterable[int], grace_s: float = 3.0) -> list[int]:
    """SIGTERM, wait up to `grace_s`, then SIGKILL. Returns the PIDs that had to be killed."""
    targets = {pid: process_start_ticks(pid) for pid in pids}
    targets = {pid: t for pid, t in targets.items() if t is not None}
    for pid in targets:
        _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        targets = {p: t for p, t in targets.items() if same_process_alive(p, t)}
        if not targets:
            return []
        time.sleep(0.02)
    for pid in targets:
        _signal(pid, signal.SIGKILL)
    return list(targets)


def _signal(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)
