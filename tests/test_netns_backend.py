"""Root tier: real namespaces. Every assertion reads kernel state back (netlink, /proc, ICMP)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import BACKEND_PARAMS, REPO, netns_with_prefix, no_rdma_here, run_cli
from pyroute2 import IPRoute

from testbed.backends import nsfs
from testbed.check.verify import check_reachability, check_routes
from testbed.plan import build_plan
from testbed.topology import load_topology
from testbed.util.paths import shipped_topologies

pytestmark = pytest.mark.root


def _ipr(netns: str) -> IPRoute:
    with nsfs.entered(netns):
        return IPRoute()


@pytest.mark.parametrize("topology", shipped_topologies(), ids=lambda p: p.stem)
def test_shipped_topology_up_reach_routes_down(topology: Path, unique_name: str) -> None:
    before_root_links = len(IPRoute().get_links())
    run_cli("up", str(topology), "--name", unique_name, "--no-verify", *no_rdma_here(topology))
    plan = build_plan(load_topology(topology), unique_name)
    try:
        assert netns_with_prefix(f"tb-{unique_name}-") == sorted(plan.netns_names())
        reach = check_reachability(plan)
        hosts = len(plan.hosts)
        assert len(reach) == hosts * (hosts - 1)
        assert all(c.ok for c in reach), [c for c in reach if not c.ok]
        routes = check_routes(plan)
        assert routes and all(c.ok for c in routes), [c for c in routes if not c.ok]
        assert len(IPRoute().get_links()) == before_root_links, "nothing may be added to the root namespace"
    finally:
        run_cli("down", unique_name)
    assert netns_with_prefix(f"tb-{unique_name}-") == []
    assert not (Path(os.environ["TESTBED_STATE_DIR"]) / f"{unique_name}.json").exists()


def test_kernel_objects_match_plan(unique_name: str) -> None:
    run_cli("up", "4dc-ring", "--name", unique_name, "--no-verify")
    plan = build_plan(load_topology(REPO / "topologies" / "4dc-ring.yaml"), unique_name)
    try:
        rtr = plan.node("dc-a-rtr")
        with _ipr(rtr.netns) as ipr:
            names = {lk.get("IFLA_IFNAME"): lk for lk in ipr.get_links()}
            assert {"fabric", "h1", "h2", "otn0", "otn3"} <= set(names)
            bridge = names["fabric"]["index"]
            assert names["h1"].get("IFLA_MASTER") == bridge and names["h2"].get("IFLA_MASTER") == bridge
            assert nsfs_sysctl(rtr.netns, "net.ipv4.ip_forward") == "1"
            addrs = {a.get("IFA_ADDRESS") for a in ipr.get_addr()}
            assert {str(i.address.ip) for i in rtr.interfaces if i.address} <= addrs
        host = plan.node("dc-c-h2")
        with _ipr(host.netns) as ipr:
            default = [r for r in ipr.get_routes() if r.get("dst_len") == 0 and r.get("RTA_GATEWAY")]
            assert default[0].get("RTA_GATEWAY") == "10.100.2.1"
        assert nsfs_sysctl(host.netns, "net.ipv4.tcp_rmem").split()[-1] == str(plan.tcp_buffer_bytes)
    finally:
        run_cli("down", unique_name)


def nsfs_sysctl(netns: str, key: str) -> str:
    with nsfs.entered(netns):
        return nsfs.read_sysctl(key)


def test_two_testbeds_coexist_and_status_json(unique_name: str) -> None:
    other = unique_name + "b"
    run_cli("up", "2dc-1000km", "--name", unique_name, "--no-verify")
    try:
        run_cli("up", "2dc-1000km", "--name", other, "--no-verify")
        try:
            status = json.loads(run_cli("status", unique_name, "--json").stdout)
            assert status["phase"] == "up" and status["health"] == "ok"
            node = next(n for n in status["nodes"] if n["name"] == "dc-a-h1")
            assert node["dc"] == "dc-a" and node["role"] == "host" and node["netns"] == f"tb-{unique_name}-dc-a-h1"
            assert node["addresses"] == ["10.100.0.11/24"]
            link = status["links"][0]
            assert link["delay_s"] == pytest.approx(5e-3) and link["rate_bps"] == 1e9
            # the same node name exists in both: exec must ask which one
            ambiguous = run_cli("exec", "dc-a-h1", "--", "true", check=False)
            assert ambiguous.returncode != 0 and "--name" in ambiguous.stderr
            out = run_cli("exec", "dc-b-h1", "--name", other, "--", "ip", "-o", "-4", "addr", "show", "eth0")
            assert "10.100.1.11/24" in out.stdout
        finally:
            run_cli("down", other)
        assert netns_with_prefix(f"tb-{other}-") == []
        assert len(netns_with_prefix(f"tb-{unique_name}-")) == 4
    finally:
        run_cli("down", unique_name)


def test_up_twice_refused_and_exec_exit_code(unique_name: str) -> None:
    run_cli("up", "2dc-1000km", "--name", unique_name, "--no-verify")
    try:
        again = run_cli("up", "2dc-1000km", "--name", unique_name, check=False)
        assert again.returncode == 1 and "already up" in again.stderr
        assert run_cli("exec", "dc-a-h1", "--name", unique_name, "--", "sh", "-c", "exit 7", check=False).returncode == 7
    finally:
        run_cli("down", unique_name)


@pytest.mark.parametrize("backend", BACKEND_PARAMS)
def test_down_kills_processes_left_in_namespaces(backend: str, unique_name: str) -> None:
    run_cli("up", "2dc-1000km", "--name", unique_name, "--no-verify", "--backend", backend)
    namespace = f"tb-{unique_name}-dc-b-h1"
    sleeper = subprocess.Popen(["ip", "netns", "exec", namespace, "sleep", "600"])
    try:
        _wait_until_inside(sleeper, namespace)
        run_cli("down", unique_name)
        # down's SIGTERM (SIGKILL after its grace) ended it: not its own exit, not still running
        assert sleeper.wait(timeout=10) in (-signal.SIGTERM, -signal.SIGKILL)
    finally:
        if sleeper.poll() is None:
            sleeper.kill()
    assert netns_with_prefix(f"tb-{unique_name}-") == []


def _wait_until_inside(proc: subprocess.Popen, namespace: str, timeout_s: float = 10.0) -> None:
    """Until `proc` (ip netns exec, which execs its command) is in the namespace: /proc/PID/ns/net is its inode."""
    want = os.stat(f"/run/netns/{namespace}").st_ino
    deadline = time.monotonic() + timeout_s
    while os.stat(f"/proc/{proc.pid}/ns/net").st_ino != want:
        assert proc.poll() is None, f"it exited {proc.returncode} before entering {namespace}"
        assert time.monotonic() < deadline, f"not inside {namespace} after {timeout_s} s"
        time.sleep(0.01)


def test_sigkill_midway_then_down_leaves_nothing(unique_name: str) -> None:
    """Kill -9 `testbed up` while it is creating; `down` must still remove every namespace it made."""
    caught_midway = False
    state_file = Path(os.environ["TESTBED_STATE_DIR"]) / f"{unique_name}.json"
    for _ in range(10):
        proc = subprocess.Popen([sys.executable, "-m", "testbed", "up", "4dc-32hosts", "--name", unique_name,
                                 "--no-verify"], cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and len(netns_with_prefix(f"tb-{unique_name}-")) < 5:
            time.sleep(0.0005)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        state = json.loads(state_file.read_text())
        made = netns_with_prefix(f"tb-{unique_name}-")
        if state["phase"] == "creating" and 0 < len(made) < 36:
            caught_midway = True
            status = json.loads(run_cli("status", unique_name, "--json").stdout)
            assert "creator died" in status["health"]
        run_cli("down", unique_name)
        assert netns_with_prefix(f"tb-{unique_name}-") == []
        assert not state_file.exists()
        if caught_midway:
            break
    assert caught_midway, "never managed to kill 'testbed up' midway"


@pytest.mark.parametrize("fixture", sorted((REPO / "tests" / "fixtures" / "bad").glob("*.yaml"))[:6],
                         ids=lambda p: p.stem)
def test_bad_topology_exits_nonzero_and_creates_nothing(fixture: Path) -> None:
    before = sorted(os.listdir("/run/netns")) if os.path.isdir("/run/netns") else []
    result = run_cli("up", str(fixture), "--name", "never", check=False)
    assert result.returncode == 2
    assert str(fixture) in result.stderr
    after = sorted(os.listdir("/run/netns")) if os.path.isdir("/run/netns") else []
    assert after == before
    assert not list(Path(os.environ["TESTBED_STATE_DIR"]).glob("never*"))


def test_doctor_reports_shaper_decision() -> None:
    report = json.loads(run_cli("doctor", "--json").stdout)
    probes = {p["name"]: p for p in report["probes"]}
    assert probes["netns"]["ok"] and probes["qdisc htb"]["ok"]
    expected = "netem" if probes["qdisc netem"]["ok"] else "delayline" if probes["nfqueue"]["ok"] else "none"
    assert report["decision"]["shaper"] == expected
    assert netns_with_prefix("tb-doctor-") == []
