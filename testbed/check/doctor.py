"""`testbed doctor`: probe what this kernel and machine offer, and say which backend, shaper and transport
a run will use and why. Every 'yes' is a real attempt (a qdisc added, a rule inserted), not a guess."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import platform
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path

from testbed.backends import vm
from testbed.backends.capabilities import Probe, kernel_probes, shaper_choice
from testbed.backends.mininet import resolve_switch
from testbed.rdma.support import NETNS_RXE_KERNEL, ROUTES, kernel_version, rxe_in_namespaces
from testbed.util import table
from workloads.records import TCP


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

    def to_json(self) -> dict:
        return asdict(self)

    def render(self) -> str:
        rows = [(p.name, "yes" if p.ok else "no", p.detail) for p in self.probes]
        d = self.decision
        return "\n".join([f"kernel {self.kernel}, {self.cpus} CPUs",
                          table.render(["capability", "present", "evidence"], rows),
                          f"\nA run here uses: backend={d.backend} shaper={d.shaper} transport={d.transport} rdma={d.rdma}",
                          *[f"  - {reason}" for reason in d.reasons]])


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
    support = rxe_in_namespaces()
    probes.append(Probe("rdma_rxe", support.ok, support.reason if support.ok else
                        f"{support.reason}; routes: {ROUTES}"))
    probes.append(_binary_probe("ibv_devinfo", "ibverbs-utils"))
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
    vng = vm.find_vng()        # where `testbed vm` looks: beside this interpreter (the venv), then PATH
    probes.append(Probe("vng", vng is not None, str(vng) if vng else "not found (make install: pip virtme-ng)"))
    kernels = vm.stock_kernels()
    booted = vm.kernel_release(kernels[-1]) if kernels else ""
    rxe_there = kernel_version(booted) >= NETNS_RXE_KERNEL
    probes.append(Probe("stock kernel image", bool(kernels),
                        f"testbed vm boots {kernels[-1]} (rxe in namespaces: {'yes' if rxe_there else 'no, < 7.1'})"
                        if kernels else f"none in /boot besides the running one (apt-get install "
                                        f"{vm.kernel_package()}; scripts/install-stock-kernel.sh for 7.x)"))
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
    shaper, why = shaper_choice(probes)
    reasons.append(f"shaper {shaper}: {why}" if shaper != "none" else f"no shaper: {why}")
    transport = TCP.label if probes["torch"].ok else "none"
    reasons.append(f"transport {TCP.label}: torch installed" if probes["torch"].ok
                   else "no transport: torch is not installed (make install)")
    if probes["mininet"].ok and probes["mnexec"].ok:
        switch, why = resolve_switch("auto")
        reasons.append(f"backend mininet available (--backend mininet): switch {switch}: {why}")
    else:
        reasons.append("backend mininet unavailable: " + (probes["mininet"].detail if not probes["mininet"].ok
                                                          else probes["mnexec"].detail))
    rdma = "rxe" if probes["rdma_rxe"].ok else "unavailable"
    reasons.append("transport rdma (--transport rdma|auto): " + probes["rdma_rxe"].detail if rdma == "rxe"
                   else "transport rdma unavailable (--transport auto takes tcp): " + probes["rdma_rxe"].detail)
    return Decision(backend=backend, shaper=shaper, transport=transport, rdma=rdma, reasons=reasons)


def run_doctor() -> DoctorReport:
    """Probe everything (needs root for the kernel probes)."""
    if os.geteuid() != 0:
        kernel = [Probe("netns", False, "not root: namespaces and qdiscs cannot be probed (run as root)")]
        kernel += [Probe(n, False, "not probed (not root)") for n in ("qdisc htb", "qdisc tbf", "qdisc netem", "nfqueue")]
    else:
        kernel = kernel_probes()
    probes = kernel + _machine_probes()
    by_name = {p.name: p for p in probes}
    return DoctorReport(kernel=platform.release(), cpus=os.cpu_count() or 1, probes=probes, decision=decide(by_name))
