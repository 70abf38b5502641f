"""Stock-kernel tier: runs inside QEMU (make vm-test / testbed vm), where sch_netem and rdma_rxe exist.

The netem shaper must pass the same verification as the delay line on the same topology. Under TCG the
emulated path itself jitters by about a millisecond, which the verification's spread-aware tolerance
states in its output; a missing or misplaced delay still moves the median by the whole delay and fails.
"""

from __future__ import annotations

import os
import subprocess

import pytest
from conftest import REPO, netns_with_prefix, run_cli

from testbed.backends import ovs
from testbed.backends.vm import in_vm
from testbed.check.verify import verify_testbed
from testbed.deploy import lifecycle
from testbed.shaping.htb import read_qdiscs
from testbed.shaping.registry import shaper_for

pytestmark = [pytest.mark.vm, pytest.mark.skipif(not in_vm(), reason="runs inside the stock-kernel VM (make vm-test)")]

TOPO = str(REPO / "tests" / "fixtures" / "topologies" / "2dc-vm.yaml")


def _module_loaded(name: str) -> bool:
    return os.path.isdir(f"/sys/module/{name}")


@pytest.mark.parametrize("shaper", ["netem"])
def test_shaper_passes_verification_under_stock_kernel(shaper: str, unique_name: str) -> None:
    """netem here; the delay line passes the same verification on the same topology on the host
    (tests/test_shaping.py::test_delayline_passes_the_vm_tier_topology)."""
    assert _module_loaded("sch_netem"), "the guest must have loaded sch_netem"
    run_cli("up", TOPO, "--name", unique_name, "--shaper", shaper, "--verify", "skip", timeout=600)
    try:
        backend = lifecycle.open_backend(unique_name)
        report = verify_testbed(backend, level="quick", probes=20)
        print("\n".join(f"{c.kind:8} {c.subject:28} {c.expected:22} {c.measured:36} {'pass' if c.ok else 'FAIL'}"
                        for c in report.checks if c.kind not in ("reach", "route")))
        assert report.ok, [c for c in report.checks if not c.ok]
        if shaper == "netem":
            with backend.netlink("dc-a-rtr") as ipr:
                kinds = [q.kind for q in read_qdiscs(ipr, "otn0")]
            assert kinds == ["htb", "netem"]
            assert shaper_for(backend).health().ok
    finally:
        run_cli("down", unique_name)
    assert netns_with_prefix(f"tb-{unique_name}-") == []


@pytest.mark.mininet
def test_mininet_backend_on_the_ovs_kernel_datapath(unique_name: str) -> None:
    """Where the openvswitch module exists, `--switch auto` is OVS on the kernel datapath (a private
    ovs-vswitchd here: the guest runs no system one); verify passes and `down` leaves no datapath behind."""
    assert _module_loaded("openvswitch"), "the guest must have loaded openvswitch"
    before = _root_links()
    run_cli("up", TOPO, "--name", unique_name, "--backend", "mininet", "--verify", "skip", timeout=600)
    try:
        backend = lifecycle.open_backend(unique_name)
        info = backend.state.mininet
        assert info.switch == "ovs" and info.ovs_private
        datapaths = subprocess.run(["ovs-dpctl", "show"], capture_output=True, text=True, check=True).stdout
        for sw in info.switches:
            assert all(port in datapaths for port in sw.ports.values()), datapaths
        report = verify_testbed(backend, level="quick", probes=20)
        assert report.ok, [c for c in report.checks if not c.ok]
    finally:
        run_cli("down", unique_name)
    assert netns_with_prefix(f"tb-{unique_name}-") == []
    assert _root_links() == before, _root_links() ^ before


OVS_CTL = "/usr/share/openvswitch/scripts/ovs-ctl"


