"""Loader: shipped topologies load; every bad fixture gives its precise error (file, key path, fix)."""

from pathlib import Path

import pytest
from conftest import assert_precise_error

from testbed.topology import TopologyError, load_topology, parse_topology
from testbed.topology.model import FIBRE_DELAY_S_PER_KM
from testbed.util.paths import shipped_topologies

BAD = sorted((Path(__file__).parent / "fixtures" / "bad").glob("*.yaml"))


def test_fixture_folder_is_populated() -> None:
    assert len(BAD) >= 15


@pytest.mark.parametrize("path", BAD, ids=lambda p: p.stem)
def test_bad_topology_gives_precise_error(path: Path) -> None:
    assert_precise_error(path, load_topology, TopologyError)


@pytest.mark.parametrize("path", shipped_topologies(), ids=lambda p: p.stem)
def test_shipped_topologies_load(path: Path) -> None:
    topology = load_topology(path)
    assert len(topology.datacenters) >= 2
    assert topology.links
    for link in topology.links:
        assert link.lossless
        assert link.scale is not None, f"{path}: state the scale factor with real_rate"


def test_distance_gives_fibre_delay_and_explicit_delay_overrides() -> None:
    t = parse_topology("""
name: t
datacenters: {a: {hosts: 1}, b: {hosts: 1}}
links:
  - {a: a, b: b, distance: 1000km, b_to_a: {delay: 7ms}, extra_delay: 0.5ms}
""")
    link = t.links[0]
    assert link.a_to_b.delay_s == pytest.approx(1000 * FIBRE_DELAY_S_PER_KM + 0.5e-3)
    assert link.b_to_a.delay_s == pytest.approx(7.5e-3)


def test_inheritance_defaults_then_datacenter_then_link_then_direction() -> None:
    t = parse_topology("""
name: t
defaults: {link: {rate: 100mbit, mtu: 9000}, fabric: {rate: 40gbit}}
datacenters:
  a: {hosts: 1, link: {rate: 200mbit}, fabric: {latency: 3us}}
  b: {hosts: 1}
  c: {hosts: 1}
links:
  - {a: a, b: b, distance: 10km}
  - {a: b, b: c, distance: 10km, rate: 300mbit, b_to_a: {rate: 50mbit}}
""")
    ab, bc = t.links
    assert ab.a_to_b.rate_bps == 200e6          # from DC a's link defaults (direction leaving a)
    assert ab.b_to_a.rate_bps == 100e6          # from defaults
    assert ab.mtu == 9000
    assert bc.a_to_b.rate_bps == 300e6          # link beats defaults
    assert bc.b_to_a.rate_bps == 50e6           # direction beats link
    assert t.dc("a").fabric.rate_bps == 40e9 and t.dc("a").fabric.latency_s == pytest.approx(3e-6)


def test_named_and_counted_hosts_in_dc_order() -> None:
    t = parse_topology("name: t\ndatacenters: {x: {hosts: 2}, y: {hosts: [gpu-1]}}\n"
                       "links: [{a: x, b: y, delay: 1ms}]")
    assert [h for h, _ in t.hosts] == ["x-h1", "x-h2", "gpu-1"]


def test_all_problems_reported_at_once() -> None:
    with pytest.raises(TopologyError) as err:
        parse_topology("name: t\ndatacenters: {a: {hosts: 1}, b: {hosts: 1}}\n"
                       "links: [{a: a, b: zz, distance: 1km}, {a: a, b: b, distance: 1km, rate: 5Gbps}]", "f.yaml")
    paths = {p.path for p in err.value.problems}
    assert {"links[0].b", "links[1].rate"} <= paths


def test_router_name_collision_rejected() -> None:
    with pytest.raises(TopologyError, match="taken by a datacenter's router"):
        parse_topology("name: t\ndatacenters: {a: {hosts: [b-rtr]}, b: {hosts: 1}}\nlinks: [{a: a, b: b, delay: 1ms}]")


@pytest.mark.parametrize("path", shipped_topologies(), ids=lambda p: p.stem)
def test_shipped_topologies_match_json_schema(path: Path) -> None:
    import json

    import jsonschema
    import yaml

    schema = json.loads((Path(__file__).parent.parent / "testbed" / "topology" / "schema.json").read_text())
    jsonschema.validate(yaml.safe_load(path.read_text()), schema)


def test_schema_knows_every_key_the_loader_accepts() -> None:
    import json

    from testbed.topology import loader

    schema = json.loads((Path(__file__).parent.parent / "testbed" / "topology" / "schema.json").read_text())
    assert set(schema["properties"]) == loader.TOP_KEYS
    assert set(schema["properties"]["links"]["items"]["properties"]) == loader.LINK_KEYS
    assert set(schema["$defs"]["direction"]["properties"]) == loader.DIRECTION_KEYS
    assert set(schema["$defs"]["linkDefaults"]["properties"]) == loader.LINK_DEFAULT_KEYS
