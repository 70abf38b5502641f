"""Bring-up/teardown benchmark: the netns backend vs Mininet (LinuxBridge) building the same topology.

Both build from the same Plan without link shaping (Mininet without TCLink, netns with --shaper none),
alternately, in one run; each is checked for reachability after bring-up
(untimed). Prints per-repetition times and the median ratio. Usage:
    .venv/bin/python bench/bringup.py [TOPOLOGY] [--reps N]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from testbed.check.verify import check_reachability  # noqa: E402
from testbed.deploy import lifecycle  # noqa: E402
from testbed.plan import build_plan  # noqa: E402
from testbed.topology import load_topology  # noqa: E402
from testbed.util import table  # noqa: E402
from testbed.util.paths import resolve_topology  # noqa: E402


def time_netns(topology: Path, name: str) -> tuple[float, float, int]:
    result = lifecycle.up(topology, name, shaper="none")
    try:
        reach = check_reachability(result.plan)
        ok = sum(c.ok for c in reach)
        assert ok == len(reach), f"netns: {len(reach) - ok} host pairs unreachable"
    finally:
        down_s = lifecycle.down(name)
    return result.seconds, down_s, len(reach)


def time_mininet(topology: Path, name: str) -> tuple[float, float, int]:
    """Mininet as its users script it: the same plan through Mininet's API, routes with `ip route` per node."""
    from testbed.backends.mininet_net import build_network, layout

    plan = build_plan(load_topology(topology), name)
    started = time.perf_counter()
    net = build_network(plan, layout(plan), "linuxbridge")
    for node in plan.nodes:
        net[node.name].cmd(" ; ".join(f"sysctl -qw {key}='{value}'" for key, value in node.sysctls))
        for route in node.routes:
            net[node.name].cmd(f"ip route add {route.dst} via {route.gateway} dev {route.dev}")
    up_s = time.perf_counter() - started
    try:
        hosts = [net[h.name] for h in plan.hosts]
        probes = [(a, b) for a in hosts[:: max(1, len(hosts) // 4)] for b in hosts if a is not b]
        for a, b in probes:
            out = a.cmd(f"ping -c1 -W1 {b.IP()}")
            assert " 0% packet loss" in out, f"mininet: {a.name} cannot reach {b.name}"
    finally:
        started = time.perf_counter()
        net.stop()
        down_s = time.perf_counter() - started
    return up_s, down_s, len(probes)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("topology", nargs="?", default="4dc-32hosts")
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("bench/bringup.py needs root", file=sys.stderr)
        return 1
    topology = resolve_topology(args.topology)
    plan = build_plan(load_topology(topology))
    print(f"topology {topology.name}: {len(plan.nodes)} nodes ({len(plan.hosts)} hosts), {len(plan.veths)} links")
    rows, netns_up, mn_up, netns_down, mn_down = [], [], [], [], []
    for rep in range(args.reps):
        up_a, down_a, pairs_a = time_netns(topology, f"bench{os.getpid()}")
        up_b, down_b, pairs_b = time_mininet(topology, f"mn{os.getpid()}")
        netns_up.append(up_a), netns_down.append(down_a), mn_up.append(up_b), mn_down.append(down_b)
        rows.append((rep + 1, f"{up_a:.3f}", f"{down_a:.3f}", f"{up_b:.3f}", f"{down_b:.3f}",
                     f"{up_a / up_b:.3f}", f"{pairs_a} / {pairs_b}"))
    print(table.render(["rep", "netns up s", "netns down s", "mininet up s", "mininet down s", "up ratio",
                        "pairs pinged netns / mininet"], rows))
    up_ratio = statistics.median(netns_up) / statistics.median(mn_up)
    down_ratio = statistics.median(netns_down) / statistics.median(mn_down)
    print(f"\nmedian bring-up: netns {statistics.median(netns_up):.3f} s, mininet {statistics.median(mn_up):.3f} s, "
          f"ratio {up_ratio:.3f} (goal <= 0.333: {'met' if up_ratio <= 1 / 3 else 'NOT met'})")
    print(f"median teardown: netns {statistics.median(netns_down):.3f} s, mininet {statistics.median(mn_down):.3f} s, "
          f"ratio {down_ratio:.3f}")
    return 0 if up_ratio <= 1 / 3 else 1


if __name__ == "__main__":
    sys.exit(main())
