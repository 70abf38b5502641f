"""Shaping on one real machine: its NIC's egress towards every other DC, and (delay line) its ingress from them.

Planned on the controller (`plan_shapes`, pure: inventory + topology -> one `HostShape` per machine), applied
on the machine itself by the agent (`apply`, `remove`). Each ordered DC pair gets the delay and bottleneck rate
of the topology's shortest-delay path between them (a multi-hop path is one emulated hop here: per-machine
shaping cannot share a middle link's rate between pairs, unlike the one-box emulation's routers).

- Rate: HTB on the NIC, one class per destination DC (u32 filters on the destination data addresses), leaf
  pfifo sized for zero loss; traffic to anything else (SSH, intra-DC peers) is not classified and not shaped.
- Delay: netem as the class's leaf where the kernel has it; otherwise the project's delay line: an NFQUEUE
  rule per source DC in raw PREROUTING (`-s` each of its data addresses) and one supervised daemon.
Both are the single machine's shapers' own: the leaf is the shaper's `egress_leaf`, the delay line is installed
by testbed/shaping/delayline_install.py, its holds built as the single machine builds them (serialization at
the path's rate included). Which one a machine gets is the shaper class the agent names (`apply`'s `shaper`).
Everything added carries the testbed's name (rule comments, state file), so `remove` deletes exactly that.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from testbed.errors import TestbedError
from testbed.plan.builder import build_plan, delay_queue_packets
from testbed.plan.model import Plan
from testbed.rdma import softroce
from testbed.remote.inventory import Inventory
from testbed.remote.replies import CountersReply, RxeReply
from testbed.shaping import htb
from testbed.shaping.base import Shaper, ShaperError
from testbed.shaping.delayline import QueueConfig
from testbed.shaping.delayline_install import DelayLineInstall, IptablesRule, ThisMachine, hold, iptables, nfqueue_rule
from testbed.shaping.htb import ROOT_HANDLE

STATE_DIR = Path("/run/testbed-remote")
FIRST_CLASS = 0x10


@dataclass(frozen=True, slots=True)
class PeerDirection:
    """Traffic between this machine and one other DC, in one direction."""

    dc: str
    """The other DC."""
    addresses: tuple[str, ...]
    """Its machines' data addresses."""
    delay_s: float
    rate_bps: float
    queue_packets: int
    """Rate queue (egress) or delay-line queue (ingress)."""
    mtu: int = 1500
    """The path's MTU: the delay line's serialization time counts frames of it."""


@dataclass(frozen=True, slots=True)
class HostShape:
    """What one machine installs: `egress` towards each other DC (rate, and delay under netem), `ingress` from each
    other DC (the delay line's holds, used when the machine has no netem)."""

    testbed: str
    host: str
    nic: str
    egress: tuple[PeerDirection, ...]
    ingress: tuple[PeerDirection, ...]
    subtract_s: dict[str, float] = field(default_factory=dict)
    """Per source DC: the real network's own one-way latency, measured unshaped, taken off the hold."""

    def hold_s(self, peer: PeerDirection) -> float:
        """The delay this machine adds for `peer`: its planned delay less the network's own."""
        return max(0.0, peer.delay_s - self.subtract_s.get(peer.dc, 0.0))

    def delay_towards(self, dc: str) -> float:
        """The planned one-way delay from this machine to `dc`."""
        return next(p.delay_s for p in self.egress if p.dc == dc)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> HostShape:
        peers = lambda items: tuple(PeerDirection(**{**p, "addresses": tuple(p["addresses"])}) for p in items)
        return cls(testbed=data["testbed"], host=data["host"], nic=data["nic"], egress=peers(data["egress"]),
                   ingress=peers(data["ingress"]), subtract_s=dict(data.get("subtract_s", {})))


def path_of(plan: Plan, src_dc: str, dst_dc: str) -> tuple[float, float, int]:
    """Delay, bottleneck rate and zero-loss rate queue of the planned path src_dc -> dst_dc."""
    hops = plan.hops(src_dc, dst_dc)
    return (sum(h.delay_s for h in hops), min((h.rate_bps for h in hops), default=float("inf")),
            max((h.rate_queue_packets for h in hops), default=0))


