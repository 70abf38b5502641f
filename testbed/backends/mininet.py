"""The Mininet backend: the plan built with Mininet's API, its host namespaces pinned so the testbed outlives `up`.

Mininet keeps a node's namespace alive only while the node's shell runs, and those shells die with the Python
process that made them. So after Mininet has built and started the network, each node's namespace is pinned
at the plan's name (/run/netns/tb-<testbed>-<node>, as `ip netns attach` does), the plan's sysctls, MTUs and
routes are set through netlink, and Mininet's shells are stopped. From then on shapers, probes and workers
use the same namespaces as on the netns backend; `testbed cli` re-attaches Mininet objects for its CLI.
The switches (LinuxBridge or Open vSwitch) live in the root namespace under recorded names.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from typing import Any

from pyroute2 import IPRoute
from pyroute2.netlink.exceptions import NetlinkError

from testbed.backends import mininet_net, nsfs, ovs
from testbed.backends.base import BackendError, FabricPort
from testbed.backends.namespaces import NamespaceBackend
from testbed.plan.builder import FABRIC_MTU, HOST_IFNAME
from testbed.plan.model import Node, Plan
from testbed.state.records import MininetRecord, ProcessRecord, SwitchLayout
from testbed.state.store import list_states
from testbed.util.interrupts import cleanup

SHELL_ROLE = "mininet-shell"


def resolve_switch(requested: str) -> tuple[str, str]:
    """The switch kind to use and why: `auto` takes OVS where its kernel datapath exists, else a Linux bridge."""
    if requested not in mininet_net.SWITCH_KINDS:
        raise BackendError(f"unknown switch {requested!r}; choose one of: {', '.join(mininet_net.SWITCH_KINDS)}")
    kernel = ovs.kernel_datapath() and ovs.installed()
    if requested == "auto":
        if kernel:
            return "ovs", "Open vSwitch kernel datapath available"
        why = "no openvswitch kernel module" if not ovs.kernel_datapath() else "Open vSwitch is not installed"
        return "linuxbridge", f"{why}: Linux bridge (OVS userspace: --switch ovs-user)"
    if requested == "ovs" and not kernel:
        missing = "the openvswitch kernel module" if not ovs.kernel_datapath() else "Open vSwitch (openvswitch-switch)"
        raise BackendError(f"--switch ovs needs {missing}; use --switch ovs-user (userspace datapath, private "
                           "instance) or --switch linuxbridge")
    return requested, "requested"


def private_ovs(kind: str) -> bool:
    """Does this switch kind get its own ovsdb-server/ovs-vswitchd? Userspace always; the kernel datapath when
    the system's ovs-vswitchd is not running (two daemons must not share the kernel's datapath)."""
    return kind == "ovs-user" or (kind == "ovs" and not ovs.system_switch_running())


class MininetBackend(NamespaceBackend):
    """Mininet hosts and switches, pinned to the plan's namespaces."""

    name = "mininet"

    @property
    def info(self) -> MininetRecord:
        if self.state.mininet is None:
            self.state.mininet = MininetRecord()
        return self.state.mininet

    def deploy(self, plan: Plan) -> None:
        mininet = mininet_net.import_mininet()
        self.check_names_free(plan.netns_names())
        switches = mininet_net.layout(plan)
        kind, why = resolve_switch(self.info.switch_requested)
        if private_ovs(kind):
            _refuse_second_private_daemon(plan.testbed, kind)
        root_names = _root_names(switches)
        with IPRoute() as root:
            taken = [n for n in root_names if root.link_lookup(ifname=n)]
            datapath_existed = bool(root.link_lookup(ifname=ovs.DATAPATH_DEVICE.get(kind, "")))
        if taken:
            raise BackendError(f"interface {taken[0]} already exists in the root namespace (a testbed named "
                               f"{plan.testbed!r} left behind?); run 'testbed down {plan.testbed}' or pick another --name")
        self.state.netns = plan.netns_names()
        self.state.plan = plan
        self.state.mininet = MininetRecord(
            switch_requested=self.info.switch_requested, switch=kind, switch_reason=why, version=mininet.net.VERSION,
            ovs_private=private_ovs(kind), creates_datapath=private_ovs(kind) and not datapath_existed,
            switches=switches, root_interfaces=root_names)
        self.state.save()
        net = None
        try:
            with self._ovs_environment(kind):
                net = mininet_net.build_network(plan, switches, kind, on_node=self._record_shell)
            for node in plan.nodes:
                nsfs.attach(node.netns, net[node.name].pid)
            for node in plan.nodes:
                _configure_node(node)
            fabric_mtu = plan.hosts[0].interfaces[0].mtu if plan.hosts else FABRIC_MTU
            _set_root_mtu([p for sw in switches for p in sw.ports.values()], fabric_mtu)
            if kind == "linuxbridge":
                _bridges_skip_netfilter([sw.name for sw in switches])
            _stop_shells(net)
        except BaseException:
            if net is not None:
                _stop_shells(net)
            self.destroy()
            raise
        self.state.processes = [p for p in self.state.processes if p.role != SHELL_ROLE]
        self.state.phase = "up"
        self.state.save()

    def destroy(self) -> None:
        with cleanup():
            self._destroy()

    def _destroy(self) -> None:
        info = self.info
        if info.ovs_private:
            ovs.stop_private(self.state.files_dir / "ovs", [sw.name for sw in info.switches])
        elif info.switch == "ovs":
            for sw in info.switches:
                subprocess.run(["ovs-vsctl", "-t", "5", "--if-exists", "del-br", sw.name], capture_output=True,
                               env=ovs.system_env())
        self.remove_namespaces()
        made = [ovs.DATAPATH_DEVICE[info.switch]] if info.creates_datapath else []
        if made:
            ovs.delete_datapath(info.switch)
        _delete_root_links(info.root_interfaces + made)
        self.state.delete()

    def fabric_ports(self) -> list[FabricPort]:
        """Each host's eth0 and each switch port that delivers to a host (in the root namespace)."""
        plan = self.state.plan
        ports = [FabricPort(n.name, HOST_IFNAME, n.dc) for n in plan.hosts]
        for sw in self.info.switches:
            ports += [FabricPort(None, port, sw.dc) for node, port in sw.ports.items() if plan.node(node).role == "host"]
        return ports

    def ovs_env(self) -> dict[str, str]:
        """OVS_* variables for tools that talk to this testbed's private Open vSwitch (none for the system's)."""
        return ovs.private_env(self.state.files_dir / "ovs") if self.info.ovs_private else {}

    @contextlib.contextmanager
    def _ovs_environment(self, kind: str) -> Iterator[None]:
        """Start a private OVS if this kind needs one and point Mininet's ovs-vsctl calls at it while building."""
        if not self.info.ovs_private:
            yield
            return
        ovs.start_private(self.state.files_dir / "ovs", self._record)
        saved = {k: os.environ.get(k) for k in self.ovs_env()}
        os.environ.update(self.ovs_env())
        try:
            yield
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value

    def _record(self, record: ProcessRecord) -> None:
        self.state.processes.append(record)
        self.state.save()

    def _record_shell(self, node: str, pid: int) -> None:
        self._record(ProcessRecord.of(pid, SHELL_ROLE, node))


