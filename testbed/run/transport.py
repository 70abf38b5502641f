"""Which transport a run's workers use: `--transport tcp|rdma|auto`, decided against the testbed.

RDMA needs an rxe device on every stage's host (the testbed was brought up with `rdma: softroce`), a kernel on
which rxe works inside namespaces, and one of our schedules (PyTorch's schedules call torch.distributed's
gloo directly). `auto` takes RDMA where all of that holds and says why not otherwise; `rdma` fails before any
worker starts, naming the missing piece and the routes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from testbed.errors import TestbedError
from testbed.plan.model import Node, Plan
from testbed.rdma.softroce import rdma_mtu_for
from testbed.rdma.support import ROUTES, rxe_in_namespaces
from testbed.state.records import RdmaRecord, RxeDevice
from workloads.records import RDMA, TCP, TRANSPORTS, TransportKind

AUTO = "auto"
CHOICES = (*TRANSPORTS, AUTO)
"""What --transport takes: a transport's key, or auto (rdma where it can run, tcp otherwise)."""


class TransportError(TestbedError, RuntimeError):
    """`--transport rdma` cannot run here; the message names what is missing."""


@dataclass(frozen=True, slots=True)
class TransportChoice:
    name: str
    """A key of workloads.records.TRANSPORTS."""
    reason: str
    devices: list[RxeDevice] = field(default_factory=list)
    """Per stage, its host's rxe device (rdma only)."""
    path_rdma_mtu: list[int] = field(default_factory=list)
    """Per stage boundary, the largest RDMA MTU the path carries."""

    @property
    def kind(self) -> TransportKind:
        """The chosen transport's registry entry."""
        return TRANSPORTS[self.name]


def rdma_missing(plan: Plan, record: RdmaRecord | None, hosts: list[Node], schedules: list[str]) -> str:
    """Why these stages cannot use RDMA ('' when they can)."""
    support = rxe_in_namespaces()
    if not support.ok:
        return support.reason
    if record is None:
        return (f"testbed {plan.testbed} has no rxe devices (bring it up with 'rdma: softroce' in the topology or "
                "'--rdma softroce')")
    lacking = [h.name for h in hosts if record.device_of(h.name) is None]
    if lacking:
        return f"no rxe device on {', '.join(lacking)}"
    return schedules_missing(schedules)


def schedules_missing(schedules: list[str]) -> str:
    """Why these schedules cannot run over RDMA ('' when they can)."""
    torch = [s for s in schedules if s.startswith("torch-")]
    if torch:
        return f"{', '.join(torch)} call torch.distributed (gloo) directly: RDMA runs our schedules only"
    return ""


def path_mtus(plan: Plan, hosts: list[Node]) -> list[int]:
    """Per stage boundary: the RDMA MTU that fits the smallest IP MTU on the way (both hosts' and the links')."""
    result = []
    for a, b in zip(hosts, hosts[1:], strict=False):
        result.append(rdma_mtu_for(min(a.interfaces[0].mtu, b.interfaces[0].mtu, path_ip_mtu(plan, a.dc, b.dc))))
    return result


def path_ip_mtu(plan: Plan, src_dc: str, dst_dc: str) -> int:
    """The smallest IP MTU of the OTN links from one DC to another (65535 within a DC)."""
    mtu = 65535
    path = plan.paths[src_dc][dst_dc] if src_dc != dst_dc else [src_dc]
    for here, nxt in zip(path, path[1:], strict=False):
        mtu = min(mtu, plan.direction(here, nxt).mtu)
    return mtu


def decide(requested: str, missing: str) -> tuple[str, str]:
    """The rule one machine and several share: `tcp` as asked; `rdma` where nothing is missing, else an error
    naming it and the routes; `auto` rdma where nothing is missing, else tcp saying why. (key, reason)."""
    if requested not in CHOICES:
        raise TransportError(f"unknown --transport {requested!r}; choose one of: {', '.join(CHOICES)}")
    if requested == TCP.key:
        return TCP.key, "asked for (--transport tcp)"
    if missing:
        if requested == RDMA.key:
            raise TransportError(f"--transport rdma cannot run: {missing}. Routes: {ROUTES}")
        return TCP.key, f"--transport auto took tcp: {missing}"
    return RDMA.key, f"every stage has an rxe device ({requested})"


def choose(requested: str, plan: Plan, record: RdmaRecord | None, hosts: list[Node],
           schedules: list[str]) -> TransportChoice:
    key, reason = decide(requested, "" if requested == TCP.key else rdma_missing(plan, record, hosts, schedules))
    if key == TCP.key:
        return TransportChoice(key, reason)
    assert record is not None
    devices = [record.device_of(h.name) for h in hosts]
    return TransportChoice(key, reason, devices=[d for d in devices if d is not None], path_rdma_mtu=path_mtus(plan, hosts))