def path_mtu(plan: Plan, src_dc: str, dst_dc: str) -> int:
    """The smallest MTU of the planned path src_dc -> dst_dc."""
    return min(h.mtu for h in plan.hops(src_dc, dst_dc))


def plan_shapes(inventory: Inventory, testbed: str) -> dict[str, HostShape]:
    """One HostShape per machine of the inventory."""
    plan = build_plan(inventory.topology, testbed)
    edged = sorted({d.link for d in plan.directions if d.edge is not None})
    if edged:
        raise TestbedError(f"{', '.join(edged)}: an OTN edge (lossless: pfc, a buffer or an edge_rate) is emulated "
                           "by one machine's delay line only; machines over SSH shape per host, without it",
                           hint="remove the edge keys from the topology for `testbed remote`, or run it on one machine")
    by_dc: dict[str, list[str]] = {}
    for m in inventory.machines:
        by_dc.setdefault(m.dc, []).append(m.data_address)
    shapes = {}
    for m in inventory.machines:
        egress, ingress = [], []
        for dc, addresses in sorted(by_dc.items()):
            if dc == m.dc:
                continue
            out_delay, out_rate, out_queue = path_of(plan, m.dc, dc)
            in_delay, in_rate, _ = path_of(plan, dc, m.dc)
            out_mtu, in_mtu = path_mtu(plan, m.dc, dc), path_mtu(plan, dc, m.dc)
            egress.append(PeerDirection(dc, tuple(addresses), out_delay, out_rate, out_queue, out_mtu))
            ingress.append(PeerDirection(dc, tuple(addresses), in_delay, in_rate,
                                         delay_queue_packets(in_rate, in_delay, 0.0, in_mtu), in_mtu))
        shapes[m.name] = HostShape(testbed, m.name, m.nic, tuple(egress), tuple(ingress))
    return shapes


# -- on the machine (the agent) ----------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class DelayLineFiles:
    """The delay daemon's files on this machine."""

    config: str
    stats: str
    status: str
    log: str

    @classmethod
    def in_folder(cls, folder: Path, host: str) -> DelayLineFiles:
        return cls(*(str(folder / f"{host}.delayline.{x}") for x in ("json", "stats", "status", "log")))

    @classmethod
    def from_json(cls, data: dict[str, str] | list[str] | None) -> DelayLineFiles | None:
        if not data:
            return None
        return cls(*data) if isinstance(data, list) else cls(**data)   # a list: an older agent's state file


@dataclass(slots=True)
class Installed:
    """What `apply` installed on this machine: read back by `remove` (and by `status`)."""

    testbed: str
    host: str
    nic: str
    mode: str
    """The shaper's name (`Shaper.name`)."""
    classes: int
    spec: str = ""
    """The HostShape file it was installed from."""
    rules: list[IptablesRule] = field(default_factory=list)
    """Every iptables rule added (testbed.shaping.delayline_install.IptablesRule), to delete them one by one."""
    daemon_pid: int | None = None
    delay_line: DelayLineFiles | None = None
    rxe: list[str] = field(default_factory=list)
    """rxe devices given to the NIC for the RDMA transport (recorded before each is created)."""

    @staticmethod
    def path(testbed: str, host: str) -> Path:
        return STATE_DIR / testbed / f"{host}.json"

    def save(self) -> None:
        write_state_file(self.path(self.testbed, self.host), json.dumps(asdict(self), indent=1))

    @classmethod
    def load(cls, testbed: str, host: str) -> Installed | None:
        path = cls.path(testbed, host)
        if not path.exists():
            return None
        data = json.loads(path.read_text())
        files = data.pop("files", None)                                  # an older agent's state file
        return cls(**{**data, "rules": [IptablesRule.from_json(r) for r in data.get("rules", [])],
                      "delay_line": DelayLineFiles.from_json(data.get("delay_line", files))})


