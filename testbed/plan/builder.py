"""Build a `Plan` from a `Topology`: addressing, routing, queue and TCP buffer sizing."""

from __future__ import annotations

import dataclasses
import ipaddress
import math

import testbed.topology.edge as edge_model
from testbed.errors import TestbedError
from testbed.plan.model import Interface, LinkDirection, Node, Plan, Route, Veth
from testbed.plan.routing import path_delay, path_rate, shortest_paths
from testbed.topology.edge import EdgeDirection
from testbed.topology.model import Topology, router_name

NETNS_PREFIX = "tb"
HOST_IFNAME = "eth0"
BRIDGE_IFNAME = "fabric"
FIRST_HOST_OCTET = 11
ETH_OVERHEAD = 14
MIN_TCP_BUFFER = 6 * 1024 * 1024
MIN_QUEUE_PACKETS = 1000
FABRIC_MTU = 1500
RDMA_FABRIC_MTU = 9000
"""Fabric MTU where the topology asks for SoftRoCE: rxe takes RDMA MTU 4096 from a 9000-byte netdev."""

COMMON_SYSCTLS = (
    ("net.ipv6.conf.all.disable_ipv6", "1"),
    ("net.ipv6.conf.default.disable_ipv6", "1"),
)
ROUTER_SYSCTLS = (
    ("net.ipv4.ip_forward", "1"),
    ("net.ipv4.conf.all.rp_filter", "0"),
    ("net.ipv4.conf.default.rp_filter", "0"),
)


def netns_name(testbed: str, node: str) -> str:
    """The namespace of a node: `tb-<testbed>-<node>`."""
    return f"{NETNS_PREFIX}-{testbed}-{node}"


def dc_subnet(topology: Topology, dc_index: int) -> ipaddress.IPv4Network:
    return list(topology.address_base.subnets(new_prefix=24))[dc_index]


def otn_subnet(topology: Topology, link_index: int) -> ipaddress.IPv4Network:
    last24 = list(topology.address_base.subnets(new_prefix=24))[-1]
    return list(last24.subnets(new_prefix=30))[link_index]


def otn_ifname(link_index: int) -> str:
    return f"otn{link_index}"


def build_plan(topology: Topology, testbed: str | None = None) -> Plan:
    """Plan a testbed named `testbed` (default: the topology's name)."""
    name = testbed or topology.name
    paths = {dc.name: shortest_paths(topology, dc.name) for dc in topology.datacenters}
    tcp_buffer = _tcp_buffer_bytes(topology, paths)
    host_sysctls = (*COMMON_SYSCTLS,
                    ("net.ipv4.tcp_rmem", f"4096 131072 {tcp_buffer}"),
                    ("net.ipv4.tcp_wmem", f"4096 16384 {tcp_buffer}"),
                    ("net.ipv4.tcp_congestion_control", topology.tcp.congestion_control),
                    ("net.ipv4.tcp_slow_start_after_idle", "1" if topology.tcp.slow_start_after_idle else "0"))
    # net.core.[rw]mem_max are read-only outside the root namespace (they cap SO_RCVBUF/SO_SNDBUF only);
    # TCP autotuning is bounded by tcp_rmem/tcp_wmem, which are per namespace.
    nodes: list[Node] = []
    veths: list[Veth] = []
    otn_addr = _otn_addresses(topology)
    for dc_index, dc in enumerate(topology.datacenters):
        subnet = dc_subnet(topology, dc_index)
        gateway = subnet.network_address + 1
        rtr = router_name(dc.name)
        fabric_mtu = dc.fabric.mtu or (RDMA_FABRIC_MTU if topology.rdma == "softroce" else FABRIC_MTU)
        ports = tuple(f"h{i + 1}" for i in range(len(dc.hosts)))
        for i, host in enumerate(dc.hosts):
            address = ipaddress.IPv4Interface(f"{subnet.network_address + FIRST_HOST_OCTET + i}/{subnet.prefixlen}")
            nodes.append(Node(
                name=host, dc=dc.name, role="host", netns=netns_name(name, host),
                interfaces=(Interface(HOST_IFNAME, address, fabric_mtu),),
                routes=(Route(ipaddress.IPv4Network("0.0.0.0/0"), gateway, HOST_IFNAME),),
                sysctls=host_sysctls))
            veths.append(Veth("fabric", host, HOST_IFNAME, rtr, ports[i], fabric_mtu))
        interfaces = [Interface(BRIDGE_IFNAME, ipaddress.IPv4Interface(f"{gateway}/{subnet.prefixlen}"), fabric_mtu)]
        interfaces += [Interface(p, None, fabric_mtu) for p in ports]
        for link in topology.links_of(dc.name):
            interfaces.append(Interface(otn_ifname(link.index), otn_addr[(link.index, dc.name)], link.mtu))
        routes = _router_routes(topology, dc.name, paths[dc.name], otn_addr, gateway)
        nodes.append(Node(name=rtr, dc=dc.name, role="router", netns=netns_name(name, rtr),
                          interfaces=tuple(interfaces), routes=routes, sysctls=COMMON_SYSCTLS + ROUTER_SYSCTLS,
                          bridge=BRIDGE_IFNAME, bridge_ports=ports))
    otn_veths, directions = _otn_directions(topology, tcp_buffer)
    veths += otn_veths
    notes = tuple(f"{lk.name}: emulated at 1:{1 / lk.scale:g} of the real {lk.real_rate_bps / 1e9:g} Gbit/s"
                  for lk in topology.links if lk.scale is not None and lk.real_rate_bps)
    return Plan(testbed=name, topology=topology.name, source=topology.source, nodes=tuple(nodes),
                veths=tuple(veths), directions=tuple(directions), tcp_buffer_bytes=tcp_buffer, paths=paths, notes=notes,
                fabrics={dc.name: dc.fabric for dc in topology.datacenters}, rdma=topology.rdma,
                background=topology.background)


