"""End-to-end round trips between DCs along their routes (testbed/check/paths.py) on a real 3-DC line brought up
with the delay line: every pair is measured host to host against the sum of the planned directions it crosses
both ways, and a plan that disagrees with what the links deliver fails exactly the pairs that cross the
disagreeing link."""

from __future__ import annotations

import dataclasses

import pytest
from conftest import REPO, run_cli

from testbed.check.paths import check_paths, planned_round_trip
from testbed.deploy import lifecycle
from testbed.plan.builder import build_plan
from testbed.topology.loader import load_topology


def test_the_planned_round_trip_sums_every_hop_both_ways_and_both_fabrics() -> None:
    plan = build_plan(load_topology(REPO / "topologies" / "3dc-line.yaml"), "t")
    hops = {(d.src_dc, d.dst_dc): d.delay_s for d in plan.directions}
    fabric = plan.fabrics["dc-a"].latency_s
    assert planned_round_trip(plan, "dc-a", "dc-c") == pytest.approx(
        hops["dc-a", "dc-b"] + hops["dc-b", "dc-c"] + hops["dc-c", "dc-b"] + hops["dc-b", "dc-a"] + 4 * fabric)
    assert planned_round_trip(plan, "dc-a", "dc-c") == pytest.approx(11e-3, abs=0.1e-3)     # 2 x (1.5 + 4) ms


@pytest.mark.root
def test_every_routed_pair_is_on_its_planned_delay_and_a_wrong_plan_fails_the_pairs_it_touches(
        unique_name: str) -> None:
    run_cli("up", "3dc-line", "--name", unique_name, "--verify", "skip", timeout=300)
    try:
        backend = lifecycle.open_backend(unique_name)
        checks = check_paths(backend, probes=10)
        assert [c.key for c in checks] == ["dc-a<->dc-b", "dc-a<->dc-c", "dc-b<->dc-c"]
        assert [c.value for c in checks] == pytest.approx([3e-3, 11e-3, 8e-3], abs=0.3e-3)   # measured, seconds
        assert all(c.ok for c in checks), [(c.subject, c.measured) for c in checks]
        # the plan says dc-b -> dc-c is 1 ms longer than the links were built with: the two pairs crossing it fail
        plan = backend.state.plan
        backend.state.plan = dataclasses.replace(plan, directions=[
            dataclasses.replace(d, delay_s=d.delay_s + 1e-3) if (d.src_dc, d.dst_dc) == ("dc-b", "dc-c") else d
            for d in plan.directions])
        wrong = {c.key: c.ok for c in check_paths(backend, probes=10)}
        assert wrong == {"dc-a<->dc-b": True, "dc-a<->dc-c": False, "dc-b<->dc-c": False}
        # ... and 1 ms shorter: the links deliver more than the plan; the unshaped legs' allowance above the plan
        # (measured, a fraction of a ms here) does not hide it
        backend.state.plan = dataclasses.replace(plan, directions=[
            dataclasses.replace(d, delay_s=d.delay_s - 1e-3) if (d.src_dc, d.dst_dc) == ("dc-b", "dc-c") else d
            for d in plan.directions])
        checks = check_paths(backend, probes=10)
        assert {c.key: c.ok for c in checks} == {"dc-a<->dc-b": True, "dc-a<->dc-c": False, "dc-b<->dc-c": False}
        assert all("the unshaped legs" in c.expected for c in checks), [c.expected for c in checks]
    finally:
        run_cli("down", unique_name)
