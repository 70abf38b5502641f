"""Rate limiting by HTB: typed qdisc specs built from the plan (pure), applied and read back via pyroute2.

Tree on an egress interface: `1: htb default 0x10 r2q 1000` -> class `1:10` (rate = ceil = R, burst and
cburst 15 kB, quantum 60 kB) -> leaf qdisc `10:` (pfifo sized for zero loss, or netem when that shaper
delays at egress). Measured on this kernel: TCP reaches 94 % of R (the rest is header overhead).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pyroute2 import IPRoute

ROOT_HANDLE = 0x10000
CLASS_HANDLE = 0x10010
LEAF_HANDLE = 0x100000
BURST_BYTES = 15_000
QUANTUM_BYTES = 60_000


@dataclass(frozen=True, slots=True)
class RateSpec:
    """HTB on one egress interface of one node."""

    node: str
    ifname: str
    rate_bps: float
    queue_packets: int
    leaf: str = "pfifo"
    """`pfifo`, or `netem` with `netem` options (delay at egress, for kernels that have it)."""
    netem: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class QdiscCounters:
    """What the kernel says about a qdisc: its kind and its counters."""

    kind: str
    handle: int
    packets: int
    drops: int
    overlimits: int
    backlog_packets: int


def apply_rate(ipr: IPRoute, spec: RateSpec) -> None:
    """Install (replacing whatever is there) the HTB tree of `spec` on its interface."""
    index = ipr.link_lookup(ifname=spec.ifname)[0]
    remove_root(ipr, spec.ifname)
    add_root(ipr, index, default=0x10)
    add_class(ipr, index, CLASS_HANDLE, LEAF_HANDLE, spec.rate_bps, spec.queue_packets,
              netem=spec.netem if spec.leaf == "netem" else None)


def add_root(ipr: IPRoute, index: int, *, default: int) -> None:
    """The root `1: htb` on interface `index`; unclassified traffic goes to class 1:`default` (0: unshaped)."""
    ipr.tc("add", "htb", index=index, handle=ROOT_HANDLE, default=default, r2q=1000)


def add_class(ipr: IPRoute, index: int, classid: int, leaf_handle: int, rate_bps: float, queue_packets: int,
              netem: dict[str, Any] | None = None) -> None:
    """One HTB class under the root (rate = ceil, our burst and quantum) and its leaf: a pfifo of
    `queue_packets`, or netem with `netem` options and that limit. The one builder of the single machine's and
    each remote machine's tree."""
    rate = f"{int(rate_bps)}bit"
    ipr.tc("add-class", "htb", index=index, handle=classid, parent=ROOT_HANDLE, rate=rate, ceil=rate,
           burst=BURST_BYTES, cburst=BURST_BYTES, quantum=QUANTUM_BYTES)
    if netem is not None:
        ipr.tc("add", "netem", index=index, handle=leaf_handle, parent=classid, limit=queue_packets, **netem)
    else:
        ipr.tc("add", "pfifo", index=index, handle=leaf_handle, parent=classid, limit=queue_packets)


def remove_root(ipr: IPRoute, ifname: str) -> None:
    """Delete the root qdisc of an interface if it has one of ours (back to the default)."""
    index = ipr.link_lookup(ifname=ifname)[0]
    if any(q["handle"] == ROOT_HANDLE for q in ipr.get_qdiscs(index=index)):
        ipr.tc("del", index=index, handle=ROOT_HANDLE, root=True)


def change_rate(ipr: IPRoute, ifname: str, rate_bps: float) -> None:
    """Change the rate of an installed tree in place (no packets dropped)."""
    index = ipr.link_lookup(ifname=ifname)[0]
    rate = f"{int(rate_bps)}bit"
    ipr.tc("change-class", "htb", index=index, handle=CLASS_HANDLE, parent=ROOT_HANDLE, rate=rate, ceil=rate,
           burst=BURST_BYTES, cburst=BURST_BYTES, quantum=QUANTUM_BYTES)


def read_qdiscs(ipr: IPRoute, ifname: str) -> list[QdiscCounters]:
    """Every qdisc on an interface with its counters, as the kernel reports them."""
    index = ipr.link_lookup(ifname=ifname)[0]
    result = []
    for msg in ipr.get_qdiscs(index=index):
        stats = msg.get("TCA_STATS2")
        basic = stats.get("TCA_STATS_BASIC") if stats else None
        queue = stats.get("TCA_STATS_QUEUE") if stats else None
        legacy = msg.get("TCA_STATS") or {}
        result.append(QdiscCounters(
            kind=msg.get("TCA_KIND"), handle=msg["handle"],
            packets=(basic or legacy).get("packets", 0),
            drops=(queue or legacy).get("drops", 0),
            overlimits=(queue or legacy).get("overlimits", 0),
            backlog_packets=(queue or legacy).get("qlen", 0)))
    return result


def read_class_rate(ipr: IPRoute, ifname: str) -> float | None:
    """The configured rate (bits/s) of class 1:10, or None if it is not there."""
    index = ipr.link_lookup(ifname=ifname)[0]
    for msg in ipr.get_classes(index=index):
        if msg["handle"] == CLASS_HANDLE:
            params = msg.get_nested("TCA_OPTIONS", "TCA_HTB_PARMS") if hasattr(msg, "get_nested") else None
            if params is None:
                options = msg.get("TCA_OPTIONS")
                params = options.get("TCA_HTB_PARMS") if options else None
            if params is None:
                return None
            rate64 = msg.get_nested("TCA_OPTIONS", "TCA_HTB_RATE64") if hasattr(msg, "get_nested") else None
            rate_bytes = rate64 if rate64 else params["rate"]
            return float(rate_bytes) * 8
    return None
