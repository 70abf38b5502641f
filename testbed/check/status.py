"""What is up: per testbed, its nodes, switches and OTN directions, whether the kernel still has them, and
what its shaper's health check finds. `testbed status --json` prints `TestbedStatus.to_json()`
(docs/json-contracts.md); `render()` is the terminal table."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from pyroute2 import IPRoute

from testbed.backends import nsfs
from testbed.backends.base import BackendError
from testbed.backends.registry import backend_for
from testbed.shaping.otn_edge import EdgeCounters
from testbed.shaping.registry import Shaper, shaper_for
from testbed.state.store import TestbedState
from testbed.util import table, units

SWITCH_DAEMONS = ("ovsdb-server", "ovs-vswitchd")


@dataclass(frozen=True, slots=True)
class NodeStatus:
    name: str
    dc: str
    role: str
    netns: str
    enter: str
    """How to run a command in it."""
    addresses: list[str]
    present: bool


@dataclass(frozen=True, slots=True)
class DirectionStatus:
    """One OTN direction as configured. `from`/`to` in its JSON repeat `src_dc`/`dst_dc` (deprecated: 0.1 names)."""

    link: str
    src_dc: str
    dst_dc: str
    delay_s: float
    rate_bps: float
    jitter_s: float
    loss: float
    lossless: bool
    delay_by: str
    """The shaper, or `native path` where the delay line adds no hold."""
    drops: int | None = None
    """Unintended drops since bring-up (every qdisc, queue and delay-daemon counter, packets lost while a
    delay daemon was down); None when the testbed is not up."""

    @property
    def label(self) -> str:
        return f"{self.src_dc} -> {self.dst_dc}"

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "from": self.src_dc, "to": self.dst_dc}


@dataclass(frozen=True, slots=True)
class SwitchStatus:
    name: str
    dc: str
    kind: str
    ports: dict[str, str]
    present: bool


@dataclass(frozen=True, slots=True)
class ShaperStatus:
    name: str
    problems: list[str] = field(default_factory=list)
    calibration_s: dict[str, float] = field(default_factory=dict)
    native_path: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    events: list[str] = field(default_factory=list)
    """Things that happened and were repaired (a delay daemon restarted)."""


@dataclass(frozen=True, slots=True)
class TestbedStatus:
    name: str
    backend: str
    topology: str
    phase: str
    health: str
    nodes: list[NodeStatus]
    links: list[DirectionStatus]
    switches: list[SwitchStatus]
    shaper: ShaperStatus
    edges: dict[str, EdgeStatus] = field(default_factory=dict)
    """Per direction label with an OTN edge: its plan and what it did since the link came up."""

    def to_json(self) -> dict[str, Any]:
        record = {"name": self.name, "backend": self.backend, "topology": self.topology, "phase": self.phase,
                  "health": self.health, "nodes": [asdict(n) for n in self.nodes],
                  "links": [lk.to_json() for lk in self.links], "shaper": asdict(self.shaper)}
        if self.switches:
            record["switches"] = [asdict(sw) for sw in self.switches]
        if self.edges:
            record["edges"] = {label: asdict(e) for label, e in self.edges.items()}
        return record

    def render(self) -> str:
        out = [f"testbed {self.name}: {self.phase}, {self.health} ({self.backend} backend, shaper {self.shaper.name}, "
               f"{self.topology})"]
        rows = [(n.name, n.dc, n.role, n.netns, " ".join(n.addresses), "yes" if n.present else "GONE")
                for n in self.nodes]
        out.append(table.render(["node", "dc", "role", "netns", "addresses", "present"], rows))
        if self.switches:
            rows = [(sw.name, sw.dc, sw.kind, " ".join(sw.ports.values()), "yes" if sw.present else "GONE")
                    for sw in self.switches]
            out.append(table.render(["switch", "dc", "kind", "ports", "present"], rows,
                                    "\nMininet switches (root namespace)"))
        rows = [(lk.link, lk.label, units.format_time(lk.delay_s), units.format_rate(lk.rate_bps), lk.delay_by,
                 "-" if lk.drops is None else str(lk.drops)) for lk in self.links]
        out.append(table.render(["link", "direction", "one-way delay", "rate", "delay by", "drops"], rows,
                                "\nOTN links (configured)"))
        if self.edges:
            out.append(render_edge_status(self.edges))
        out += [f"note: {warning}" for warning in self.shaper.warnings]
        out += [f"event: {event}" for event in self.shaper.events]
        return "\n".join(out)


@dataclass(frozen=True, slots=True)
class EdgeStatus:
    """One direction's OTN edge: planned buffer and thresholds, and its counters since the link came up."""

    mode: str
    buffer_bytes: int
    xoff_bytes: int
    headroom_bytes: int
    counters: EdgeCounters


