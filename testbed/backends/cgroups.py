"""CPU caps for the run's processes (time dilation, testbed/run/dilation.py): one cgroup per capped worker
with a CFS bandwidth limit, on cgroup v2 (`cpu.max`) or, where the cpu controller is still on v1 (hybrid
hierarchies, as on this project's machines), on v1 (`cpu.cfs_quota_us` / `cpu.cfs_period_us`).

Every cgroup is named `testbed-<testbed>-<what>`, recorded in the testbed's state before it is made, and
removed by name (after its processes are stopped) at the end of the run or by `testbed down`."""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass
from pathlib import Path

from testbed.errors import TestbedError

CGROUP_ROOT = Path(os.environ.get("TESTBED_CGROUP_ROOT", "/sys/fs/cgroup"))


class CgroupError(TestbedError, RuntimeError):
    """CPU caps are not available here; the message says what is missing and what to do."""


@dataclass(frozen=True, slots=True)
class CpuController:
    """Where CPU caps are made: the hierarchy that has the cpu controller."""

    root: Path
    version: int

    def path(self, name: str) -> Path:
        return self.root / name


def cpu_controller(root: Path = CGROUP_ROOT) -> CpuController:
    """The cgroup hierarchy with the cpu controller, or CgroupError naming what is missing."""
    controllers = root / "cgroup.controllers"
    if controllers.exists() and "cpu" in controllers.read_text().split():
        subtree = root / "cgroup.subtree_control"
        if "cpu" not in subtree.read_text().split():
            try:
                subtree.write_text("+cpu")
            except OSError as exc:
                raise CgroupError(f"cgroup v2 at {root}: cannot enable the cpu controller for child groups "
                                  f"({exc}); run as root outside a delegated cgroup") from None
        return CpuController(root, 2)
    for name in ("cpu", "cpu,cpuacct", "cpuacct,cpu"):
        v1 = root / name
        if (v1 / "cpu.cfs_quota_us").exists():
            return CpuController(v1, 1)
    raise CgroupError(f"no cgroup cpu controller under {root} (neither cgroup v2 with 'cpu' in cgroup.controllers "
                      "nor a v1 cpu hierarchy with CFS bandwidth control): time dilation needs one "
                      "(CONFIG_CFS_BANDWIDTH); run without --dilation")


@dataclass(frozen=True, slots=True)
class WorkerCap:
    """Where a capped worker goes: the process into `procs` (capped), its communication threads into
    `threads` (not capped: a throttled worker must not hold up the messages it receives)."""

    group: Path
    """The cgroup made for the worker (removed afterwards, with what is inside it)."""
    procs: Path
    """Write the worker's PID here (all its threads move, capped)."""
    threads: Path
    """Write a thread id here to take that thread out of the cap."""


def create_worker_cap(controller: CpuController, name: str, cores: float, period_s: float) -> WorkerCap:
    """A cgroup for one worker allowed `cores` of CPU per `period_s` (CFS bandwidth control), and a place
    for its communication threads outside the cap: on v1 the hierarchy's root (threads move freely there);
    on v2 a threaded subtree, `name/compute` capped and `name/comm` not."""
    period_us = int(period_s * 1e6)
    quota_us = max(1000, int(cores * period_us))
    group = controller.path(name)
    group.mkdir(exist_ok=True)
    if controller.version == 1:
        (group / "cpu.cfs_period_us").write_text(str(period_us))
        (group / "cpu.cfs_quota_us").write_text(str(quota_us))
        return WorkerCap(group, group / "cgroup.procs", controller.root / "tasks")
    (group / "cgroup.subtree_control").write_text("+cpu")
    compute, comm = group / "compute", group / "comm"
    for child in (compute, comm):
        child.mkdir(exist_ok=True)
        (child / "cgroup.type").write_text("threaded")
    (compute / "cpu.max").write_text(f"{quota_us} {period_us}")
    return WorkerCap(group, compute / "cgroup.procs", comm / "cgroup.threads")


def throttled_s(path: Path) -> float | None:
    """Seconds the cgroup spent throttled so far (cpu.stat), None where unreadable."""
    try:
        text = (path / "cpu.stat").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == "throttled_usec":
            return int(value) / 1e6
        if key == "throttled_time":
            return int(value) / 1e9
    return None


def remove(path: Path, timeout_s: float = 5.0) -> None:
    """Remove a cgroup by path, child groups first; its processes must be gone (those that linger are waited
    for, briefly)."""
    if path.is_dir():
        for child in (c for c in path.iterdir() if c.is_dir()):
            remove(child, timeout_s)
    deadline = time.monotonic() + timeout_s
    while path.exists():
        try:
            path.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError as exc:
            if time.monotonic() > deadline:
                raise CgroupError(f"cannot remove cgroup {path}: {exc} (processes still in it: "
                                  f"{_members(path) or 'none listed'})") from None
            time.sleep(0.05)


def remove_all(paths: list[str]) -> list[str]:
    """Remove every recorded cgroup that exists; returns the problems (empty: all gone)."""
    problems = []
    for p in paths:
        with contextlib.suppress(FileNotFoundError):
            try:
                remove(Path(p))
            except CgroupError as exc:
                problems.append(str(exc))
    return problems


def _members(path: Path) -> str:
    try:
        return " ".join((path / "cgroup.procs").read_text().split())
    except OSError:
        return ""
