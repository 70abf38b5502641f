"""What each agent command prints (one JSON object), as dataclasses: the agent builds them, the controller reads
them back with `from_json`, so neither side reads a reply by key. Import-light (the agent runs many times)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any, TypeVar

R = TypeVar("R", bound="Reply")


@dataclass(slots=True)
class Reply:
    """A reply's JSON is its fields; unknown keys (a newer agent) are ignored, missing ones take defaults."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls: type[R], data: dict[str, Any]) -> R:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


@dataclass(slots=True)
class EnvReply(Reply):
    """`env`: what the machine is and what its kernel allows."""

    hostname: str = ""
    kernel: str = ""
    python: str = ""
    executable: str = ""
    torch: str | None = None
    cpus: int | None = None
    shaper: str = "none"
    """The shaper the kernel allows: netem, delayline or none."""
    rxe: bool = False
    rdma: str = ""
    """Why this machine cannot give its NIC an rxe device ('' when it can: testbed.rdma.support.rxe_here)."""
    uid: int = -1
    boot_id: str = ""
    package: str = ""
    """Where the agent's package lives (the provisioned copy)."""
    time: float = 0.0


@dataclass(slots=True)
class PortReply(Reply):
    """`freeport`: a TCP port free on the asked address."""

    port: int = 0


@dataclass(slots=True)
class LoadReply(Reply):
    """`load`: /proc/stat's `cpu` line and the runnable tasks now."""

    cpu: list[int] = field(default_factory=list)
    procs_running: int = 0
    cpus: int | None = None


@dataclass(slots=True)
class CountersReply(Reply):
    """`counters`: drops so far per destination DC on the egress leaves (-1: the leaf is gone), delay-line
    sequence gaps per source DC, and with the delay line per source DC [packets released, summed release
    error in seconds]."""

    egress: dict[str, int] = field(default_factory=dict)
    ingress: dict[str, int] = field(default_factory=dict)
    holds: dict[str, list[float]] = field(default_factory=dict)


@dataclass(slots=True)
class ShapeReply(Reply):
    """`shape`: what was installed."""

    mode: str = ""
    classes: int = 0
    rules: int = 0
    daemon_pid: int | None = None


@dataclass(slots=True)
class RemovedReply(Reply):
    """`unshape`: what was removed, in words."""

    removed: list[str] = field(default_factory=list)


@dataclass(slots=True)
class RttReply(Reply):
    """`rtt`: the ICMP round trips (seconds) and how many got no answer."""

    values_s: list[float] = field(default_factory=list)
    lost: int = 0

    def sample(self) -> Any:
        """As the single machine's LatencySample (median, IQR)."""
        from testbed.probe.latency import LatencySample

        return LatencySample(tuple(self.values_s), self.lost)


@dataclass(slots=True)
class ListeningReply(Reply):
    """`sink`'s first line: it listens."""

    listening: int = 0


@dataclass(slots=True)
class SinkReply(Reply):
    """`sink`'s last line: the goodput of the one connection it accepted (the first read starts the clock)."""

    bytes: int = 0
    seconds: float = 0.0
    bps: float = 0.0


@dataclass(slots=True)
class SourceReply(Reply):
    """`source`: bytes sent."""

    bytes: int = 0


@dataclass(slots=True)
class KillReply(Reply):
    """`kill`: the pid stopped, or None when no worker of ours ran."""

    stopped: int | None = None


@dataclass(slots=True)
class RxeReply(Reply):
    """`rxe`: the machine's rxe device on its NIC, checked (port ACTIVE, the IPv4 GID, the RDMA MTU)."""

    name: str = ""
    netdev: str = ""
    gid_index: int = -1
    gid: str = ""
    active_mtu: int = 0
    created: bool = False
    """False: it existed already (an earlier run of this testbed)."""


REPLIES: dict[str, type[Reply]] = {
    "env": EnvReply, "freeport": PortReply, "load": LoadReply, "counters": CountersReply, "shape": ShapeReply,
    "unshape": RemovedReply, "rtt": RttReply, "sink": SinkReply, "source": SourceReply, "kill": KillReply,
    "rxe": RxeReply,
}
"""Each command's reply type (`sink` prints a ListeningReply first)."""
