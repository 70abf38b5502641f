"""Inventory files: every bad fixture gives its precise error (file, key path, fix); a good one maps machines;
the per-machine shaping plan follows the topology's paths."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import assert_precise_error
from paperlab import paper_inventory

from testbed.remote.hostshape import plan_shapes
from testbed.remote.inventory import InventoryError, load_inventory

FIXTURES = Path(__file__).parent / "fixtures"
BAD = sorted((FIXTURES / "inventory" / "bad").glob("*.yaml"))


def test_one_bad_file_per_kind_of_mistake() -> None:
    assert len(BAD) >= 15


@pytest.mark.parametrize("path", BAD, ids=lambda p: p.stem)
def test_bad_inventory_gives_precise_error(path: Path) -> None:
    assert_precise_error(path, load_inventory, InventoryError)


def _good(tmp_path: Path) -> Path:
    return paper_inventory(tmp_path, dc_b="address: node-b.lab, data_address: 10.9.0.2, port: 2222, "
                                          "jump: admin@bastion:22",
                           dc_c="address: 192.0.2.3, data_address: 10.9.0.3, python: /opt/geo/bin/python, "
                                "accept_new_host_key: true")


def test_good_inventory_maps_machines_with_defaults_and_overrides(tmp_path: Path) -> None:
    inv = load_inventory(_good(tmp_path))
    a, b, c = inv.machines
    assert (a.name, a.dc, a.user, a.port, a.nic, a.key) == ("dc-a-h1", "dc-a", "root", 22, "data0", tmp_path / "id_ed25519")
    assert b.port == 2222 and b.jump is not None and (b.jump.user, b.jump.host, b.jump.port) == ("admin", "bastion", 22)
    assert c.python == "/opt/geo/bin/python" and c.accept_new_host_key and not a.accept_new_host_key
    assert inv.known_hosts == tmp_path / "known_hosts"


def test_each_machine_shapes_towards_every_other_dc_along_the_topology_path(tmp_path: Path) -> None:
    shapes = plan_shapes(load_inventory(_good(tmp_path)), "lab")
    a = {p.dc: p for p in shapes["dc-a-h1"].egress}
    assert a["dc-b"].delay_s == pytest.approx(0.004) and a["dc-c"].delay_s == pytest.approx(0.007)   # via dc-b
    assert a["dc-c"].rate_bps == 50e6 and a["dc-c"].addresses == ("10.9.0.3",)
    b_in = {p.dc: p for p in shapes["dc-b-h1"].ingress}
    assert b_in["dc-a"].delay_s == pytest.approx(0.004) and b_in["dc-c"].delay_s == pytest.approx(0.003)
    assert all(p.queue_packets > 0 for s in shapes.values() for p in (*s.egress, *s.ingress))
    assert {p.dc for p in shapes["dc-c-h1"].egress} == {"dc-a", "dc-b"}
