"""The netns backend: one network namespace per node, veths between them, a bridge per DC fabric.

Everything lives inside the testbed's own namespaces (nothing is added to the root namespace), so removing
the namespaces removes every link, address, route, qdisc and iptables rule with them.
"""

from __future__ import annotations

from pyroute2 import IPRoute

from testbed.backends import nsfs
from testbed.backends.base import FabricPort
from testbed.backends.namespaces import NamespaceBackend
from testbed.plan.model import Node, Plan
from testbed.util.interrupts import cleanup


class NetnsBackend(NamespaceBackend):
    """Namespaces built directly through netlink (pyroute2)."""

    name = "netns"

    def deploy(self, plan: Plan) -> None:
        self.check_names_free(plan.netns_names())
        self.state.netns = plan.netns_names()
        self.state.plan = plan
        self.state.save()
        sockets: dict[str, IPRoute] = {}
        try:
            bridges: dict[str, int] = {}
            for node in plan.nodes:
                sockets[node.name] = _create_node(node)
                if node.bridge:
                    bridges[node.name] = _create_bridge(sockets[node.name], node.bridge)
            with IPRoute() as root:
                for veth in plan.veths:
                    a, b = plan.node(veth.a_node), plan.node(veth.b_node)
                    peer = {"ifname": veth.b_ifname, "mtu": veth.mtu, "net_ns_fd": b.netns}
                    root.link("add", ifname=veth.a_ifname, kind="veth", mtu=veth.mtu, net_ns_fd=a.netns,
                              state="up", peer=peer)
            for node in plan.nodes:
                _configure_node(sockets[node.name], node, bridges.get(node.name))
        except BaseException:
            for ipr in sockets.values():
                ipr.close()
            self.destroy()
            raise
        for ipr in sockets.values():
            ipr.close()
        self.state.phase = "up"
        self.state.save()

    def destroy(self) -> None:
        with cleanup():
            self.remove_namespaces()
            self.state.delete()

    def fabric_ports(self) -> list[FabricPort]:
        """Each host's eth0 and each router bridge port (the router's side of a host's veth)."""
        ports = []
        for node in self.state.plan.nodes:
            names = node.bridge_ports if node.role == "router" else tuple(i.name for i in node.interfaces)
            ports += [FabricPort(node.name, name, node.dc) for name in names]
        return ports


def _create_node(node: Node) -> IPRoute:
    """Create the node's namespace, set its sysctls, bring `lo` up; return a netlink socket bound to it."""
    nsfs.create(node.netns)
    with nsfs.entered(node.netns):
        for key, value in node.sysctls:
            nsfs.write_sysctl(key, value)
        ipr = IPRoute()
    ipr.link("set", index=1, state="up")  # lo is always ifindex 1 in a new namespace
    return ipr


def _create_bridge(ipr: IPRoute, name: str) -> int:
    ipr.link("add", ifname=name, kind="bridge", br_stp_state=0, br_forward_delay=0, state="up")
    return int(ipr.link_lookup(ifname=name)[0])


def _configure_node(ipr: IPRoute, node: Node, bridge: int | None) -> None:
    """Link state, bridge ports, addresses and routes of one node, through its namespace's netlink socket.

    A veth is created UP on its first end only (the kernel ignores the peer's flags), so peers are raised here.
    """
    links = ipr.get_links()
    index = {link.get("IFLA_IFNAME"): link["index"] for link in links}
    is_up = {link.get("IFLA_IFNAME"): bool(link["flags"] & 1) for link in links}
    for iface in node.interfaces:
        if iface.name in node.bridge_ports:
            ipr.link("set", index=index[iface.name], master=bridge, state="up")
        elif not is_up[iface.name]:
            ipr.link("set", index=index[iface.name], state="up")
    for iface in node.interfaces:
        if iface.address is not None:
            ipr.addr("add", index=index[iface.name], address=str(iface.address.ip),
                     prefixlen=iface.address.network.prefixlen)
    for route in node.routes:
        ipr.route("add", dst=str(route.dst), gateway=str(route.gateway), oif=index[route.dev],
                  **({"prefsrc": str(route.src)} if route.src else {}))
