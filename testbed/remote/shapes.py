"""Shaping several machines: each pair's unshaped round trip measured first (taken off the holds), then every
machine's HostShape installed by its agent, then each pair's round trip measured through the holds and the shaper's
own path cost (NFQUEUE's trip through user space, which the unshaped round trip cannot see) trimmed off, as one
machine trims its delay lines; or the shaping an earlier `up` left, attached to."""

from __future__ import annotations

import dataclasses
import json
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from testbed.remote.fleet import Fleet
from testbed.remote.hostshape import HostShape, plan_shapes
from testbed.remote.inventory import Machine
from testbed.remote.replies import CountersReply, RemovedReply, RttReply, ShapeReply
from testbed.remote.ssh import RemoteError
from testbed.shaping.calibrate import AGREE_S, agreed, correction
from testbed.util import units

if TYPE_CHECKING:
    from testbed.probe.latency import LatencySample

TRIM_AGREE_S = AGREE_S
"""Two readings of a round trip closer than this agree (the later is kept); further apart, a third decides."""
TRIM_FLOOR_S = TRIM_AGREE_S / 2
"""A round trip off by less than this is left: within the scatter of readings through two ends' holds."""
TRIM_LIMIT_S = 0.5e-3
"""A round trip off by more than this is not trimmed: verify judges it (a missing or doubled delay stays visible)."""


def shape_machines(fleet: Fleet) -> dict[str, HostShape]:
    """Remove this testbed's earlier shaping, measure the network's own one-way latency per DC pair, install."""
    planned = plan_shapes(fleet.inventory, fleet.testbed)
    firsts = fleet.first_per_dc()
    shapes: dict[str, HostShape] = {}

    def unshape(m: Machine) -> str:       # shaped again (`up` twice): measure the network, not the last shape
        removed = fleet.agent(m, RemovedReply, "unshape", fleet.testbed, m.name, root=True).removed
        return f"removed this testbed's earlier shaping ({len(removed)} item(s))" if removed else "not shaped yet"

    def base(m: Machine) -> str:
        subtract = {}
        for dc, peer in firsts.items():
            if dc != m.dc:
                sample = _round_trip(fleet, m, peer)
                if sample.lost or not sample.values_s:
                    raise RemoteError(m.name, f"no answer from {peer.name} ({peer.data_address}) over {m.nic}: "
                                      "the data network does not connect them (inventory keys nic, data_address)")
                subtract[dc] = sample.median_s / 2
        shapes[m.name] = dataclasses.replace(planned[m.name], subtract_s=subtract)
        return "unshaped one-way " + ", ".join(f"{dc} {units.format_time(s)}" for dc, s in subtract.items())

    def install(m: Machine) -> str:
        spec = Path(tempfile.mkdtemp()) / f"{m.name}.shape.json"
        spec.write_text(json.dumps(shapes[m.name].to_json()))
        remote = f"{fleet.workdir(m)}/{fleet.testbed}.{m.name}.shape.json"
        fleet.sessions[m.name].put(spec, remote)
        shutil.rmtree(spec.parent)
        installed = fleet.agent(m, ShapeReply, "shape", remote, root=True)
        fleet.facts[m.name].shaper = installed.mode
        peers = ", ".join(f"{p.dc} {units.format_time(p.delay_s)} {units.format_rate(p.rate_bps)}"
                          for p in shapes[m.name].egress)
        return f"{installed.mode} on {m.nic}: towards {peers}"

    excess: dict[str, dict[str, float]] = {}

    def measure(m: Machine) -> str:     # every pair read before any machine is trimmed (both ends take half)
        excess[m.name] = {}
        for dc, peer in firsts.items():
            if dc != m.dc:
                planned_s = shapes[m.name].delay_towards(dc) + shapes[peer.name].delay_towards(m.dc)
                excess[m.name][dc] = _excess(fleet, m, peer, planned_s)
        return "round trip through the holds " + ", ".join(f"{dc} {x * 1e6:+.0f} us" for dc, x in excess[m.name].items())

    def trim(m: Machine) -> str:
        shape = shapes[m.name]
        cut = {dc: c / 2 for dc, x in excess[m.name].items() if (c := correction(x, TRIM_FLOOR_S, TRIM_LIMIT_S))}
        if not cut:
            return "holds kept"
        subtract = {dc: max(0.0, s + cut.get(dc, 0.0)) for dc, s in shape.subtract_s.items()}
        shapes[m.name] = dataclasses.replace(shape, subtract_s=subtract)
        return install(m) + "; holds corrected by " + ", ".join(f"{dc} {c * 1e6:+.0f} us" for dc, c in cut.items())

    fleet.each("shape", unshape)
    fleet.each("shape", base)
    fleet.each("shape", install)
    fleet.each("shape", measure)
    fleet.each("shape", trim)
    return shapes


def _excess(fleet: Fleet, m: Machine, peer: Machine, want_s: float) -> float:
    """The round trip m -> peer through the holds less the planned one; two readings more than TRIM_AGREE_S apart
    are outvoted by a third (the single machine's rule)."""
    def read() -> float:
        return _round_trip(fleet, m, peer).median_s - want_s

    return agreed(read(), read(), read, TRIM_AGREE_S)


def _round_trip(fleet: Fleet, m: Machine, peer: Machine) -> LatencySample:
    """Ten pings from `m` to `peer`'s data address, by `m`'s agent."""
    return fleet.agent(m, RttReply, "rtt", peer.data_address, "--count", "10", root=True).sample()


def attach(fleet: Fleet) -> dict[str, HostShape]:
    """The shaping an earlier `up` installed, for a run without shaping again: every shaped machine is asked
    for its counters (a machine not shaped for this testbed fails the step, naming it)."""
    shapes = plan_shapes(fleet.inventory, fleet.testbed)
    fleet.each("run", lambda m: f"shaped ({fleet.agent(m, CountersReply, 'counters', fleet.testbed, m.name, root=True)})",
               [m for m in fleet.inventory.machines if m.name in shapes])
    return shapes