def write_state_file(path: Path, text: str, attempts: int = 5) -> None:
    """Write `path` whole (a temporary file, then a rename) in the testbed's state folder, creating the folder. The
    folder goes with the last machine's state (`remove`): where several machines share one filesystem (the test
    lab's namespaces) another machine's removal can take it between the mkdir and the write, so that is retried."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    for attempt in range(attempts):
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(text)
            os.replace(tmp, path)
            return
        except FileNotFoundError:
            if attempt == attempts - 1:
                raise


def rule_comment(testbed: str) -> str:
    return f"tb-remote:{testbed}"


def apply(shape: HostShape, shaper: type[Shaper]) -> Installed:
    """Install `shape` on this machine's NIC the way `shaper` does (replacing what this testbed installed before)."""
    from pyroute2 import IPRoute

    remove(shape.testbed, shape.host)
    installed = Installed(shape.testbed, shape.host, shape.nic, shaper.name, classes=len(shape.egress))
    spec = Installed.path(shape.testbed, shape.host).with_suffix(".spec.json")
    write_state_file(spec, json.dumps(shape.to_json()))
    installed.spec = str(spec)
    installed.save()                               # before anything: a crash halfway is still removable
    with IPRoute() as ipr:
        found = ipr.link_lookup(ifname=shape.nic)
        if not found:
            raise ShaperError(f"{shape.host}: no interface {shape.nic!r} (inventory key nic)")
        index = found[0]
        htb.add_root(ipr, index, default=0)        # traffic to anything else (SSH, same-DC peers) unshaped
        for i, peer in enumerate(shape.egress):
            classid = ROOT_HANDLE | (FIRST_CLASS + i)
            limit, netem = shaper.egress_leaf(shape.hold_s(peer), peer.queue_packets,
                                              delay_queue_packets(peer.rate_bps, peer.delay_s, 0.0, peer.mtu))
            htb.add_class(ipr, index, classid, (FIRST_CLASS + i) << 16, peer.rate_bps, limit, netem)
            for address in peer.addresses:
                ipr.tc("add-filter", "u32", index=index, parent=ROOT_HANDLE, prio=10, protocol=0x0800,
                       target=classid, keys=[f"0x{_hex(address)}/0xffffffff+16"])
    if shaper.delays_ingress:
        _start_delay_line(shape, installed)
    installed.save()
    return installed


def ingress_queues(shape: HostShape) -> list[QueueConfig]:
    """The delay line's queues: queue i + 1 holds what arrives from `shape.ingress[i]`, for its planned delay less
    the network's own (and each packet's serialization at the path's rate, as the single machine's do)."""
    return [hold(i + 1, shape.nic, peer.delay_s, shape.subtract_s.get(peer.dc, 0.0), rate_bps=peer.rate_bps,
                 mtu=peer.mtu, maxlen=peer.queue_packets)
            for i, peer in enumerate(shape.ingress)]


def ingress_rules(shape: HostShape) -> list[IptablesRule]:
    """What goes to each queue: the NIC carries every DC's traffic and others', so a rule per source address, each
    carrying the testbed's comment."""
    return [nfqueue_rule(i + 1, "-i", shape.nic, "-s", f"{address}/32", "-m", "comment", "--comment",
                         rule_comment(shape.testbed))
            for i, peer in enumerate(shape.ingress) for address in peer.addresses]


def _start_delay_line(shape: HostShape, installed: Installed) -> None:
    files = DelayLineFiles.in_folder(Installed.path(shape.testbed, shape.host).parent, shape.host)
    line = DelayLineInstall(ThisMachine(shape.host), files)
    line.configure(ingress_queues(shape))
    installed.delay_line = files

    def started(pid: int) -> None:
        installed.daemon_pid = pid
        installed.save()

    line.start(started)
    for rule in ingress_rules(shape):
        line.add(rule)
        installed.rules.append(rule)
        installed.save()


def remove(testbed: str, host: str) -> list[str]:
    """Remove what `apply` installed for this testbed on this machine; returns what was removed."""
    from pyroute2 import IPRoute

    installed = Installed.load(testbed, host)
    if installed is None:
        return []
    removed = []
    for rule in installed.rules:
        if iptables(ThisMachine(host), rule.args("-D"), check=False) == 0:
            removed.append(f"iptables rule {rule.chain} {' '.join(rule.match)}")
    if installed.daemon_pid and installed.delay_line and _is_ours(installed.daemon_pid, installed.delay_line.config):
        os.kill(installed.daemon_pid, signal.SIGTERM)
        _wait_gone(installed.daemon_pid)
        removed.append(f"delay daemon {installed.daemon_pid}")
    for name in installed.rxe:
        if softroce.exists(name):
            subprocess.run(["rdma", "link", "delete", name], capture_output=True, timeout=10)
            removed.append(f"rxe device {name}")
        if softroce.exists(name):
            raise ShaperError(f"rxe device {name} is still registered after 'rdma link delete {name}'")
    with IPRoute() as ipr:
        found = ipr.link_lookup(ifname=installed.nic)
        if found and any(q["handle"] == ROOT_HANDLE and q.get_attr("TCA_KIND") == "htb"
                         for q in ipr.get_qdiscs(index=found[0])):
            ipr.tc("del", index=found[0], handle=ROOT_HANDLE, root=True)
            removed.append(f"htb on {installed.nic}")
    files = installed.delay_line
    for name in [*((files.config, files.stats, files.status, files.log) if files else ()), installed.spec]:
        if name:
            Path(name).unlink(missing_ok=True)
    state = Installed.path(testbed, host)
    state.unlink(missing_ok=True)
    with contextlib.suppress(OSError):       # the testbed's folder goes with its last machine's state
        state.parent.rmdir()
    return removed


