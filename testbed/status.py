"""What is up: per testbed, its nodes and OTN links, and whether the kernel still has them."""

from __future__ import annotations

from typing import Any

from pyroute2 import IPRoute

from testbed.backends import nsfs
from testbed.state import TestbedState

SWITCH_DAEMONS = ("ovsdb-server", "ovs-vswitchd")


def describe(state: TestbedState) -> dict[str, Any]:
    """The `testbed status --json` record of one testbed (the DESIGN.md contract)."""
    plan = state.plan
    nodes = [{"name": n["name"], "dc": n["dc"], "role": n["role"], "netns": n["netns"],
              "enter": f"ip netns exec {n['netns']} CMD  (or: testbed exec {n['name']} -- CMD)",
              "addresses": [i["address"] for i in n["interfaces"] if i["address"]],
              "present": nsfs.exists(n["netns"])} for n in plan.get("nodes", [])]
    links = [{"link": s["link"], "from": s["src_dc"], "to": s["dst_dc"], "delay_s": s["delay_s"],
              "rate_bps": s["rate_bps"], "jitter_s": s["jitter_s"], "loss": s["loss"], "lossless": s["lossless"]}
             for s in plan.get("shapes", [])]
    missing = [n["name"] for n in nodes if not n["present"]]
    switches = _switches(state)
    missing_switches = [sw["name"] for sw in switches if not sw["present"]]
    dead = [p.role for p in state.processes if p.role in SWITCH_DAEMONS and not p.alive()]
    health = "ok"
    if state.phase != "up":
        health = f"{state.phase}" + ("" if state.owner_alive() else " (creator died: run 'testbed down')")
    elif missing:
        health = f"degraded: {len(missing)} namespace(s) gone ({', '.join(missing[:3])})"
    elif missing_switches or dead:
        health = "degraded: " + "; ".join([f"switch {n} gone" for n in missing_switches] + [f"{d} is dead" for d in dead])
    record = {"name": state.name, "backend": state.backend, "topology": state.topology_source, "phase": state.phase,
              "health": health, "nodes": nodes, "links": links}
    if switches:
        record["switches"] = switches
    return record


def _switches(state: TestbedState) -> list[dict[str, Any]]:
    """Mininet's DC switches (root namespace) and whether the kernel still has them."""
    info = state.extra.get("mininet", {})
    if not info.get("switches"):
        return []
    with IPRoute() as root:
        return [{"name": sw["name"], "dc": sw["dc"], "kind": info["switch"], "ports": sw["ports"],
                 "present": bool(root.link_lookup(ifname=sw["name"]))} for sw in info["switches"]]