def _refuse_second_private_daemon(testbed: str, kind: str) -> None:
    """Two ovs-vswitchd must not drive one datapath (its device, ovs-system or ovs-netdev, is machine-wide):
    one private daemon per datapath type at a time."""
    for other in list_states():
        info = other.mininet
        if other.name != testbed and info is not None and info.switch == kind and info.ovs_private:
            raise BackendError(f"testbed {other.name!r} runs its own ovs-vswitchd with the {kind} datapath and "
                               f"two cannot share its {ovs.DATAPATH_DEVICE[kind]} device: use another --switch, "
                               "start the system's Open vSwitch, or bring that testbed down")


def _root_names(switches: list[SwitchLayout]) -> list[str]:
    return [p for sw in switches for p in sw.ports.values()] + [sw.name for sw in switches]


def _configure_node(node: Node) -> None:
    """The plan's sysctls, MTUs and routes, set through netlink in the node's pinned namespace."""
    with nsfs.entered(node.netns):
        for key, value in node.sysctls:
            nsfs.write_sysctl(key, value)
        ipr = IPRoute()
    with ipr:
        index = {link.get("IFLA_IFNAME"): link["index"] for link in ipr.get_links()}
        for iface in node.interfaces:
            if iface.name in index:
                ipr.link("set", index=index[iface.name], mtu=iface.mtu, state="up")
        for route in node.routes:
            ipr.route("replace", dst=str(route.dst), gateway=str(route.gateway), oif=index[route.dev],
                      **({"prefsrc": str(route.src)} if route.src else {}))


def _set_root_mtu(ports: list[str], mtu: int = FABRIC_MTU) -> None:
    with IPRoute() as root:
        for port in ports:
            for index in root.link_lookup(ifname=port):
                root.link("set", index=index, mtu=mtu)


def _bridges_skip_netfilter(bridges: list[str]) -> None:
    """Keep bridged testbed frames out of the root namespace's iptables (br_netfilter), for our bridges only."""
    with IPRoute() as root:
        for name in bridges:
            root.link("set", index=root.link_lookup(ifname=name)[0], kind="bridge", br_nf_call_iptables=0,
                      br_nf_call_ip6tables=0, br_nf_call_arptables=0)


def _stop_shells(net: Any) -> None:
    """End Mininet's node shells (the pins keep the namespaces); never `net.stop()`, which deletes the network."""
    for node in net.hosts + net.switches:
        with contextlib.suppress(Exception):
            node.terminate()


def _delete_root_links(names: list[str]) -> None:
    """Remove this testbed's switch ports and bridges from the root namespace, by name."""
    with IPRoute() as root:
        for name in names:
            for index in root.link_lookup(ifname=name):
                with contextlib.suppress(NetlinkError):
                    root.link("del", index=index)