def render_edge_status(edges: dict[str, EdgeStatus]) -> str:
    rows = []
    for label, e in edges.items():
        c = e.counters
        within = "-" if e.mode != "pfc" else ("yes" if c.buffer_peak_bytes <= e.xoff_bytes + e.headroom_bytes else "NO")
        rows.append((label, e.mode, c.pauses, units.format_time(c.pause_s), units.format_size(c.buffer_peak_bytes),
                     units.format_size(e.xoff_bytes + e.headroom_bytes) if e.mode == "pfc" else "-", within,
                     c.drops, c.lossy_drops))
    return table.render(["direction", "edge", "pauses", "paused", "buffer peak", "XOFF+headroom", "within",
                         "lossless drops", "lossy drops"], rows, "\nOTN edges (since the link came up)")


def describe(state: TestbedState) -> TestbedStatus:
    """The status of one testbed, read back from the kernel and its shaper."""
    plan = state.plan
    nodes = [NodeStatus(n.name, n.dc, n.role, n.netns, f"ip netns exec {n.netns} CMD  (or: testbed exec {n.name} -- CMD)",
                        n.addresses, nsfs.exists(n.netns)) for n in plan.nodes]
    live = shaper_for(backend_for(state)) if state.phase == "up" else None
    shaper = shaper_status(state, live)
    drops = _drops(live)
    links = [DirectionStatus(d.link, d.src_dc, d.dst_dc, d.delay_s, d.rate_bps, d.jitter_s, d.loss, d.lossless,
                             "native path" if d.label in shaper.native_path else shaper.name, drops.get(d.label))
             for d in plan.directions]
    missing = [n.name for n in nodes if not n.present]
    switches = _switches(state)
    missing_switches = [sw.name for sw in switches if not sw.present]
    dead = [p.role for p in state.processes if p.role in SWITCH_DAEMONS and not p.alive()]
    health = "ok"
    if state.phase != "up":
        health = f"{state.phase}" + ("" if state.owner_alive() else " (creator died: run 'testbed down')")
    elif missing:
        health = f"degraded: {len(missing)} namespace(s) gone ({', '.join(missing[:3])})"
    elif missing_switches or dead:
        health = "degraded: " + "; ".join([f"switch {n} gone" for n in missing_switches] + [f"{d} is dead" for d in dead])
    elif shaper.problems:
        health = "degraded: " + "; ".join(shaper.problems)
    counters = live.edge_counters() if live is not None else {}
    edges = {d.label: EdgeStatus(d.edge.mode, d.edge.buffer_bytes, d.edge.xoff_bytes, d.edge.headroom_bytes,
                                 counters[d.label])
             for d in plan.directions if d.edge is not None and d.label in counters}
    return TestbedStatus(name=state.name, backend=state.backend, topology=state.topology_source, phase=state.phase,
                         health=health, nodes=nodes, links=links, switches=switches, shaper=shaper, edges=edges)


def shaper_status(state: TestbedState, shaper: Shaper | None) -> ShaperStatus:
    """Shaper name and what its health check finds (qdiscs, rules, daemons) for a running testbed."""
    if state.phase != "up":
        return ShaperStatus(state.shaper_name)
    health = shaper.health() if shaper else None
    problems = ["no shaper: OTN links carry no delay or rate limit"] if health is None else health.problems
    events = health.events if health else []
    record = state.shaper
    if record is None:
        return ShaperStatus(state.shaper_name, problems, events=events)
    return ShaperStatus(record.name, problems, dict(record.calibration_s), list(record.native), list(record.warnings),
                        events)


def _drops(shaper: Shaper | None) -> dict[str, int]:
    """Drops the plan does not allow per direction label (as a run counts them), for a testbed up and shaped."""
    if shaper is None:
        return {}
    try:
        return {d.direction: d.beyond_plan(loss) for d, loss in shaper.drops_with_planned_loss()}
    except BackendError:          # a namespace is gone: health says so
        return {}


def _switches(state: TestbedState) -> list[SwitchStatus]:
    """Mininet's DC switches (root namespace) and whether the kernel still has them."""
    info = state.mininet
    if info is None or not info.switches:
        return []
    with IPRoute() as root:
        return [SwitchStatus(sw.name, sw.dc, info.switch, dict(sw.ports), bool(root.link_lookup(ifname=sw.name)))
                for sw in info.switches]
