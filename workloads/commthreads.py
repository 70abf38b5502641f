"""The worker's communication threads (gloo's I/O loop and PyTorch's gloo work threads), found by name in
/proc/self/task, and their scheduling: under SCHED_FIFO a message that arrives is taken off the socket at
once, instead of when the computing thread's time slice ends (the delay it adds is what
`make bench-overhead --compare comm` measures)."""

from __future__ import annotations

import os

COMM_THREAD_PREFIXES = ("gloo", "pt_gloo")
DEFAULT_COMM_PRIORITY = "normal"
"""What runs use unless told (make bench-overhead --compare comm)."""
REALTIME_PRIORITY = 5
"""Below the delay daemons' (testbed/shaping/delayline.py): the link's timing comes first."""


def comm_threads() -> list[int]:
    """Thread ids of this process's communication threads."""
    found = []
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                name = f.read().strip()
        except OSError:
            continue
        if name.startswith(COMM_THREAD_PREFIXES):
            found.append(int(tid))
    return found


def set_comm_priority(priority: str) -> list[int]:
    """Put the communication threads at `priority` (normal | realtime); returns those changed. A kernel that
    refuses SCHED_FIFO raises PermissionError with what to do."""
    if priority not in ("normal", "realtime"):
        raise ValueError(f"unknown communication priority {priority!r}: use normal or realtime")
    if priority == "normal":
        return []
    changed = []
    for tid in comm_threads():
        try:
            os.sched_setscheduler(tid, os.SCHED_FIFO, os.sched_param(REALTIME_PRIORITY))
        except PermissionError:
            raise PermissionError("SCHED_FIFO refused for the communication threads: run as root (or with "
                                  "CAP_SYS_NICE), or use comm priority normal") from None
        except ProcessLookupError:
            continue
        changed.append(tid)
    return changed


def set_comm_affinity(affinity: str) -> list[int]:
    """own: leave the communication threads on the worker's core; any: let them run on every core the machine
    has (the computing thread stays pinned). Returns the threads changed."""
    if affinity not in ("own", "any"):
        raise ValueError(f"unknown communication affinity {affinity!r}: use own or any")
    if affinity == "own":
        return []
    cores = set(range(os.cpu_count() or 1))
    changed = []
    for tid in comm_threads():
        try:
            os.sched_setaffinity(tid, cores)
        except ProcessLookupError:
            continue
        changed.append(tid)
    return changed


def uncap_comm_threads(threads_file: str) -> list[int]:
    """Move the communication threads out of the worker's CPU cap (a dilated run): each thread id is written
    to `threads_file` (cgroup v1 `tasks` of an uncapped group, or v2 `cgroup.threads`)."""
    moved = []
    for tid in comm_threads():
        try:
            with open(threads_file, "w") as f:
                f.write(str(tid))
        except ProcessLookupError:
            continue
        moved.append(tid)
    return moved
