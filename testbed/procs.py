"""Find and stop processes by PID: those inside given network namespaces, or recorded by PID + start time."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterable

from testbed.state import ProcessRecord, process_is_zombie, process_start_ticks


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
        targets = {p: t for p, t in targets.items() if _same_process_alive(p, t)}
        if not targets:
            return []
        time.sleep(0.02)
    for pid in targets:
        _signal(pid, signal.SIGKILL)
    return list(targets)


def terminate_records(records: Iterable[ProcessRecord], grace_s: float = 3.0) -> list[int]:
    """Stop recorded processes that are still the same process (PID reuse is detected by start time)."""
    return terminate([r.pid for r in records if r.alive()], grace_s)


def _same_process_alive(pid: int, ticks: int | None) -> bool:
    return process_start_ticks(pid) == ticks and not process_is_zombie(pid)


def _signal(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)
