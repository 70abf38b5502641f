"""Build a Plan with Mininet's API (Debian's `mininet` package): hosts, DC routers, one switch per DC fabric.

Addresses are set through Mininet's interfaces, exactly as the plan says; interface names inside the nodes
are the plan's (`eth0`, `fabric`, `otn<k>`), so shapers, probes and workers see the same testbed as on the
netns backend. Mininet's switches live in the root namespace, so their names carry a per-testbed prefix
(`tb<hash>s<dc>`) that is recorded before they exist and removed by name.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

from testbed.backends.base import BackendError
from testbed.plan.model import Node, Plan
from testbed.state.records import SwitchLayout

IFNAMSIZ = 15
SWITCH_KINDS = ("auto", "linuxbridge", "ovs", "ovs-user")


def layout(plan: Plan) -> list[SwitchLayout]:
    """Root-namespace names for every switch and switch port of this testbed (pure: no kernel access)."""
    digest = hashlib.sha1(plan.testbed.encode()).hexdigest()
    prefix = f"tb{digest[:5]}"
    switches = []
    dcs = list(dict.fromkeys(n.dc for n in plan.nodes))
    for d, dc in enumerate(dcs):
        name = f"{prefix}s{d}"
        members = [n for n in plan.nodes if n.dc == dc and n.role == "router"]
        members += [n for n in plan.nodes if n.dc == dc and n.role == "host"]
        ports = {node.name: f"{name}-eth{k + 1}" for k, node in enumerate(members)}
        too_long = [p for p in ports.values() if len(p) > IFNAMSIZ]
        if too_long:
            raise BackendError(f"DC {dc} has too many hosts for Mininet switch port names ({too_long[0]} is longer "
                               f"than {IFNAMSIZ} characters); split the DC or use --backend netns")
        switches.append(SwitchLayout(dc=dc, name=name, dpid=f"{int(digest[:8], 16):08x}{d:08x}", ports=ports))
    return switches


def import_mininet() -> Any:
    """Mininet's package, or a clear error saying how to get it."""
    try:
        import mininet.net
    except ImportError as exc:
        raise BackendError(f"Mininet is not importable ({exc}): install Debian's 'mininet' package (make install "
                           "does) and run the project's .venv, which sees /usr/lib/python3/dist-packages") from None
    return mininet


def switch_class(kind: str) -> tuple[type, dict[str, Any]]:
    """Mininet's switch class and parameters for a resolved switch kind."""
    import_mininet()
    from mininet.node import OVSSwitch
    from mininet.nodelib import LinuxBridge

    if kind == "linuxbridge":
        return LinuxBridge, {}
    if kind == "ovs":
        return OVSSwitch, {"failMode": "standalone", "datapath": "kernel"}
    if kind == "ovs-user":
        return OVSSwitch, {"failMode": "standalone", "datapath": "user"}
    raise BackendError(f"unknown switch kind {kind!r}; choose one of: {', '.join(SWITCH_KINDS)}")


def router_class() -> type:
    """A Mininet node that forwards (cf. Mininet's examples/linuxrouter.py); sysctls come from the plan."""
    import_mininet()
    from mininet.node import Node as MininetNode

    class PlanRouter(MininetNode):
        """A DC router: a Mininet node in its own namespace."""

    return PlanRouter


def build_network(plan: Plan, switches: list[SwitchLayout], kind: str,
                  on_node: Callable[[str, int], None] = lambda _name, _pid: None) -> Any:
    """Create and start a Mininet network equivalent to `plan`; `on_node(name, shell_pid)` as each node appears."""
    mininet = import_mininet()
    from mininet.link import Link
    from mininet.log import setLogLevel
    from mininet.node import Host

    setLogLevel("error")   # its bridge-netfilter warnings are handled by the backend (per-bridge nf_call off)
    cls, params = switch_class(kind)
    net = mininet.net.Mininet(topo=None, controller=None, switch=cls, link=Link, build=False, autoSetMacs=False,
                              autoStaticArp=False, waitConnected=False, inNamespace=False)
    router = router_class()
    for node in plan.nodes:
        made = net.addHost(node.name, cls=router if node.role == "router" else Host, ip=None)
        on_node(node.name, made.pid)
    for sw in switches:
        made = net.addSwitch(sw.name, cls=cls, dpid=sw.dpid, **params)
        on_node(sw.name, made.pid)
    for sw in switches:
        for node_name, port in sw.ports.items():
            iface = _fabric_interface(plan.node(node_name))
            net.addLink(node_name, sw.name, intfName1=iface.name, intfName2=port,
                        params1={"ip": str(iface.address)})
    for veth in (v for v in plan.veths if v.kind == "otn"):
        net.addLink(veth.a_node, veth.b_node, intfName1=veth.a_ifname, intfName2=veth.b_ifname,
                    params1={"ip": str(_address(plan.node(veth.a_node), veth.a_ifname))},
                    params2={"ip": str(_address(plan.node(veth.b_node), veth.b_ifname))})
    net.build()
    net.start()
    return net


def fabric_ifname(node: Node) -> str:
    """The interface that joins a node to its DC fabric (a host's eth0, a router's `fabric`)."""
    return node.bridge if node.role == "router" and node.bridge else node.interfaces[0].name


def _fabric_interface(node: Node) -> Any:
    name = fabric_ifname(node)
    return next(i for i in node.interfaces if i.name == name)


def _address(node: Node, ifname: str) -> Any:
    return next(i.address for i in node.interfaces if i.name == ifname)
