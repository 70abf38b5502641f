"""What this kernel can do for a testbed, found by trying it in a scratch namespace (created and removed
here): namespaces, veth, bridges, the qdiscs the shapers use, the NFQUEUE target. Every 'yes' is a real
attempt, not a guess. `doctor` shows these; `--shaper auto` decides from them."""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass

from pyroute2 import IPRoute
from pyroute2.netlink.exceptions import NetlinkError

from testbed.backends import nsfs


@dataclass(frozen=True, slots=True)
class Probe:
    """One capability: present or not, and the evidence."""

    name: str
    ok: bool
    detail: str


def kernel_probes() -> list[Probe]:
    """netns, veth, bridge, qdisc htb/tbf/netem, nfqueue (needs root)."""
    scratch = f"tb-doctor-{os.getpid()}"
    probes: list[Probe] = []
    try:
        nsfs.create(scratch)
    except OSError as exc:
        return [Probe("netns", False, f"cannot create a network namespace: {exc}")]
    try:
        probes.append(Probe("netns", True, "created a scratch namespace"))
        with nsfs.entered(scratch):
            ipr = IPRoute()
        with ipr:
            ipr.link("add", ifname="tbd0", kind="veth", peer="tbd1")
            index = ipr.link_lookup(ifname="tbd0")[0]
            probes.append(Probe("veth", True, "created a veth pair"))
            try:
                ipr.link("add", ifname="tbdbr", kind="bridge")
                probes.append(Probe("bridge", True, "created a Linux bridge"))
            except NetlinkError as exc:
                probes.append(Probe("bridge", False, str(exc)))
            probes.append(_qdisc_probe(ipr, index, "htb", default=0x10))
            probes.append(_qdisc_probe(ipr, index, "tbf", rate="100mbit", burst=15000, latency="50ms"))
            probes.append(_qdisc_probe(ipr, index, "netem", delay=5000))
        probes.append(_nfqueue_probe(scratch))
    finally:
        nsfs.remove(scratch)
    return probes


def shaper_choice(probes: dict[str, Probe]) -> tuple[str, str]:
    """The shaper these probes allow, and why: netem where the kernel has it, else the delay line, else none.
    The one place that rule lives (`--shaper auto` and `doctor` both ask it)."""
    def ok(name: str) -> bool:
        return name in probes and probes[name].ok

    if ok("qdisc netem"):
        return "netem", "the kernel has sch_netem"
    if ok("nfqueue") and ok("qdisc htb"):
        return "delayline", "no netem in this kernel; rate by HTB, delay by an NFQUEUE daemon"
    return "none", "neither netem nor NFQUEUE+HTB; delay cannot be emulated on this kernel"


def kernel_shaper() -> str:
    """What `--shaper auto` picks on this kernel: `netem`, `delayline` or `none`."""
    return shaper_choice({p.name: p for p in kernel_probes()})[0]


def _qdisc_probe(ipr: IPRoute, index: int, kind: str, **opts: object) -> Probe:
    try:
        ipr.tc("add", kind, index=index, handle="1:", **opts)
        ipr.tc("del", kind, index=index, handle="1:", **opts)
        return Probe(f"qdisc {kind}", True, "added and removed on a scratch veth")
    except NetlinkError as exc:
        if exc.code == 2:
            return Probe(f"qdisc {kind}", False, f"qdisc kind unknown to this kernel (sch_{kind} not built in)")
        return Probe(f"qdisc {kind}", False, f"kernel refused it: {exc}")


def _nfqueue_probe(scratch: str) -> Probe:
    iptables = shutil.which("iptables")
    if not iptables:
        return Probe("nfqueue", False, "iptables is not installed (apt-get install iptables)")
    rule = ["-t", "raw", "-A", "PREROUTING", "-i", "tbd0", "-j", "NFQUEUE", "--queue-num", "1"]
    result = subprocess.run([iptables, *rule], capture_output=True, text=True,
                            preexec_fn=lambda: nsfs.enter_in_child(scratch))  # noqa: PLW1509
    if result.returncode != 0:
        return Probe("nfqueue", False, f"iptables NFQUEUE rule refused: {result.stderr.strip()}")
    with nsfs.entered(scratch):
        has_queue = os.path.exists("/proc/net/netfilter/nfnetlink_queue")
    if not has_queue:
        return Probe("nfqueue", False, "NFQUEUE target exists but nfnetlink_queue is missing")
    return Probe("nfqueue", True, "iptables raw NFQUEUE rule inserted; nfnetlink_queue present")
