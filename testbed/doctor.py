"""`testbed doctor`: probe what this kernel and machine offer, and say which backend, shaper and transport
a run will use and why. Every 'yes' is a real attempt (a qdisc added, a rule inserted), not a guess."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import platform
import shutil
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path

from pyroute2 import IPRoute
from pyroute2.netlink.exceptions import NetlinkError

from testbed.backends import nsfs


@dataclass(frozen=True, slots=True)
class Probe:
    """One capability: present or not, and the evidence."""

    name: str
    ok: bool
    detail: str


@dataclass(slots=True)
class Decision:
    """What a run on this machine will use."""

    backend: str
    shaper: str
    transport: str
    rdma: str
    reasons: list[str] = field(default_factory=list)


@dataclass(slots=True)
class DoctorReport:
    kernel: str
    cpus: int
    probes: list[Probe]
    decision: Decision

    def probe(self, name: str) -> Probe:
        return next(p for p in self.probes if p.name == name)

    def to_json(self) -> dict:
        return asdict(self)


def _qdisc_probe(ipr: IPRoute, index: int, kind: str, **opts: object) -> Probe:
    try:
        ipr.tc("add", kind, index=index, handle="1:", **opts)
        ipr.tc("del", kind, index=index, handle="1:", **opts)
        return Probe(f"qdisc {kind}", True, "added and removed on a scratch veth")
    except NetlinkError as exc:
        if exc.code == 2:
            return Probe(f"qdisc {kind}", False, f"qdisc kind unknown to this kernel (sch_{kind} not built in)")
        return Probe(f"qdisc {kind}", False, f"kernel refused it: {exc}")


def _kernel_probes() -> list[Probe]:
    """Probes that need a scratch namespace (created and removed here)."""
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


def _module_available(name: str) -> bool:
    if Path(f"/sys/module/{name}").exists():
        return True
    moddir = Path("/lib/modules") / platform.release()
    if not moddir.is_dir():
        return False
    return any(moddir.rglob(f"{name}.ko*"))


def _machine_probes() -> list[Probe]:
    probes = []
    modules_dir = Path("/lib/modules") / platform.release()
    probes.append(Probe("kernel modules", modules_dir.is_dir(),
                        f"{modules_dir} {'exists' if modules_dir.is_dir() else 'is missing: nothing can be modprobed'}"))
    rxe = _module_available("rdma_rxe")
    probes.append(Probe("rdma_rxe", rxe, "module present" if rxe else
                        "no rdma_rxe in this kernel: SoftRoCE needs a stock kernel (make vm-test) or real hosts"))
    ovs = _module_available("openvswitch")
    probes.append(Probe("ovs datapath", ovs, "openvswitch module present" if ovs else
                        "no openvswitch kernel module: OVS only with datapath=user"))
    probes.append(_binary_probe("ovs-vsctl", "openvswitch-switch"))
    mininet = importlib.util.find_spec("mininet") is not None
    probes.append(Probe("mininet", mininet, "Debian's mininet importable" if mininet else
                        "not importable: apt-get install mininet, and a venv with --system-site-packages"))
    probes.append(_binary_probe("mnexec", "mininet"))
    probes.append(_binary_probe("brctl", "bridge-utils"))
    probes.append(_binary_probe("iperf3", "iperf3"))
    probes.append(_binary_probe("qemu-system-x86_64", "qemu-system-x86"))
    probes.append(_binary_probe("vng", "virtme-ng (pip)"))
    kernels = sorted(str(p) for p in Path("/boot").glob("vmlinuz-*"))
    probes.append(Probe("stock kernel image", bool(kernels),
                        ", ".join(kernels) if kernels else "none in /boot (apt-get install linux-image-amd64)"))
    probes.append(_package_probe("torch"))
    probes.append(_package_probe("numpy"))
    return probes


def _binary_probe(binary: str, package: str) -> Probe:
    path = shutil.which(binary)
    return Probe(binary, path is not None, path or f"not found (install {package})")


def _package_probe(name: str) -> Probe:
    try:
        return Probe(name, True, f"version {importlib.metadata.version(name)}")
    except importlib.metadata.PackageNotFoundError:
        return Probe(name, False, "not installed in this environment (make install)")


def decide(probes: dict[str, Probe]) -> Decision:
    """Pick backend, shaper, transport and RDMA support from the probes."""
    reasons = []
    backend = "netns" if probes.get("netns", Probe("netns", False, "")).ok else "none"
    reasons.append("backend netns: namespaces work" if backend == "netns"
                   else "no backend: network namespaces unavailable (need root)")
    if probes["qdisc netem"].ok:
        shaper = "netem"
        reasons.append("shaper netem: the kernel has sch_netem")
    elif probes["nfqueue"].ok and probes["qdisc htb"].ok:
        shaper = "delayline"
        reasons.append("shaper delayline: no netem in this kernel; rate by HTB, delay by an NFQUEUE daemon")
    else:
        shaper = "none"
        reasons.append("no shaper: neither netem nor NFQUEUE+HTB; delay cannot be emulated on this kernel")
    transport = "gloo-tcp" if probes["torch"].ok else "none"
    reasons.append("transport gloo-tcp: torch installed" if probes["torch"].ok
                   else "no transport: torch is not installed (make install)")
    if probes["mininet"].ok and probes["mnexec"].ok:
        from testbed.backends.mininet import resolve_switch

        switch, why = resolve_switch("auto")
        reasons.append(f"backend mininet available (--backend mininet): switch {switch}: {why}")
    else:
        reasons.append("backend mininet unavailable: " + (probes["mininet"].detail if not probes["mininet"].ok
                                                          else probes["mnexec"].detail))
    rdma = "rxe" if probes["rdma_rxe"].ok else "unavailable"
    if rdma == "unavailable":
        reasons.append("rdma unavailable: " + probes["rdma_rxe"].detail)
    return Decision(backend=backend, shaper=shaper, transport=transport, rdma=rdma, reasons=reasons)


def kernel_shaper() -> str:
    """Only the kernel probes: `netem`, `delayline` or `none` (what `--shaper auto` picks)."""
    by_name = {p.name: p for p in _kernel_probes()}
    if by_name.get("qdisc netem", Probe("", False, "")).ok:
        return "netem"
    if by_name.get("nfqueue", Probe("", False, "")).ok and by_name.get("qdisc htb", Probe("", False, "")).ok:
        return "delayline"
    return "none"


def run_doctor() -> DoctorReport:
    """Probe everything (needs root for the kernel probes)."""
    if os.geteuid() != 0:
        kernel = [Probe("netns", False, "not root: namespaces and qdiscs cannot be probed (run as root)")]
        kernel += [Probe(n, False, "not probed (not root)") for n in ("qdisc htb", "qdisc tbf", "qdisc netem", "nfqueue")]
    else:
        kernel = _kernel_probes()
    probes = kernel + _machine_probes()
    by_name = {p.name: p for p in probes}
    return DoctorReport(kernel=platform.release(), cpus=os.cpu_count() or 1, probes=probes, decision=decide(by_name))
