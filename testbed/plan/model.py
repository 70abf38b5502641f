"""Typed plan objects. A backend reads these and nothing else."""

from __future__ import annotations

import ipaddress
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

Role = Literal["host", "router"]
VethKind = Literal["fabric", "otn"]


@dataclass(frozen=True, slots=True)
class Interface:
    """An interface of a node, with its address (None for bridge ports)."""

    name: str
    address: ipaddress.IPv4Interface | None
    mtu: int


@dataclass(frozen=True, slots=True)
class Route:
    """A static route: `dst via gateway dev [src]`."""

    dst: ipaddress.IPv4Network
    gateway: ipaddress.IPv4Address
    dev: str
    src: ipaddress.IPv4Address | None = None
    """Preferred source: a router's DC address, so traffic it originates has a routed source (not a /30)."""


@dataclass(frozen=True, slots=True)
class Node:
    """A host or a datacenter router: one network namespace."""

    name: str
    dc: str
    role: Role
    netns: str
    interfaces: tuple[Interface, ...]
    routes: tuple[Route, ...]
    sysctls: tuple[tuple[str, str], ...]
    bridge: str | None = None
    """Name of the fabric bridge (routers only); the host ports and the router's own address sit on it."""
    bridge_ports: tuple[str, ...] = ()

    @property
    def addresses(self) -> list[str]:
        return [str(i.address) for i in self.interfaces if i.address is not None]


@dataclass(frozen=True, slots=True)
class Veth:
    """A veth pair between two nodes' namespaces."""

    kind: VethKind
    a_node: str
    a_ifname: str
    b_node: str
    b_ifname: str
    mtu: int
    link: str | None = None
    """OTN link name for `otn` veths."""


@dataclass(frozen=True, slots=True)
class LinkShape:
    """What the shaper must deliver on one direction of an OTN link (sender's egress -> receiver's ingress)."""

    link: str
    src_dc: str
    dst_dc: str
    src_node: str
    src_ifname: str
    dst_node: str
    dst_ifname: str
    delay_s: float
    rate_bps: float
    jitter_s: float
    loss: float
    lossless: bool
    mtu: int
    bdp_bytes: int
    """rate x round-trip time of this link."""
    rate_queue_packets: int
    """Rate limiter queue: holds every sender's TCP window beyond the pipe, so a lossless link never tail-drops."""
    delay_queue_packets: int
    """Delay line queue: packets in flight over the delay, with 2x headroom."""


@dataclass(frozen=True, slots=True)
class Plan:
    """Everything a backend needs to build one testbed."""

    testbed: str
    topology: str
    source: str
    nodes: tuple[Node, ...]
    veths: tuple[Veth, ...]
    shapes: tuple[LinkShape, ...]
    tcp_buffer_bytes: int
    fabrics: dict[str, dict[str, float]] = field(default_factory=dict)
    """Per DC: intra-DC `rate_bps` and `latency_s`."""
    paths: dict[str, dict[str, list[str]]] = field(default_factory=dict)
    """Shortest-delay DC path for every (src DC, dst DC)."""
    notes: tuple[str, ...] = ()

    def node(self, name: str) -> Node:
        for node in self.nodes:
            if node.name == name:
                return node
        raise KeyError(name)

    @property
    def hosts(self) -> tuple[Node, ...]:
        return tuple(n for n in self.nodes if n.role == "host")

    def netns_names(self) -> list[str]:
        return [n.netns for n in self.nodes]

    def to_json(self) -> dict[str, Any]:
        """JSON-ready dict (addresses as strings)."""
        return _jsonable(asdict(self))


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (ipaddress.IPv4Interface, ipaddress.IPv4Network, ipaddress.IPv4Address)):
        return str(value)
    return value
