"""The state file of a testbed: what was (or is about to be) created, so teardown removes exactly that.

Intent is recorded *before* each object is created and the file is replaced atomically, so a `testbed up`
killed with SIGKILL at any point leaves a state file naming everything that may exist.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from testbed.plan.model import LinkDirection, Plan
from testbed.state.records import MininetRecord, ProcessRecord, RdmaRecord, ShaperRecord

Phase = Literal["creating", "up", "destroying"]


def state_dir() -> Path:
    """Where state files live: $TESTBED_STATE_DIR, else /run/testbed (tmpfs: gone with the namespaces at reboot)."""
    return Path(os.environ.get("TESTBED_STATE_DIR", "/run/testbed"))


@dataclass(slots=True)
class TestbedState:
    """Everything `down` needs, and what `status` shows."""

    __test__ = False     # not a pytest test class, despite its name

    name: str
    backend: str
    topology_source: str
    plan: Plan
    phase: Phase = "creating"
    owner_pid: int = field(default_factory=os.getpid)
    created_at: float = field(default_factory=time.time)
    netns: list[str] = field(default_factory=list)
    processes: list[ProcessRecord] = field(default_factory=list)
    shaper: ShaperRecord | None = None
    mininet: MininetRecord | None = None
    """Mininet backend only."""
    rdma: RdmaRecord | None = None
    """SoftRoCE devices (topology `rdma: softroce` or `--rdma softroce`)."""
    cgroups: list[str] = field(default_factory=list)
    """CPU-capped cgroups of a dilated run (testbed/run/dilation.py), by path, recorded before each exists."""
    undilated: list[LinkDirection] = field(default_factory=list)
    """While a dilated run has the OTN links slowed down: the directions as they were (restored after it)."""

    @property
    def path(self) -> Path:
        return state_dir() / f"{self.name}.json"

    @property
    def shaper_name(self) -> str:
        return self.shaper.name if self.shaper else "none"

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "backend": self.backend, "topology_source": self.topology_source,
                "phase": self.phase, "owner_pid": self.owner_pid, "created_at": self.created_at,
                "netns": list(self.netns), "processes": [p.to_json() for p in self.processes],
                "plan": self.plan.to_json(),
                "shaper": self.shaper.to_json() if self.shaper else None,
                "mininet": self.mininet.to_json() if self.mininet else None,
                "rdma": self.rdma.to_json() if self.rdma else None, "cgroups": list(self.cgroups),
                "undilated": [asdict(d) for d in self.undilated]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TestbedState:
        """The inverse of `to_json`; also reads state files of 0.1 (`extra.shaper`, `extra.mininet`)."""
        extra = data.get("extra", {})
        shaper = data.get("shaper", extra.get("shaper"))
        mininet = data.get("mininet", extra.get("mininet"))
        return cls(name=data["name"], backend=data["backend"], topology_source=data["topology_source"],
                   phase=data.get("phase", "creating"), owner_pid=int(data.get("owner_pid", 0)),
                   created_at=float(data.get("created_at", 0.0)), netns=list(data.get("netns", [])),
                   processes=[ProcessRecord.from_json(p) for p in data.get("processes", [])],
                   plan=Plan.from_json(data["plan"]),
                   shaper=ShaperRecord.from_json(shaper) if shaper else None,
                   mininet=MininetRecord.from_json(mininet) if mininet else None,
                   rdma=RdmaRecord.from_json(data["rdma"]) if data.get("rdma") else None,
                   cgroups=list(data.get("cgroups", [])),
                   undilated=[LinkDirection.from_json(d) for d in data.get("undilated", [])])

    def save(self) -> None:
        """Atomically replace the state file (write, fsync, rename)."""
        directory = state_dir()
        directory.mkdir(parents=True, exist_ok=True)
        tmp = directory / f".{self.name}.json.tmp"
        with open(tmp, "w") as f:
            json.dump(self.to_json(), f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)

    @property
    def files_dir(self) -> Path:
        """Per-testbed folder for shaper configs, daemon stats and logs."""
        return state_dir() / self.name

    def delete(self) -> None:
        shutil.rmtree(self.files_dir, ignore_errors=True)
        self.path.unlink(missing_ok=True)

    def owner_alive(self) -> bool:
        return self.owner_pid == os.getpid() or os.path.exists(f"/proc/{self.owner_pid}")

    @classmethod
    def load(cls, name: str) -> TestbedState:
        return cls.from_json(json.loads((state_dir() / f"{name}.json").read_text()))


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
