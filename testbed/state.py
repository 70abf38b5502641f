"""The state file of a testbed: what was (or is about to be) created, so teardown removes exactly that.

Intent is recorded *before* each object is created and the file is replaced atomically, so a `testbed up`
killed with SIGKILL at any point leaves a state file naming everything that may exist.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

Phase = Literal["creating", "up", "destroying"]


def state_dir() -> Path:
    """Where state files live: $TESTBED_STATE_DIR, else /run/testbed (tmpfs: gone with the namespaces at reboot)."""
    return Path(os.environ.get("TESTBED_STATE_DIR", "/run/testbed"))


@dataclass(slots=True)
class ProcessRecord:
    """A process the testbed started (shaper daemon, worker): killed by PID, checked by start time."""

    pid: int
    start_ticks: int
    role: str
    node: str = ""

    def alive(self) -> bool:
        """Still the same process (PID not reused) and not a zombie."""
        return process_start_ticks(self.pid) == self.start_ticks and not process_is_zombie(self.pid)


@dataclass(slots=True)
class TestbedState:
    """Everything `down` needs, and what `status` shows."""

    name: str
    backend: str
    topology_source: str
    phase: Phase = "creating"
    owner_pid: int = field(default_factory=os.getpid)
    created_at: float = field(default_factory=time.time)
    netns: list[str] = field(default_factory=list)
    processes: list[ProcessRecord] = field(default_factory=list)
    plan: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    """Backend- or shaper-specific records (e.g. what a shaper installed and how it was verified)."""

    @property
    def path(self) -> Path:
        return state_dir() / f"{self.name}.json"

    def save(self) -> None:
        """Atomically replace the state file (write, fsync, rename)."""
        directory = state_dir()
        directory.mkdir(parents=True, exist_ok=True)
        tmp = directory / f".{self.name}.json.tmp"
        with open(tmp, "w") as f:
            json.dump(asdict(self), f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)

    @property
    def files_dir(self) -> Path:
        """Per-testbed folder for shaper configs, daemon stats and logs."""
        return state_dir() / self.name

    def delete(self) -> None:
        import shutil

        shutil.rmtree(self.files_dir, ignore_errors=True)
        self.path.unlink(missing_ok=True)

    def owner_alive(self) -> bool:
        return self.owner_pid == os.getpid() or os.path.exists(f"/proc/{self.owner_pid}")

    @classmethod
    def load(cls, name: str) -> TestbedState:
        path = state_dir() / f"{name}.json"
        data = json.loads(path.read_text())
        data["processes"] = [ProcessRecord(**p) for p in data.get("processes", [])]
        return cls(**data)


def list_states() -> list[TestbedState]:
    """Every testbed with a state file, by name."""
    directory = state_dir()
    if not directory.is_dir():
        return []
    return [TestbedState.load(p.stem) for p in sorted(directory.glob("*.json"))]


def exists(name: str) -> bool:
    return (state_dir() / f"{name}.json").exists()


@contextmanager
def locked() -> Iterator[None]:
    """Serialise up/down across processes (one lock for all testbeds on this machine)."""
    directory = state_dir()
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / ".lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def process_is_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except (FileNotFoundError, ProcessLookupError):
        return True


def process_start_ticks(pid: int) -> int | None:
    """Start time of a process in clock ticks since boot (field 22 of /proc/PID/stat), None if gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])