@pytest.mark.mininet
def test_mininet_backend_beside_the_systems_ovs(unique_name: str, tmp_path) -> None:
    """With the system's Open vSwitch running (started by Debian's ovs-ctl on the default rundir; only its
    database lives in a scratch folder, the guest's /etc being read-only), `--switch ovs` adds its bridges to
    that daemon, leaves the user's own bridge and the daemon alone, and deletes only its bridges at `down`."""
    assert _module_loaded("openvswitch"), "the guest must have loaded openvswitch"
    env = {**os.environ, "OVS_DBDIR": str(tmp_path), "OVS_LOGDIR": str(tmp_path), "OVS_SYSCONFDIR": str(tmp_path)}
    started = subprocess.run([OVS_CTL, "start", "--system-id=random"], capture_output=True, text=True, env=env)
    assert started.returncode == 0, started.stdout + started.stderr
    try:
        _vsctl("add-br", "userbr0", "--", "add-port", "userbr0", "userp0", "--", "set", "interface", "userp0",
               "type=internal")
        daemons = _system_ovs_pids()
        before = _root_links()
        run_cli("up", TOPO, "--name", unique_name, "--backend", "mininet", "--switch", "ovs", "--verify", "skip",
                timeout=600)
        try:
            backend = lifecycle.open_backend(unique_name)
            info = backend.state.mininet
            assert info.switch == "ovs" and not info.ovs_private and not info.creates_datapath
            assert not [p for p in backend.state.processes if p.role.startswith("ovs")], backend.state.processes
            ours = {sw.name for sw in info.switches}
            assert set(_vsctl("list-br").split()) == ours | {"userbr0"}
            report = verify_testbed(backend, level="quick", probes=20)
            assert report.ok, [c for c in report.checks if not c.ok]
        finally:
            run_cli("down", unique_name)
        assert _vsctl("list-br").split() == ["userbr0"]
        assert _vsctl("list-ports", "userbr0").split() == ["userp0"]
        assert _system_ovs_pids() == daemons and all(os.path.exists(f"/proc/{pid}") for pid in daemons.values())
        assert _root_links() == before, _root_links() ^ before
        assert netns_with_prefix(f"tb-{unique_name}-") == []
    finally:
        _vsctl("--if-exists", "del-br", "userbr0", check=False)
        subprocess.run([OVS_CTL, "stop"], capture_output=True, env=env)
        ovs.delete_datapath("ovs")


def _vsctl(*args: str, check: bool = True) -> str:
    """ovs-vsctl against the system's daemon (the default rundir, no OVS_* overrides)."""
    done = subprocess.run(["ovs-vsctl", "-t", "10", *args], capture_output=True, text=True, env=ovs.system_env())
    assert done.returncode == 0 or not check, done.stderr
    return done.stdout


def _system_ovs_pids() -> dict[str, int]:
    return {name: int((ovs.SYSTEM_RUNDIR / f"{name}.pid").read_text()) for name in ("ovsdb-server", "ovs-vswitchd")}


def _root_links() -> set[str]:
    out = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, check=True).stdout
    return {line.split(":")[1].strip().split("@")[0] for line in out.splitlines()}


def test_soft_roce_device_can_be_created() -> None:
    """rdma_rxe exists in the stock kernel: an rxe device binds to a NIC in init_net (docs/kernel.md)."""
    if not _module_loaded("rdma_rxe"):
        pytest.skip("rdma_rxe did not load in this guest")
    subprocess.run(["ip", "link", "add", "tbrxe0", "type", "veth", "peer", "name", "tbrxe1"], check=True)
    try:
        subprocess.run(["ip", "link", "set", "tbrxe0", "up"], check=True)
        added = subprocess.run(["rdma", "link", "add", "tbrxe", "type", "rxe", "netdev", "tbrxe0"],
                               capture_output=True, text=True)
        if added.returncode != 0 and "rdma" in added.stderr and "not found" in added.stderr:
            pytest.skip("the rdma tool (iproute2) is missing")
        assert added.returncode == 0, added.stderr
        links = subprocess.run(["rdma", "link", "show"], capture_output=True, text=True).stdout
        assert "tbrxe" in links
        subprocess.run(["rdma", "link", "delete", "tbrxe"], check=True)
    finally:
        subprocess.run(["ip", "link", "del", "tbrxe0"], check=False)