def counters(testbed: str, host: str) -> CountersReply:
    """Drops so far: per destination DC on its egress class's leaf, per source DC in the delay line (sequence
    gaps: packets the kernel dropped before the daemon saw them). -1: the leaf is gone. With the delay line,
    `holds` per source DC: [packets released, sum of their release error in seconds] (the daemon's statistics,
    at most half a second old), from which a run's link timing is the difference."""
    from pyroute2 import IPRoute


    installed = Installed.load(testbed, host)
    if installed is None:
        raise ShaperError(f"testbed {testbed} is not shaped on {host}")
    shape = HostShape.from_json(json.loads(Path(installed.spec).read_text()))
    with IPRoute() as ipr:
        drops = {q.handle: q.drops for q in htb.read_qdiscs(ipr, installed.nic)}
    egress = {peer.dc: drops.get((FIRST_CLASS + i) << 16, -1) for i, peer in enumerate(shape.egress)}
    reply = CountersReply(egress=egress)
    if installed.delay_line:
        line = DelayLineInstall(ThisMachine(host), installed.delay_line)
        stats = line.stats()
        for i, peer in enumerate(shape.ingress):
            queue = stats.queues.get(i + 1) if stats else None
            reply.ingress[peer.dc] = queue.id_gaps if queue else 0
            reply.holds[peer.dc] = list(line.holds(i + 1, stats) or (0, 0.0))
    return reply


def add_rxe(testbed: str, host: str, index: int, address: str) -> RxeReply:
    """An rxe device on the NIC this testbed shaped, for the RDMA transport (recorded before it exists, removed
    by `remove`), checked as one machine checks its hosts' (testbed.rdma.softroce.check_device)."""
    from testbed.rdma.support import rxe_here
    from testbed.state.records import RxeDevice

    installed = Installed.load(testbed, host)
    if installed is None:
        raise ShaperError(f"testbed {testbed} is not shaped on {host}: shape it first")
    support = rxe_here()
    if not support.ok:
        raise ShaperError(f"no rxe device possible on {host}: {support.reason}")
    device = RxeDevice(node=host, name=softroce.device_name(testbed, index), netdev=installed.nic)
    created = not softroce.exists(device.name)
    if created:
        if device.name not in installed.rxe:
            installed.rxe.append(device.name)
            installed.save()
        result = subprocess.run(["rdma", "link", "add", device.name, "type", "rxe", "netdev", installed.nic],
                                capture_output=True, text=True, timeout=30)
        if result.returncode != 0:
            raise ShaperError(f"'rdma link add {device.name} type rxe netdev {installed.nic}' failed: "
                               f"{(result.stderr or result.stdout).strip()}")
    softroce.check_device(device, address, lambda argv: subprocess.run(argv, capture_output=True, text=True, timeout=30))
    return RxeReply(name=device.name, netdev=device.netdev, gid_index=device.gid_index, gid=device.gid,
                    active_mtu=device.active_mtu, created=created)


def _is_ours(pid: int, config: str) -> bool:
    """The pid still runs the supervisor with our config (not a recycled pid)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return b"testbed.shaping.supervisor" in cmdline and config.encode() in cmdline


def _wait_gone(pid: int, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.02)
    os.kill(pid, signal.SIGKILL)


def _hex(address: str) -> str:
    return "".join(f"{int(x):02x}" for x in address.split("."))
