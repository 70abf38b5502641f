"""Typed records kept in a testbed's state file: processes it started, what its shaper installed, Mininet's
switches. Each has `to_json`/`from_json`; nothing here touches the kernel."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from testbed.util import procs


@dataclass(slots=True)
class ProcessRecord:
    """A process the testbed started (shaper daemon, worker, switch daemon): killed by PID, checked by start time."""

    pid: int
    start_ticks: int
    role: str
    node: str = ""

    @classmethod
    def of(cls, pid: int, role: str, node: str = "") -> ProcessRecord:
        """A record of a process that runs now (its start time read from /proc)."""
        return cls(pid, procs.process_start_ticks(pid) or 0, role, node)

    def alive(self) -> bool:
        """Still the same process (PID not reused) and not a zombie."""
        return procs.same_process_alive(self.pid, self.start_ticks)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ProcessRecord:
        return cls(**data)


def terminate_records(records: list[ProcessRecord], grace_s: float = 3.0) -> list[int]:
    """Stop recorded processes that are still the same process (PID reuse is detected by start time)."""
    return procs.terminate([r.pid for r in records if r.alive()], grace_s)


@dataclass(slots=True)
class DaemonFiles:
    """The files of one delay-line daemon: its configuration, its live statistics and its log."""

    config: str
    stats: str
    log: str
    status: str = ""
    """The supervisor's record of the daemon's deaths and restarts."""


@dataclass(slots=True)
class ShaperRecord:
    """What the shaper of a testbed installed; directions are keyed by `LinkDirection.label`."""

    name: str
    """`delayline`, `netem` or `none`."""
    calibration_s: dict[str, float] = field(default_factory=dict)
    """The emulator's own one-way latency per direction, subtracted from each hold."""
    native: list[str] = field(default_factory=list)
    """Directions the delay line does not hold: the asked delay is what the path itself takes (delay line only)."""
    warnings: list[str] = field(default_factory=list)
    daemons: dict[str, DaemonFiles] = field(default_factory=dict)
    """Delay-line daemon per receiving router."""
    release_error_s: dict[str, float] = field(default_factory=dict)
    """Delay line: per direction, the daemon's mean release error (release - due) while the calibration measured
    the hold it keeps; the calibration absorbed it, so a run's delivered delay is off by its own mean error
    less this."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ShaperRecord:
        return cls(name=data["name"], calibration_s=dict(data.get("calibration_s", {})),
                   native=list(data.get("native", [])), warnings=list(data.get("warnings", [])),
                   daemons={node: DaemonFiles(**files) for node, files in data.get("daemons", {}).items()},
                   release_error_s=dict(data.get("release_error_s", {})))


@dataclass(frozen=True, slots=True)
class SwitchLayout:
    """One DC fabric switch of the Mininet backend and its ports, as named in the root namespace."""

    dc: str
    name: str
    dpid: str
    ports: dict[str, str] = field(default_factory=dict)
    """Node name -> switch-side interface of that node's fabric link."""


@dataclass(slots=True)
class MininetRecord:
    """What the Mininet backend chose and made in the root namespace."""

    switch_requested: str = "auto"
    switch: str = ""
    """Resolved kind: linuxbridge, ovs or ovs-user."""
    switch_reason: str = ""
    version: str = ""
    ovs_private: bool = False
    """This testbed runs its own ovsdb-server/ovs-vswitchd."""
    creates_datapath: bool = False
    """The private daemon made the datapath device (ovs-system/ovs-netdev), so `down` removes it."""
    switches: list[SwitchLayout] = field(default_factory=list)
    root_interfaces: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> MininetRecord:
        return cls(**{**data, "switches": [SwitchLayout(**sw) for sw in data.get("switches", [])]})


@dataclass(slots=True)
class RxeDevice:
    """One SoftRoCE device on a host's interface, inside the host's namespace."""

    node: str
    name: str
    netdev: str
    gid_index: int = -1
    """The IPv4-mapped GID (RoCEv2) of the interface's address; -1 until checked."""
    gid: str = ""
    active_mtu: int = 0
    """RDMA MTU the port runs at (from the netdev MTU)."""


@dataclass(slots=True)
class RdmaRecord:
    """What `rdma: softroce` created; recorded before each device exists."""

    kind: str = "softroce"
    devices: list[RxeDevice] = field(default_factory=list)

    def device_of(self, node: str) -> RxeDevice | None:
        return next((d for d in self.devices if d.node == node), None)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RdmaRecord:
        return cls(kind=data.get("kind", "softroce"), devices=[RxeDevice(**d) for d in data.get("devices", [])])
