"""Mininet backend, root tier (marker `mininet`): the same plans built with Mininet's API, read back from the kernel.

What differs from netns is asserted exactly: the only root-namespace objects are the recorded switches and
their ports, and `down` removes them (and every Mininet shell and private OVS daemon) by name or PID.
Shaping, training and the CLI on this backend are covered by the backend-parametrized tests elsewhere.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO, netns_with_prefix, no_rdma_here, run_cli
from pyroute2 import IPRoute

from testbed.backends import nsfs, ovs
from testbed.backends.mininet_net import layout
from testbed.check.verify import check_reachability, check_routes
from testbed.deploy import lifecycle
from testbed.plan import build_plan
from testbed.shaping.htb import read_class_rate
from testbed.state import store as state
from testbed.topology import load_topology
from testbed.util.paths import shipped_topologies

pytestmark = [pytest.mark.root, pytest.mark.mininet]


def _root_links() -> set[str]:
    with IPRoute() as root:
        return {link.get("IFLA_IFNAME") for link in root.get_links()}


def _mininet_shells(name: str) -> list[int]:
    """PIDs of Mininet node shells of this testbed (`bash ... mininet:<node>`), by reading /proc."""
    nodes = {n.name for n in build_plan(load_topology(REPO / "topologies" / "4dc-32hosts.yaml"), name).nodes}
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(arg.startswith(b"mininet:") and arg[8:].decode() in nodes for arg in cmdline):
            found.append(int(entry))
    return found


def _state(name: str) -> dict:
    return json.loads((state.state_dir() / f"{name}.json").read_text())


@pytest.mark.parametrize("topology", shipped_topologies(), ids=lambda p: p.stem)
def test_shipped_topology_up_reach_routes_down(topology: Path, unique_name: str) -> None:
    before = _root_links()
    run_cli("up", str(topology), "--name", unique_name, "--backend", "mininet", "--no-verify",
            *no_rdma_here(topology))
    plan = build_plan(load_topology(topology), unique_name)
    try:
        assert netns_with_prefix(f"tb-{unique_name}-") == sorted(plan.netns_names())
        recorded = set(state.TestbedState.load(unique_name).mininet.root_interfaces)
        assert _root_links() - before == recorded, "only the recorded switches and ports may be in the root namespace"
        reach = check_reachability(plan)
        hosts = len(plan.hosts)
        assert len(reach) == hosts * (hosts - 1) and all(c.ok for c in reach), [c for c in reach if not c.ok]
        routes = check_routes(plan)
        assert routes and all(c.ok for c in routes), [c for c in routes if not c.ok]
        assert _mininet_shells(unique_name) == [], "Mininet's shells end once the namespaces are pinned"
    finally:
        run_cli("down", unique_name)
    assert netns_with_prefix(f"tb-{unique_name}-") == []
    assert _root_links() == before
    assert not (state.state_dir() / f"{unique_name}.json").exists()


def test_kernel_objects_match_plan_and_fabric_is_shaped_above_1_gbit(unique_name: str) -> None:
    run_cli("up", "4dc-ring", "--name", unique_name, "--backend", "mininet", "--no-verify")
    plan = build_plan(load_topology(REPO / "topologies" / "4dc-ring.yaml"), unique_name)
    try:
        switch = next(sw for sw in layout(plan) if sw.dc == "dc-a")
        with IPRoute() as root:
            bridge = root.link_lookup(ifname=switch.name)[0]
            info = root.get_links(bridge)[0].get_nested("IFLA_LINKINFO", "IFLA_INFO_DATA")
            assert info.get("IFLA_BR_NF_CALL_IPTABLES") == 0      # our frames skip the root's iptables
            for node, port in switch.ports.items():
                link = root.get_links(root.link_lookup(ifname=port)[0])[0]
                assert link.get("IFLA_MASTER") == bridge, port
                if node != "dc-a-rtr":   # ports towards hosts carry the 10 Gbit fabric rate (TCLink stops at 1)
                    assert read_class_rate(root, port) == 10e9
        rtr = plan.node("dc-a-rtr")
        with nsfs.entered(rtr.netns):
            ipr = IPRoute()
            assert nsfs.read_sysctl("net.ipv4.ip_forward") == "1"
        with ipr:
            names = {lk.get("IFLA_IFNAME") for lk in ipr.get_links()}
            assert {"fabric", "otn0", "otn3"} <= names
            addrs = {a.get("IFA_ADDRESS") for a in ipr.get_addr()}
            assert {str(i.address.ip) for i in rtr.interfaces if i.address} <= addrs
        host = plan.node("dc-c-h2")
        with nsfs.entered(host.netns):
            ipr = IPRoute()
            assert nsfs.read_sysctl("net.ipv4.tcp_rmem").split()[-1] == str(plan.tcp_buffer_bytes)
        with ipr:
            default = [r for r in ipr.get_routes() if r.get("dst_len") == 0 and r.get("RTA_GATEWAY")]
            assert default[0].get("RTA_GATEWAY") == "10.100.2.1"
            assert read_class_rate(ipr, "eth0") == 10e9
        status = json.loads(run_cli("status", unique_name, "--json").stdout)
        assert status["backend"] == "mininet" and status["health"] == "ok"
        assert {sw["name"] for sw in status["switches"]} == {sw.name for sw in layout(plan)}
    finally:
        run_cli("down", unique_name)


def test_deleted_switch_is_reported_and_down_still_cleans(unique_name: str) -> None:
    before = _root_links()
    run_cli("up", "2dc-1000km", "--name", unique_name, "--backend", "mininet", "--no-verify")
    plan = build_plan(load_topology(REPO / "topologies" / "2dc-1000km.yaml"), unique_name)
    gone = layout(plan)[1].name
    try:
        subprocess.run(["ip", "link", "del", gone], check=True)
        status = json.loads(run_cli("status", unique_name, "--json").stdout)
        assert status["health"].startswith("degraded") and f"switch {gone} gone" in status["health"]
        assert not all(c.ok for c in check_reachability(plan, timeout_s=0.5))
    finally:
        run_cli("down", unique_name)
    assert _root_links() == before and netns_with_prefix(f"tb-{unique_name}-") == []


def test_sigkill_midway_then_down_leaves_nothing(unique_name: str) -> None:
    """Kill -9 `testbed up --backend mininet` while Mininet is building; `down` removes everything it made."""
    before = _root_links()
    caught_midway = False
    state_file = state.state_dir() / f"{unique_name}.json"
    for _ in range(10):
        proc = subprocess.Popen([sys.executable, "-m", "testbed", "up", "4dc-32hosts", "--name", unique_name,
                                 "--backend", "mininet", "--no-verify"], cwd=REPO, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and len(_root_links() - before) < 6:
            time.sleep(0.001)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        if _state(unique_name)["phase"] == "creating" and _root_links() - before:
            caught_midway = True
            assert "creator died" in json.loads(run_cli("status", unique_name, "--json").stdout)["health"]
        run_cli("down", unique_name)
        assert netns_with_prefix(f"tb-{unique_name}-") == []
        assert _root_links() == before
        assert not state_file.exists()
        deadline = time.monotonic() + 5
        while _mininet_shells(unique_name) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _mininet_shells(unique_name) == []
        if caught_midway:
            break
    assert caught_midway, "never managed to kill 'testbed up' midway"


@pytest.mark.parametrize("backend", ["mininet", "netns"])
def test_cli_script_pings_every_node_and_leaves_no_shell(backend: str, unique_name: str, tmp_path: Path) -> None:
    run_cli("up", "3dc-line", "--name", unique_name, "--backend", backend, "--verify", "skip")
    script = tmp_path / "cli.txt"
    script.write_text("nodes\ndc-a-h1 ip -o -4 addr show eth0\npingall\n")
    try:
        out = run_cli("cli", unique_name, "--script", str(script), timeout=120).stdout
        assert "dc-a-rtr" in out and "10.100.0.11/24" in out
        assert "Results: 0% dropped (72/72 received)" in out
        assert _mininet_shells(unique_name) == []
    finally:
        run_cli("down", unique_name)


def test_switch_choice_is_explicit() -> None:
    refused = run_cli("up", "2dc-1000km", "--name", "never", "--switch", "linuxbridge", check=False)
    assert refused.returncode == 1 and "--backend mininet only" in refused.stderr
    if not ovs.kernel_datapath():
        refused = run_cli("up", "2dc-1000km", "--name", "never", "--backend", "mininet", "--switch", "ovs",
                          check=False)
        assert refused.returncode == 1 and "openvswitch kernel module" in refused.stderr and "ovs-user" in refused.stderr
    assert netns_with_prefix("tb-never-") == []


@pytest.mark.skipif(not ovs.installed(), reason="Open vSwitch userspace tools are not installed")
def test_ovs_userspace_switch_private_instance(unique_name: str) -> None:
    before = _root_links()
    run_cli("up", "2dc-1000km", "--name", unique_name, "--backend", "mininet", "--switch", "ovs-user", "--no-verify")
    try:
        recorded = _state(unique_name)
        daemons = [p for p in recorded["processes"] if p["role"] in ("ovsdb-server", "ovs-vswitchd")]
        assert len(daemons) == 2
        backend = lifecycle.open_backend(unique_name)
        env = {**os.environ, **backend.ovs_env()}
        bridges = subprocess.run(["ovs-vsctl", "list-br"], capture_output=True, text=True, env=env, check=True).stdout
        assert set(bridges.split()) == {sw["name"] for sw in recorded["mininet"]["switches"]}
        dp = subprocess.run(["ovs-vsctl", "get", "bridge", bridges.split()[0], "datapath_type"], capture_output=True,
                            text=True, env=env, check=True).stdout
        assert dp.strip() == "netdev"
        reach = check_reachability(backend.state.plan)
        assert reach and all(c.ok for c in reach), reach
        second = run_cli("up", "2dc-1000km", "--name", unique_name + "b", "--backend", "mininet", "--switch",
                         "ovs-user", "--no-verify", check=False)
        assert second.returncode == 1 and "cannot share its ovs-netdev device" in second.stderr
        assert netns_with_prefix(f"tb-{unique_name}b-") == []
    finally:
        run_cli("down", unique_name)
    assert _root_links() == before
    for p in daemons:
        assert not state.ProcessRecord(p["pid"], p["start_ticks"], p["role"]).alive()
