"""Frozen dataclasses for a validated topology. Pure data: nothing here touches the kernel."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from testbed.topology.background import BackgroundLoad
from testbed.topology.edge import EdgeSpec

FIBRE_DELAY_S_PER_KM = 5e-6
"""One-way propagation delay in optical fibre (refractive index ~1.47): 5 us per km."""
ROUTER_SUFFIX = "-rtr"
"""Each datacenter's router node is named `<dc>-rtr`."""


@dataclass(frozen=True, slots=True)
class Fabric:
    """The intra-datacenter network that joins a DC's hosts to its router."""

    rate_bps: float
    """Per-host port rate, bits/s."""
    latency_s: float
    """One-way host-to-router latency, seconds."""
    mtu: int | None = None
    """IP MTU of the DC's host ports and bridge; None: 1500, or 9000 with `rdma: softroce`."""


@dataclass(frozen=True, slots=True)
class Datacenter:
    """A datacenter: some hosts behind one router."""

    name: str
    hosts: tuple[str, ...]
    """Host names in the order their pipeline stages are assigned."""
    fabric: Fabric


@dataclass(frozen=True, slots=True)
class DirectionSpec:
    """What the topology file asks of one direction of an OTN link."""

    delay_s: float
    """One-way delay: propagation (from distance) or explicit, plus any extra fixed delay."""
    rate_bps: float
    jitter_s: float = 0.0
    loss: float = 0.0
    """Random loss probability, only for fault experiments on links with `lossless: false`."""


@dataclass(frozen=True, slots=True)
class OtnLink:
    """A point-to-point OTN link between two datacenters' routers."""

    index: int
    a: str
    b: str
    distance_km: float | None
    mtu: int
    lossless: bool
    a_to_b: DirectionSpec
    b_to_a: DirectionSpec
    real_rate_bps: float | None = None
    """The deployment's real wavelength rate, when the file scales it down to what one machine emulates."""
    edge: EdgeSpec | None = None
    """The edge buffer at each end (`lossless: pfc`, a finite buffer, or an `edge_rate`); None: a plain link."""

    @property
    def name(self) -> str:
        return f"{self.a}--{self.b}"

    @property
    def scale(self) -> float | None:
        """Emulated rate / real rate (e.g. 1/400), or None when the file gives no real rate."""
        if self.real_rate_bps is None:
            return None
        return min(self.a_to_b.rate_bps, self.b_to_a.rate_bps) / self.real_rate_bps

    def direction(self, src: str) -> DirectionSpec:
        """The direction that leaves datacenter `src`."""
        if src == self.a:
            return self.a_to_b
        if src == self.b:
            return self.b_to_a
        raise KeyError(f"{src} is not an end of link {self.name}")

    def other(self, dc: str) -> str:
        return self.b if dc == self.a else self.a


@dataclass(frozen=True, slots=True)
class TcpSettings:
    """How the hosts' TCP behaves (gloo's transport): set in every host namespace at bring-up."""

    congestion_control: str = "reno"
    """reno by default: on a lossless link it is plain slow start then linear growth, as predictable as the
    link. Linux's other default, BBR (this project's machines use it), paces a ping-pong of 128 KiB messages
    over a 5 ms link to 18.9 ms a round trip instead of 12.1 (measured): the transport, not the link, would
    set the step. cubic where the kernel allows it in namespaces."""
    slow_start_after_idle: bool = False
    """Linux's default (true) drops the window back after an idle RTO: every iteration's first messages would
    start slow again after the optimizer step. A dedicated DC interconnect keeps its window (RDMA has none)."""


@dataclass(frozen=True, slots=True)
class Topology:
    """A validated topology: datacenters in file order, links in file order."""

    name: str
    description: str
    source: str
    datacenters: tuple[Datacenter, ...]
    links: tuple[OtnLink, ...]
    address_base: ipaddress.IPv4Network
    rdma: str = "none"
    """`softroce`: every host gets an rxe device on its interface at bring-up (testbed/rdma)."""
    tcp: TcpSettings = TcpSettings()
    background: tuple[BackgroundLoad, ...] = ()
    """Bulk flows between named hosts that share the OTN links with the pipeline (testbed/topology/background.py)."""

    def dc(self, name: str) -> Datacenter:
        for dc in self.datacenters:
            if dc.name == name:
                return dc
        raise KeyError(name)

    @property
    def hosts(self) -> tuple[tuple[str, str], ...]:
        """(host, dc) pairs in pipeline order: DC order, then host order."""
        return tuple((h, dc.name) for dc in self.datacenters for h in dc.hosts)

    def links_of(self, dc: str) -> tuple[OtnLink, ...]:
        return tuple(link for link in self.links if dc in (link.a, link.b))


def router_name(dc: str) -> str:
    """The router node of a datacenter: `<dc>-rtr`."""
    return f"{dc}{ROUTER_SUFFIX}"
