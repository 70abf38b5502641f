"""Typed plan objects. A backend reads these and nothing else; `Plan.to_json`/`Plan.from_json` are the one
place where a plan becomes JSON (the state file, results/*/plan.json) and back."""

from __future__ import annotations

import ipaddress
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from testbed.topology.background import BackgroundLoad
from testbed.topology.edge import EdgeDirection
from testbed.topology.model import Fabric

Role = Literal["host", "router"]
VethKind = Literal["fabric", "otn"]


@dataclass(frozen=True, slots=True)
class Interface:
    """An interface of a node, with its address (None for bridge ports)."""

    name: str
    address: ipaddress.IPv4Interface | None
    mtu: int

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Interface:
        address = data["address"]
        return cls(data["name"], ipaddress.IPv4Interface(address) if address else None, int(data["mtu"]))


@dataclass(frozen=True, slots=True)
class Route:
    """A static route: `dst via gateway dev [src]`."""

    dst: ipaddress.IPv4Network
    gateway: ipaddress.IPv4Address
    dev: str
    src: ipaddress.IPv4Address | None = None
    """Preferred source: a router's DC address, so traffic it originates has a routed source (not a /30)."""

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Route:
        return cls(ipaddress.IPv4Network(data["dst"]), ipaddress.IPv4Address(data["gateway"]), data["dev"],
                   ipaddress.IPv4Address(data["src"]) if data.get("src") else None)


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

    def ip(self, ifname: str | None = None) -> str:
        """The IPv4 address of an interface (default: the first one that has an address)."""
        for iface in self.interfaces:
            if iface.address is not None and ifname in (None, iface.name):
                return str(iface.address.ip)
        raise KeyError(f"{self.name}:{ifname or 'any interface'} has no address in the plan")

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Node:
        return cls(name=data["name"], dc=data["dc"], role=data["role"], netns=data["netns"],
                   interfaces=tuple(Interface.from_json(i) for i in data["interfaces"]),
                   routes=tuple(Route.from_json(r) for r in data["routes"]),
                   sysctls=tuple((str(k), str(v)) for k, v in data["sysctls"]), bridge=data.get("bridge"),
                   bridge_ports=tuple(data.get("bridge_ports", ())))


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

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Veth:
        return cls(**data)


@dataclass(frozen=True, slots=True)
class LinkDirection:
    """One direction of an OTN link, and what the shaper must deliver on it (sender's egress -> receiver's
    ingress). Named `src_dc -> dst_dc` (its `label`) in every table, JSON file and message."""

    link: str
    src_dc: str
    dst_dc: str
    src_node: str
    src_ifname: str
    dst_node: str
    dst_ifname: str
    delay_s: float
    rate_bps: float
    """Bits per second."""
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
    real_rate_bps: float | None = None
    """The deployment's rate this direction stands for (the topology's `real_rate`); None where not stated."""
    edge: EdgeDirection | None = None
    """The edge buffer at the receiving end (PFC, a finite buffer, or a slower DC-side port); None: plain."""

    @property
    def bottleneck_bps(self) -> float:
        """The slowest rate a message meets on this direction: the link's, or its receiving edge's DC-side port."""
        return self.rate_bps if self.edge is None else min(self.rate_bps, self.edge.drain_rate_bps)

    @property
    def label(self) -> str:
        """`dc-a -> dc-b`: the one spelling of a direction in tables, messages and per-direction JSON keys."""
        return f"{self.src_dc} -> {self.dst_dc}"

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> LinkDirection:
        edge = data.get("edge")
        return cls(**{**data, "edge": EdgeDirection(**edge) if edge else None})


