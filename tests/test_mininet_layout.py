"""Unit: the root-namespace names the Mininet backend gives its switches (pure, no root)."""

from __future__ import annotations

import pytest
from conftest import REPO

from testbed.backends.base import BackendError
from testbed.backends.mininet_net import IFNAMSIZ, layout
from testbed.plan import build_plan
from testbed.topology import load_topology


def _plan(topology: str, name: str):
    return build_plan(load_topology(REPO / "topologies" / f"{topology}.yaml"), name)


def test_every_name_fits_ifnamsiz_and_each_node_has_one_port() -> None:
    plan = _plan("4dc-32hosts", "a-rather-long-testbed-name")
    switches = layout(plan)
    assert [sw.dc for sw in switches] == ["dc-a", "dc-b", "dc-c", "dc-d"]
    names = [sw.name for sw in switches] + [p for sw in switches for p in sw.ports.values()]
    assert len(names) == len(set(names)) and all(len(n) <= IFNAMSIZ for n in names)
    assert sorted(n for sw in switches for n in sw.ports) == sorted(n.name for n in plan.nodes)
    assert all(sw.ports[f"{sw.dc}-rtr"] == f"{sw.name}-eth1" for sw in switches)
    assert len({sw.dpid for sw in switches}) == 4 and all(len(sw.dpid) == 16 for sw in switches)


def test_two_testbeds_of_one_topology_get_disjoint_names() -> None:
    one, two = layout(_plan("2dc-1000km", "one")), layout(_plan("2dc-1000km", "two"))
    assert {sw.name for sw in one}.isdisjoint(sw.name for sw in two)


def test_a_dc_too_big_for_port_names_is_refused_with_the_fix(tmp_path) -> None:
    topo = tmp_path / "big.yaml"
    topo.write_text("name: big\ndatacenters:\n  dc-a: {hosts: 120}\n  dc-b: {hosts: 1}\n"
                    "links:\n  - {a: dc-a, b: dc-b, distance: 100km}\n")
    with pytest.raises(BackendError, match="too many hosts.*--backend netns"):
        layout(build_plan(load_topology(topo), "big"))
