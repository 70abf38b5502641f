"""Property-based: whatever a topology file holds (any bytes, any YAML value in any position, mutated
shipped topologies, huge or deeply nested documents), loading it gives a Topology or a TopologyError that
names the problem, never another exception; the CLI exits 2 with a reason, never a traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import hypothesis  # noqa: F401,E402  (a broken install fails here, it does not skip)
import pytest
import yaml
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from testbed.topology import Topology, TopologyError, load_topology, parse_topology  # noqa: E402
from testbed.topology.loader import MAX_TOPOLOGY_BYTES  # noqa: E402
from testbed.util.paths import shipped_topologies  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=True),
                    st.text(max_size=12), st.sampled_from(["1gbit", "10ms", "-5km", "0", "1e400", "nan", "dc-a",
                                                           "dc-a-rtr", "10.0.0.0/8", "300.1.1.1/33", "", "--"]))
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                       st.dictionaries(st.one_of(st.text(max_size=8), scalars), inner,
                                                                       max_size=4)), max_leaves=20)
KEYS = ["name", "description", "defaults", "datacenters", "links", "addressing", "fabric", "link", "hosts", "rate",
        "delay", "distance", "mtu", "lossless", "jitter", "loss", "extra_delay", "a", "b", "a_to_b", "b_to_a",
        "real_rate", "latency", "base", "distance_km"]


def _outcome(text: str) -> Topology | TopologyError:
    try:
        return parse_topology(text, "fuzz.yaml")
    except TopologyError as exc:
        assert exc.problems and all(p.problem and p.fix for p in exc.problems)
        return exc


@FUZZ
@given(st.binary(max_size=400))
def test_any_bytes(tmp_path_factory: pytest.TempPathFactory, data: bytes) -> None:
    path = tmp_path_factory.mktemp("fuzz") / "t.yaml"
    path.write_bytes(data)
    try:
        load_topology(path)
    except TopologyError as exc:
        assert exc.problems


@FUZZ
@given(st.dictionaries(st.sampled_from(KEYS), values, max_size=6))
def test_any_value_in_any_top_level_position(doc: dict[str, Any]) -> None:
    _outcome(yaml.safe_dump(doc))


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [prefix]
    if isinstance(node, dict):
        for k, v in node.items():
            found += _paths(v, (*prefix, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            found += _paths(v, (*prefix, i))
    return found


SHIPPED = [yaml.safe_load(p.read_text()) for p in shipped_topologies()]


@FUZZ
@given(st.data())
def test_mutated_shipped_topologies(data: st.DataObject) -> None:
    import copy

    doc = copy.deepcopy(data.draw(st.sampled_from(SHIPPED)))
    for _ in range(data.draw(st.integers(1, 3))):
        path = data.draw(st.sampled_from(_paths(doc)))
        if not path:
            continue
        parent = doc
        for key in path[:-1]:
            parent = parent[key]
        action = data.draw(st.sampled_from(["replace", "delete", "add"]))
        if action == "delete":
            del parent[path[-1]]
        elif action == "add" and isinstance(parent, dict):
            parent[data.draw(st.sampled_from(KEYS))] = data.draw(values)
        else:
            parent[path[-1]] = data.draw(values)
    _outcome(yaml.safe_dump(doc))


def test_yaml_types_plain_json_lacks() -> None:
    for text in ("name: !!binary aGVsbG8=\ndatacenters: {a: {hosts: 1}}\n",
                 "name: 2026-12-03\ndatacenters: {a: {hosts: 2026-12-03 10:00:00}}\n",
                 "name: x\ndatacenters: {? [1, 2] : {hosts: 1}}\n",
                 "name: x\ndatacenters: {a: {hosts: 1}, b: {hosts: 1}}\nlinks: [{a: a, b: b, delay: .inf}]\n",
                 "&a [*a]\n", "name: x\ndatacenters: &d {a: *d}\n", "---\n...\n", "--- 1\n--- 2\n"):
        _outcome(text)


def test_huge_and_deeply_nested_documents(tmp_path: Path) -> None:
    assert isinstance(_outcome("[" * 50_000 + "]" * 50_000), TopologyError)
    assert isinstance(_outcome("a: " + "{b: " * 5_000 + "1" + "}" * 5_000), TopologyError)
    big = tmp_path / "big.yaml"
    big.write_text("name: big\n" + "#" * (MAX_TOPOLOGY_BYTES + 1))
    with pytest.raises(TopologyError, match="larger than"):
        load_topology(big)
    many = "name: many\ndatacenters:\n" + "".join(f"  dc{i}: {{hosts: 1}}\n" for i in range(300))
    _outcome(many)


def test_cli_exits_2_with_a_reason_on_bytes_that_are_not_utf8(tmp_path: Path) -> None:
    bad = tmp_path / "latin1.yaml"
    bad.write_bytes("name: caf\xe9\ndatacenters: {a: {hosts: 1}}\n".encode("latin-1"))
    result = subprocess.run([sys.executable, "-m", "testbed", "plan", str(bad)], capture_output=True, text=True,
                            cwd=REPO, timeout=60)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert str(bad) in result.stderr and "UTF-8" in result.stderr
