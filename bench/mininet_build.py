"""Build the same testbed as the netns backend from the same Plan, with Mininet's API (Debian's package).

Used by the bring-up benchmark to compare like with like: one host per plan host, a LinuxBridge switch per
DC fabric, a router host per DC with the plan's addresses and static routes. Mininet's own objects are
named with a `tb` prefix so they never collide with anything else on the machine.
"""

from __future__ import annotations

from mininet.link import Link
from mininet.net import Mininet
from mininet.node import Host, Node
from mininet.nodelib import LinuxBridge

from testbed.plan.model import Plan


class LinuxRouter(Node):
    """A Mininet node that forwards IPv4 (as in Mininet's examples/linuxrouter.py)."""

    def config(self, **params):  # type: ignore[no-untyped-def]
        super().config(**params)
        self.cmd("sysctl -qw net.ipv4.ip_forward=1")

    def terminate(self) -> None:
        self.cmd("sysctl -qw net.ipv4.ip_forward=0")
        super().terminate()


def build(plan: Plan) -> Mininet:
    """Create (not start) a Mininet network equivalent to `plan`."""
    net = Mininet(topo=None, controller=None, switch=LinuxBridge, link=Link, build=False,
                  autoSetMacs=False, waitConnected=False)
    names: dict[str, str] = {}
    for i, node in enumerate(plan.nodes):
        short = f"tb{i}"
        names[node.name] = short
        if node.role == "router":
            net.addHost(short, cls=LinuxRouter, ip=None)
        else:
            gateway = node.routes[0].gateway
            net.addHost(short, cls=Host, ip=str(node.interfaces[0].address), defaultRoute=f"via {gateway}")
    for d, rtr in enumerate(n for n in plan.nodes if n.role == "router"):
        switch = net.addSwitch(f"tbs{d}", cls=LinuxBridge)
        fabric = next(i for i in rtr.interfaces if i.name == "fabric")
        net.addLink(names[rtr.name], switch, intfName1=f"{names[rtr.name]}-fab",
                    params1={"ip": str(fabric.address)})
        for host in (n for n in plan.nodes if n.role == "host" and n.dc == rtr.dc):
            net.addLink(names[host.name], switch, intfName1=f"{names[host.name]}-eth0")
    for veth in (v for v in plan.veths if v.kind == "otn"):
        a, b = plan.node(veth.a_node), plan.node(veth.b_node)
        addr_a = next(i.address for i in a.interfaces if i.name == veth.a_ifname)
        addr_b = next(i.address for i in b.interfaces if i.name == veth.b_ifname)
        net.addLink(names[a.name], names[b.name], intfName1=f"{names[a.name]}-{veth.a_ifname}",
                    intfName2=f"{names[b.name]}-{veth.b_ifname}",
                    params1={"ip": str(addr_a)}, params2={"ip": str(addr_b)})
    net.tb_names = names  # type: ignore[attr-defined]
    return net


def add_routes(net: Mininet, plan: Plan) -> None:
    """Install the plan's static routes on the Mininet routers."""
    names = net.tb_names  # type: ignore[attr-defined]
    for rtr in (n for n in plan.nodes if n.role == "router"):
        node = net.get(names[rtr.name])
        for route in rtr.routes:
            node.cmd(f"ip route add {route.dst} via {route.gateway}")