@dataclass(frozen=True, slots=True)
class Plan:
    """Everything a backend needs to build one testbed."""

    testbed: str
    topology: str
    source: str
    nodes: tuple[Node, ...]
    veths: tuple[Veth, ...]
    directions: tuple[LinkDirection, ...]
    """Both directions of every OTN link, in link order."""
    tcp_buffer_bytes: int
    fabrics: dict[str, Fabric] = field(default_factory=dict)
    """Per DC: the intra-DC fabric (rate per host port, latency)."""
    paths: dict[str, dict[str, list[str]]] = field(default_factory=dict)
    """Shortest-delay DC path for every (src DC, dst DC)."""
    notes: tuple[str, ...] = ()
    rdma: str = "none"
    """`softroce`: bring-up gives every host an rxe device (testbed/rdma/softroce.py)."""
    background: tuple[BackgroundLoad, ...] = ()
    """The topology's background loads, started and stopped with each run (testbed/run/background.py)."""

    def node(self, name: str) -> Node:
        for node in self.nodes:
            if node.name == name:
                return node
        raise KeyError(name)

    def has_node(self, name: str) -> bool:
        return any(n.name == name for n in self.nodes)

    @property
    def hosts(self) -> tuple[Node, ...]:
        return tuple(n for n in self.nodes if n.role == "host")

    @property
    def routers(self) -> tuple[Node, ...]:
        return tuple(n for n in self.nodes if n.role == "router")

    def netns_names(self) -> list[str]:
        return [n.netns for n in self.nodes]

    def direction(self, src_dc: str, dst_dc: str) -> LinkDirection:
        """The OTN direction from one DC to an adjacent one."""
        for d in self.directions:
            if d.src_dc == src_dc and d.dst_dc == dst_dc:
                return d
        raise KeyError(f"no OTN link from {src_dc} to {dst_dc}")

    def hops(self, src_dc: str, dst_dc: str) -> list[LinkDirection]:
        """The OTN directions a packet from src_dc to dst_dc crosses on its planned (routed) path, in order."""
        path = self.paths[src_dc][dst_dc]
        return [self.direction(here, nxt) for here, nxt in zip(path, path[1:], strict=False)]

    def receiver_address(self, direction: LinkDirection) -> str:
        """The address a probe sends to, to cross this direction: the receiving router's OTN interface."""
        return self.node(direction.dst_node).ip(direction.dst_ifname)

    def fabric_rate_bps(self, dc: str) -> float:
        return self.fabrics[dc].rate_bps

    def replace_direction(self, new: LinkDirection) -> Plan:
        """The same plan with one direction (matched by link and source DC) replaced: run-time changes."""
        from dataclasses import replace

        return replace(self, directions=tuple(new if (d.link, d.src_dc) == (new.link, new.src_dc) else d
                                              for d in self.directions))

    def to_json(self) -> dict[str, Any]:
        """JSON-ready dict (addresses as strings)."""
        return _jsonable(asdict(self))

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Plan:
        """The inverse of `to_json`. Reads the key `shapes` too (plans written before 0.2 named directions so)."""
        directions = data["directions"] if "directions" in data else data["shapes"]
        return cls(testbed=data["testbed"], topology=data["topology"], source=data["source"],
                   nodes=tuple(Node.from_json(n) for n in data["nodes"]),
                   veths=tuple(Veth.from_json(v) for v in data["veths"]),
                   directions=tuple(LinkDirection.from_json(d) for d in directions),
                   tcp_buffer_bytes=int(data["tcp_buffer_bytes"]),
                   fabrics={dc: Fabric(float(f["rate_bps"]), float(f["latency_s"]), f.get("mtu"))
                            for dc, f in data.get("fabrics", {}).items()},
                   paths={src: {dst: list(p) for dst, p in by.items()} for src, by in data.get("paths", {}).items()},
                   notes=tuple(data.get("notes", ())), rdma=str(data.get("rdma", "none")),
                   background=tuple(BackgroundLoad(**b) for b in data.get("background", ())))


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (ipaddress.IPv4Interface, ipaddress.IPv4Network, ipaddress.IPv4Address)):
        return str(value)
    return value
