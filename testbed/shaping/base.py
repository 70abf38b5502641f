"""The shaper interface: make each OTN direction deliver its delay, rate and zero loss; report what it did.

Beside the abstract methods every shaper implements, a shaper has optional capabilities with neutral defaults
(`hold_counters`, `restarts`, `daemon_stats`, `calibration`; `egress_leaf` and `delays_ingress` for a remote
machine's NIC): callers ask for them on any shaper instead of asking which kind of shaper they hold.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from testbed.backends.base import Backend
from testbed.errors import TestbedError
from testbed.plan.model import LinkDirection, Plan
from testbed.shaping import htb
from testbed.shaping.otn_edge import EdgeCounters
from testbed.state.records import ShaperRecord

if TYPE_CHECKING:
    from testbed.shaping.delayline import DaemonStats


class ShaperError(TestbedError, RuntimeError):
    """A shaper cannot deliver what the plan asks; the message says what is missing and what to do."""


@dataclass(frozen=True, slots=True)
class DirectionDrops:
    """Every drop counter that applies to one OTN direction, read from the kernel (and the delay daemon)."""

    link: str
    direction: str
    qdisc_drops: int
    queue_drops: int = 0
    """nfnetlink_queue: queue full + listener socket full."""
    daemon_gaps: int = 0
    """Packet ids the delay daemon never saw."""
    random_drops: int = 0
    """Intended drops (configured loss, fault experiments)."""
    lost_without_listener: int = 0
    """Packets that entered the delay line and never left it, beyond the counters above: those a dead daemon
    held and those that arrived before its restart (entered - delivered - held - the drops above)."""
    buffer_drops: int = 0
    """Dropped at a finite OTN edge buffer as the topology allows it (`lossless: false` with a `buffer`, or
    lossy-class traffic above XOFF on a PFC link)."""
    edge_lossless_drops: int = 0
    """Lossless packets a PFC edge dropped: its headroom did not hold (never intended)."""

    @property
    def unintended(self) -> int:
        return (self.qdisc_drops + self.queue_drops + self.daemon_gaps + self.lost_without_listener
                + self.edge_lossless_drops)

    def beyond_plan(self, planned_loss: float) -> int:
        """Drops the plan does not allow: every unintended one, and the configured-loss drops too where the
        plan states no loss (a daemon told to drop behind the plan's back is a fault, not an intention)."""
        return self.unintended + (self.random_drops if planned_loss == 0 else 0)


@dataclass(slots=True)
class Health:
    """What the shaper finds installed versus what it installed."""

    problems: list[str] = field(default_factory=list)
    events: list[str] = field(default_factory=list)
    """What happened that is not a problem now (a daemon restarted)."""
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.problems


class Shaper(ABC):
    """Installs and inspects link emulation on a deployed testbed. All state it needs is in `backend.state`."""

    name: str = ""
    delays_ingress: ClassVar[bool] = False
    daemon_role: ClassVar[str | None] = None
    """The role its daemons are recorded under in a testbed's state (their CPU is the run's ledger's); None:
    it runs none."""
    """It holds arriving packets in a delay line on the receiver (on a remote machine too: the agent installs one
    there); otherwise the sender's egress leaf (`egress_leaf`) carries the delay."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend

    @abstractmethod
    def apply(self, plan: Plan) -> None:
        """Shape every OTN direction (and DC fabric rates) of the plan."""

    @property
    def record(self) -> ShaperRecord:
        """What this shaper installed, kept in the testbed's state file."""
        if self.backend.state.shaper is None or self.backend.state.shaper.name != self.name:
            self.backend.state.shaper = ShaperRecord(name=self.name)
        return self.backend.state.shaper

    @property
    def directions(self) -> tuple[LinkDirection, ...]:
        return self.backend.state.plan.directions

    @abstractmethod
    def set_direction(self, direction: LinkDirection) -> None:
        """Change one direction at run time (new delay/rate/jitter/loss), without tearing anything down."""

    @abstractmethod
    def health(self) -> Health:
        """Is everything still installed and running (qdiscs, rules, daemons)?"""

    @abstractmethod
    def drops(self) -> list[DirectionDrops]:
        """Drop counters per OTN direction."""

    def drops_with_planned_loss(self) -> list[tuple[DirectionDrops, float]]:
        """Each direction's drop counters beside the loss its plan states (for `DirectionDrops.beyond_plan`)."""
        loss = {d.label: d.loss for d in self.directions}
        return [(d, loss.get(d.direction, 0.0)) for d in self.drops()]

    # -- optional capabilities: a shaper that has none answers neutrally ----------------------------
    def hold_counters(self) -> dict[str, tuple[int, float]]:
        """Per direction (label) whose holds this shaper times itself: packets released so far and the sum of
        their release error (seconds, release time less due time). {}: none (netem's holds are the kernel's)."""
        return {}

    def restarts(self) -> dict[str, int]:
        """Per node that runs a daemon of this shaper: how often it died and was started again. {}: no daemons."""
        return {}

    def edge_counters(self) -> dict[str, EdgeCounters]:
        """Per direction (label) with an OTN edge this shaper enforces: what the edge did so far. {}: none."""
        return {}

    def daemon_stats(self, node: str) -> DaemonStats | None:
        """The statistics of this shaper's daemon on `node` (its CPU time among them); None where none runs."""
        return None

    def calibration(self) -> dict[str, float]:
        """Per direction (label): the emulator's own one-way latency each hold was shortened by. {}: nothing
        measured (or a shaper that does not calibrate)."""
        record = self.backend.state.shaper
        return dict(record.calibration_s) if record is not None and record.name == self.name else {}

    @classmethod
    def egress_leaf(cls, hold_s: float, rate_queue_packets: int, delay_queue_packets: int, jitter_s: float = 0.0,
                    loss: float = 0.0) -> tuple[int, dict[str, Any] | None]:
        """The leaf under one HTB rate class, for a direction held `hold_s` (jitter, loss): its packet limit and
        its netem options, None for a plain pfifo that only queues for the rate (the default: the delay is
        held elsewhere, or nowhere)."""
        return rate_queue_packets, None

    def apply_fabric(self, plan: Plan) -> None:
        """HTB at the DC fabric rate on every egress towards or from a host (any rate: no 1 Gbit ceiling)."""
        queue = max([d.rate_queue_packets for d in plan.directions] + [1000])
        for port in self.backend.fabric_ports():
            with self.backend.netlink(port.node) as ipr:
                htb.apply_rate(ipr, htb.RateSpec(port.node or "root", port.ifname, plan.fabric_rate_bps(port.dc),
                                                 queue))

    def qdisc_drops(self, direction: LinkDirection) -> int:
        with self.backend.netlink(direction.src_node) as ipr:
            return sum(q.drops for q in htb.read_qdiscs(ipr, direction.src_ifname))

    def qdisc_problems(self) -> list[str]:
        """Each OTN egress must still carry our HTB class at the planned rate."""
        problems = []
        for d in self.directions:
            with self.backend.netlink(d.src_node) as ipr:
                rate = htb.read_class_rate(ipr, d.src_ifname)
            if rate is None:
                problems.append(f"{d.label}: HTB rate class missing on {d.src_node}:{d.src_ifname} "
                                "(deleted behind the testbed's back?)")
            elif abs(rate - d.rate_bps) > 0.01 * d.rate_bps:
                problems.append(f"{d.label}: HTB rate is {rate:g} bit/s, planned {d.rate_bps:g}")
        return problems
