"""Measure the emulator's own one-way latency on each OTN direction.

Veth hops, forwarding, the NFQUEUE round trip through the daemon and the probe's own system calls cost
~0.05-0.15 ms one way on a 2-core VM. A real link of delay d should deliver d end to end, so shapers first
hold every packet for a known CALIBRATION_HOLD_S, measure, and then hold for d minus the measured excess
(never below zero). The report names the figure subtracted.
"""

from __future__ import annotations

from typing import Any

from testbed.backends.base import Backend
from testbed.probe.latency import PROBE_INTERVAL_S, one_way
from testbed.shaping.base import direction_label

CALIBRATION_PROBES = 10
CALIBRATION_ROUNDS = 3
"""The calibration is the lowest median of a few rounds, after a discarded warm-up round: a hiccup of the
host (seen under QEMU TCG: one round 2.6 ms slow) must not be subtracted from every later hold."""
CALIBRATION_HOLD_S = 1e-3


def otn_address(plan: dict[str, Any], node: str, ifname: str) -> str:
    for n in plan["nodes"]:
        if n["name"] == node:
            for iface in n["interfaces"]:
                if iface["name"] == ifname and iface["address"]:
                    return str(iface["address"]).split("/")[0]
    raise KeyError(f"{node}:{ifname} has no address in the plan")


def base_one_way(backend: Backend, installed_hold_s: float = 0.0) -> dict[str, float]:
    """Per OTN direction (label 'A -> B'): median one-way latency minus the hold the shaper has installed."""
    plan = backend.state.plan
    result = {}
    for shape in plan["shapes"]:
        medians = []
        for round_ in range(CALIBRATION_ROUNDS + 1):
            sample = one_way(backend.netns_path(shape["src_node"]), backend.netns_path(shape["dst_node"]),
                             otn_address(plan, shape["dst_node"], shape["dst_ifname"]), count=CALIBRATION_PROBES,
                             interval_s=PROBE_INTERVAL_S)
            if sample.lost or not sample.values_s:
                raise RuntimeError(f"calibration probe lost on {direction_label(shape)}: the link does not carry "
                                   "packets")
            if round_:                       # round 0 warms up code paths and caches
                medians.append(sample.median_s)
        result[direction_label(shape)] = min(medians) - installed_hold_s
    return result