def _otn_directions(topology: Topology, tcp_buffer: int) -> tuple[list[Veth], list[LinkDirection]]:
    """Each OTN link's veth between its routers, and both its directions with their queues and edges."""
    veths: list[Veth] = []
    directions: list[LinkDirection] = []
    senders = len(topology.hosts) + sum(load.flows for load in topology.background)   # each flow has a window
    for link in topology.links:
        veths.append(Veth("otn", router_name(link.a), otn_ifname(link.index), router_name(link.b),
                          otn_ifname(link.index), link.mtu, link=link.name))
        rtt = link.a_to_b.delay_s + link.b_to_a.delay_s
        for src, dst in ((link.a, link.b), (link.b, link.a)):
            d = link.direction(src)
            wire = link.mtu + ETH_OVERHEAD
            window_packets = max(MIN_QUEUE_PACKETS, math.ceil(max(1, senders) * tcp_buffer / wire))
            edge = (None if link.edge is None else
                    edge_model.resolve_edge(link.edge, d.rate_bps, d.delay_s, link.direction(dst).delay_s))
            directions.append(LinkDirection(
                link=link.name, src_dc=src, dst_dc=dst,
                src_node=router_name(src), src_ifname=otn_ifname(link.index),
                dst_node=router_name(dst), dst_ifname=otn_ifname(link.index),
                delay_s=d.delay_s, rate_bps=d.rate_bps, jitter_s=d.jitter_s, loss=d.loss, lossless=link.lossless,
                mtu=link.mtu, bdp_bytes=math.ceil(d.rate_bps * rtt / 8),
                rate_queue_packets=window_packets,
                delay_queue_packets=delay_queue_packets(d.rate_bps, d.delay_s, d.jitter_s, link.mtu, edge,
                                                        window_packets),
                real_rate_bps=link.real_rate_bps, edge=edge))
    return veths, directions


def delay_queue_packets(rate_bps: float, delay_s: float, jitter_s: float, mtu: int,
                        edge: EdgeDirection | None = None, window_packets: int = 0) -> int:
    """Packets the delay line (or netem) must hold to be lossless: 2 x rate x (delay + jitter) in full-size frames;
    with an edge, its buffer too and every sender's window (`window_packets`: what a pause, or a deep edge queue,
    holds on the delay line)."""
    frames = math.ceil(2 * rate_bps * (delay_s + jitter_s) / 8 / (mtu + ETH_OVERHEAD))
    if edge is not None:
        frames += math.ceil(edge.buffer_bytes / (mtu + ETH_OVERHEAD)) + window_packets
    return max(MIN_QUEUE_PACKETS, frames)


class ReshapeError(TestbedError, ValueError):
    """A link direction cannot take the values asked at run time; the message says why and what it can take."""


