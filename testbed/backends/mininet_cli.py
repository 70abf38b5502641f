"""Mininet's CLI on a running testbed: Mininet node, switch and link objects re-attached to what exists.

Nothing is created or deleted: each node's shell is started inside its pinned namespace, interfaces and links
are wrapped as they are, and leaving the CLI only ends those shells. Works on both backends (on netns the
DC bridge is inside the router, so there are no switch objects).
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import signal
import string
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

from testbed.backends import mininet_net, nsfs
from testbed.backends.base import Backend
from testbed.plan.model import Plan
from testbed.state.records import SwitchLayout


def _classes() -> dict[str, type]:
    """Mininet classes adapted to attach instead of create (built lazily: Mininet is imported on demand)."""
    mininet_net.import_mininet()
    from mininet.cli import CLI
    from mininet.link import Link
    from mininet.node import Host
    from mininet.node import Node as MininetNode

    class Pinned:
        """A node whose shell joins a pinned namespace instead of making a new one."""

        def startShell(self, mnopts: str | None = None) -> None:  # noqa: N802 (Mininet's name)
            self.inNamespace = False         # mnexec must not unshare: the shell enters the pinned namespace
            try:
                super().startShell(mnopts)   # type: ignore[misc]
            finally:
                self.inNamespace = True

        def _popen(self, cmd: list[str], **params: Any) -> subprocess.Popen[Any]:
            path = self.params["netns_path"]   # type: ignore[attr-defined]
            return subprocess.Popen(cmd, preexec_fn=lambda: nsfs.enter_in_child(path), **params)  # noqa: PLW1509

    class PinnedHost(Pinned, Host):
        """A testbed host."""

    class PinnedRouter(Pinned, MininetNode):
        """A testbed DC router."""

    class ExistingLink(Link):
        """A link whose veth pair already exists."""

        @staticmethod
        def makeIntfPair(*_args: Any, **_kwargs: Any) -> None:  # noqa: N802 (Mininet's name)
            return None

    class TestbedCLI(CLI):
        """Mininet's CLI; node names may contain '-' (dc-a-h1)."""

        identchars = string.ascii_letters + string.digits + "_-"

    return {"host": PinnedHost, "router": PinnedRouter, "link": ExistingLink, "cli": TestbedCLI}


@contextlib.contextmanager
def attached(backend: Backend) -> Iterator[Any]:
    """A Mininet object for the running testbed; its shells end when the block does."""
    mininet = mininet_net.import_mininet()
    from mininet.link import Intf
    from mininet.log import lg, setLogLevel

    setLogLevel("error")      # Mininet's bridge-netfilter warnings do not apply: our bridges have nf_call off
    cls = _classes()
    plan = backend.state.plan
    info = backend.state.mininet
    saved_env = dict(os.environ)
    os.environ.update(getattr(backend, "ovs_env", dict)())
    net = mininet.net.Mininet(topo=None, controller=None, build=False, autoSetMacs=False, waitConnected=False)
    try:
        for node in plan.nodes:
            net.addHost(node.name, cls=cls["router"] if node.role == "router" else cls["host"], ip=None,
                        netns_path=backend.netns_path(node.name))
        addresses = {(n.name, i.name): i.address for n in plan.nodes for i in n.interfaces}
        switches = {sw.name: sw for sw in info.switches} if info else {}
        if not switches:     # netns: the DC bridge is the router's own interface, its default one
            for node in plan.routers:
                assert node.bridge is not None
                bridge = Intf(node.bridge, node=net[node.name], moveIntfFn=lambda *_a: None)
                _set_address(bridge, addresses[(node.name, node.bridge)])
        for a, a_if, b, b_if in _links(plan, list(switches.values())):
            if b not in net:
                assert info is not None
                switch_cls, params = mininet_net.switch_class(info.switch)
                net.addSwitch(b, cls=switch_cls, dpid=switches[b].dpid, **params)
            link = net.addLink(a, b, cls=cls["link"], intfName1=a_if, intfName2=b_if)
            for intf, node_name, ifname in ((link.intf1, a, a_if), (link.intf2, b, b_if)):
                if addresses.get((node_name, ifname)):
                    _set_address(intf, addresses[(node_name, ifname)])
        net.built = True
        setLogLevel("output")
        for handler in lg.handlers:      # CLI output (node commands, pingall) goes to stdout, pipeable
            handler.setStream(sys.stdout)
        yield net
    finally:
        for node in net.hosts + net.switches:
            with contextlib.suppress(Exception):
                node.terminate()
        os.environ.clear()
        os.environ.update(saved_env)


def _set_address(intf: Any, address: ipaddress.IPv4Interface) -> None:
    """Tell Mininet's Intf the address it already has (no ifconfig)."""
    intf.ip, intf.prefixLen = str(address.ip), address.network.prefixlen


def run_cli(backend: Backend, script: str | None = None) -> None:
    """Open Mininet's CLI (or run a script of CLI commands) on the testbed."""
    with attached(backend) as net:
        cls = _classes()["cli"]
        previous = signal.signal(signal.SIGINT, signal.default_int_handler)   # Ctrl-C cancels a command, as in mn
        try:
            cls(net, script=script)
        finally:
            signal.signal(signal.SIGINT, previous)


def _links(plan: Plan, switches: list[SwitchLayout]) -> list[tuple[str, str, str, str]]:
    """(node, ifname, peer, peer ifname) of every link: fabric links (to a switch or the router), then OTN."""
    links = []
    for sw in switches:
        for node, port in sw.ports.items():
            links.append((node, mininet_net.fabric_ifname(plan.node(node)), sw.name, port))
    kinds = ("otn",) if switches else ("fabric", "otn")
    links += [(v.a_node, v.a_ifname, v.b_node, v.b_ifname) for kind in kinds for v in plan.veths if v.kind == kind]
    return links
