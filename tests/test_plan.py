"""Planner: addressing, shortest-delay routes, queue and buffer sizing (pure)."""

import ipaddress
import math

import pytest

from testbed.plan import build_plan
from testbed.topology import load_topology, parse_topology
from testbed.util.paths import TOPOLOGY_DIR


@pytest.fixture
def ring_plan():
    return build_plan(load_topology(TOPOLOGY_DIR / "4dc-ring.yaml"))


def test_addresses_unique_and_in_base(ring_plan) -> None:
    addresses = [i.address for n in ring_plan.nodes for i in n.interfaces if i.address]
    assert len({a.ip for a in addresses}) == len(addresses)
    base = ipaddress.IPv4Network("10.100.0.0/16")
    assert all(a.ip in base for a in addresses)


def test_routes_follow_shortest_delay(ring_plan) -> None:
    # dc-a -> dc-c: via dc-b is 2.5 + 6 ms, via dc-d is 10 + 4 ms -> via dc-b.
    assert ring_plan.paths["dc-a"]["dc-c"] == ["dc-a", "dc-b", "dc-c"]
    # dc-d -> dc-b: via dc-c 4 + 6 = 10 ms; via dc-a 10.5 (extra delay) + 2.5 = 13 ms.
    assert ring_plan.paths["dc-d"]["dc-b"] == ["dc-d", "dc-c", "dc-b"]
    rtr = ring_plan.node("dc-a-rtr")
    dc_c = next(r for r in rtr.routes if str(r.dst) == "10.100.2.0/24")
    dc_b_addr = ring_plan.node("dc-b-rtr").interfaces
    assert any(i.address and i.address.ip == dc_c.gateway for i in dc_b_addr)


def test_asymmetric_direction_shapes(ring_plan) -> None:
    da = next(s for s in ring_plan.directions if s.src_dc == "dc-d" and s.dst_dc == "dc-a")
    ad = next(s for s in ring_plan.directions if s.src_dc == "dc-a" and s.dst_dc == "dc-d")
    assert da.delay_s == pytest.approx(10.5e-3) and ad.delay_s == pytest.approx(10e-3)
    assert da.rate_bps == 500e6


def test_queue_and_buffer_sizing_from_bdp() -> None:
    t = parse_topology("name: t\ndatacenters: {a: {hosts: 2}, b: {hosts: 2}}\n"
                       "links: [{a: a, b: b, delay: 20ms, rate: 1gbit}]")
    plan = build_plan(t)
    rtt_bdp = 1e9 * 0.040 / 8
    assert plan.tcp_buffer_bytes >= 2 * rtt_bdp
    shape = plan.directions[0]
    assert shape.bdp_bytes == math.ceil(rtt_bdp)
    assert shape.delay_queue_packets >= 2 * 1e9 * 0.020 / 8 / 1514
    assert shape.rate_queue_packets * 1514 >= 4 * plan.tcp_buffer_bytes   # every host's window fits
    host = plan.node("a-h1")
    assert ("net.ipv4.tcp_rmem", f"4096 131072 {plan.tcp_buffer_bytes}") in host.sysctls


def test_namespace_names_prefixed_and_testbed_name_overrides(ring_plan) -> None:
    plan = build_plan(load_topology(TOPOLOGY_DIR / "4dc-ring.yaml"), "other")
    assert all(ns.startswith("tb-other-") for ns in plan.netns_names())
    assert len(set(ring_plan.netns_names())) == len(ring_plan.nodes) == 12


def test_a_routed_paths_planned_round_trip_is_every_hop_both_ways() -> None:
    """dc-a <-> dc-c on the ring goes via dc-b (1700 km, 8.5 ms each way); the fabrics add 2 us per DC each way."""
    from testbed.check.paths import planned_round_trip

    plan = build_plan(load_topology(TOPOLOGY_DIR / "4dc-ring.yaml"))
    assert plan.paths["dc-a"]["dc-c"] == ["dc-a", "dc-b", "dc-c"]
    assert [h.label for h in plan.hops("dc-a", "dc-c")] == ["dc-a -> dc-b", "dc-b -> dc-c"]
    assert planned_round_trip(plan, "dc-a", "dc-c") == pytest.approx(2 * 8.5e-3 + 4 * 2e-6)
    # the asymmetric direction (dc-d -> dc-a holds 0.5 ms more) counts once
    assert planned_round_trip(plan, "dc-a", "dc-d") == pytest.approx(2 * 10e-3 + 0.5e-3 + 4 * 2e-6)