def reshape(direction: LinkDirection, *, delay_s: float | None = None, rate_bps: float | None = None,
            jitter_s: float | None = None, loss: float | None = None,
            real_rate_bps: float | None = None, edge_rate_bps: float | None = None) -> LinkDirection:
    """A direction with new values (run-time change); queues are re-sized, lossless links refuse loss.
    `real_rate_bps`: the deployment's rate the emulated one stands for (compute as time scales messages by it).
    `edge_rate_bps`: the receiving edge's DC-side port rate (the congestion test's spine cut)."""
    d = direction
    new = dataclasses.replace(
        d, delay_s=d.delay_s if delay_s is None else delay_s, rate_bps=d.rate_bps if rate_bps is None else rate_bps,
        jitter_s=d.jitter_s if jitter_s is None else jitter_s, loss=d.loss if loss is None else loss,
        real_rate_bps=d.real_rate_bps if real_rate_bps is None else real_rate_bps,
        edge=_reshaped_edge(d, rate_bps, delay_s, edge_rate_bps))
    if new.lossless and new.loss:
        raise ReshapeError(f"{d.link} is lossless: it cannot take loss {new.loss:g} (set lossless: false in the "
                         "topology file for fault experiments)")
    if new.jitter_s > new.delay_s:
        raise ReshapeError(f"jitter {new.jitter_s:g} s exceeds the delay {new.delay_s:g} s",
                           hint="give a jitter no larger than the delay")
    if new.delay_s < 0 or new.rate_bps <= 0:
        raise ReshapeError("delay must be >= 0 and rate > 0")
    return dataclasses.replace(new, delay_queue_packets=delay_queue_packets(new.rate_bps, new.delay_s, new.jitter_s,
                                                                            new.mtu, new.edge,
                                                                            new.rate_queue_packets))


def _reshaped_edge(d: LinkDirection, rate_bps: float | None, delay_s: float | None,
                   edge_rate_bps: float | None) -> EdgeDirection | None:
    """The edge after a run-time change: headroom re-derived from the new rate and delay (the reverse direction's
    delay as planned), refused where it no longer fits; a new DC-side rate."""
    if d.edge is None:
        if edge_rate_bps is not None:
            raise ReshapeError(f"{d.link} has no edge buffer: it cannot take an edge rate",
                               hint="give the link 'lossless: pfc', a 'buffer' or an 'edge_rate' in the topology file")
        return None
    edge = d.edge
    reverse_s = edge.pause_delay_s - edge_model.PFC_RESPONSE_S
    headroom = edge_model.headroom_bytes(d.rate_bps if rate_bps is None else rate_bps,
                                         d.delay_s if delay_s is None else delay_s, reverse_s)
    new = dataclasses.replace(edge, headroom_bytes=headroom,
                              drain_rate_bps=edge.drain_rate_bps if edge_rate_bps is None else edge_rate_bps)
    found = edge_model.edge_problems(new)
    if found:
        _key, problem, fix = found[0]
        raise ReshapeError(f"{d.link} ({d.label}): {problem}", hint=fix)
    return new


def _otn_addresses(topology: Topology) -> dict[tuple[int, str], ipaddress.IPv4Interface]:
    result = {}
    for link in topology.links:
        net = otn_subnet(topology, link.index)
        result[(link.index, link.a)] = ipaddress.IPv4Interface(f"{net.network_address + 1}/{net.prefixlen}")
        result[(link.index, link.b)] = ipaddress.IPv4Interface(f"{net.network_address + 2}/{net.prefixlen}")
    return result


def _router_routes(topology: Topology, dc: str, paths: dict[str, list[str]],
                   otn_addr: dict[tuple[int, str], ipaddress.IPv4Interface],
                   src: ipaddress.IPv4Address) -> tuple[Route, ...]:
    routes = []
    for dst_index, dst in enumerate(topology.datacenters):
        if dst.name == dc:
            continue
        nxt = paths[dst.name][1]
        link = next(lk for lk in topology.links_of(dc) if lk.other(dc) == nxt)
        routes.append(Route(dc_subnet(topology, dst_index), otn_addr[(link.index, nxt)].ip, otn_ifname(link.index),
                            src))
    return tuple(routes)


def _tcp_buffer_bytes(topology: Topology, paths: dict[str, dict[str, list[str]]]) -> int:
    """TCP buffer max: twice the largest path bandwidth-delay product (round trip), at least 6 MiB."""
    largest = 0.0
    for src, by_dst in paths.items():
        for dst, path in by_dst.items():
            if src == dst:
                continue
            back = paths[dst][src]
            rtt = path_delay(topology, path) + path_delay(topology, back)
            largest = max(largest, path_rate(topology, path) * rtt / 8)
    return max(MIN_TCP_BUFFER, int(math.ceil(2 * largest / 4096) * 4096))
