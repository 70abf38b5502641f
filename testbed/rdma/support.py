"""Can this kernel run SoftRoCE between emulated hosts? rdma_rxe inside a non-initial network namespace
needs Linux 7.1 ("RDMA/rxe: Add the support that rxe can work in net namespace"); before that an rxe device
on a namespaced veth creates fine but every send fails (docs/kernel.md)."""

from __future__ import annotations

import os
import platform
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from testbed.backends.base import BackendError

NETNS_RXE_KERNEL = (7, 1)
ROUTES = ("run under the stock 7.x kernel in QEMU (make install fetches it; 'testbed vm -- .venv/bin/testbed run "
          "TOPOLOGY --transport rdma', or 'make vm-test'), or put one stage per real host, each with rdma_rxe in its "
          "kernel ('testbed remote cycle INVENTORY --transport rdma' gives each machine's NIC an rxe device)")


@dataclass(frozen=True, slots=True)
class RxeSupport:
    ok: bool
    reason: str
    """What works, or the missing piece (without the routes)."""

    def require(self) -> None:
        if not self.ok:
            raise RdmaUnavailable(f"SoftRoCE between emulated hosts is not available here: {self.reason}. "
                                  f"Routes: {ROUTES}")


class RdmaUnavailable(BackendError):
    """The kernel or userspace cannot give the emulated hosts RDMA; the message names what and the routes."""


def kernel_version(release: str | None = None) -> tuple[int, int]:
    match = re.match(r"(\d+)\.(\d+)", release or platform.release())
    return (int(match.group(1)), int(match.group(2))) if match else (0, 0)


def rxe_module_present(release: str | None = None) -> bool:
    """rdma_rxe loaded, built in, or loadable from this kernel's modules folder."""
    if Path("/sys/module/rdma_rxe").exists():
        return True
    release = release or platform.release()
    moddir = Path("/lib/modules") / release
    if (moddir / "modules.builtin").exists() and "rdma_rxe" in (moddir / "modules.builtin").read_text():
        return True
    return any(moddir.glob("kernel/drivers/infiniband/sw/rxe/rdma_rxe.ko*"))


def pyverbs_present() -> bool:
    try:
        import pyverbs.device  # noqa: F401
    except ImportError:
        return False
    return True


def rxe_in_namespaces() -> RxeSupport:
    """Whether `rdma: softroce` can work on the running kernel, with the first missing piece named."""
    release = platform.release()
    missing = _missing(release, namespaced=True)
    return RxeSupport(not missing, missing or f"kernel {release} runs rdma_rxe inside network namespaces")


def in_initial_netns() -> bool:
    """This process runs in the machine's initial network namespace (a real host, not an emulated one)."""
    try:
        return os.stat("/proc/self/ns/net").st_ino == os.stat("/proc/1/ns/net").st_ino
    except OSError:
        return True


def rxe_here() -> RxeSupport:
    """Whether this machine can give its own NIC an rxe device: a real host needs rdma_rxe in its kernel, an
    emulated host (a network namespace, as in the SSH lab) Linux >= 7.1 as well."""
    release = platform.release()
    namespaced = not in_initial_netns()
    missing = _missing(release, namespaced)
    return RxeSupport(not missing, missing or f"kernel {release} runs rdma_rxe"
                      + (" inside network namespaces" if namespaced else ""))


def _missing(release: str, namespaced: bool) -> str:
    """The first piece SoftRoCE lacks here ('' when nothing)."""
    if not rxe_module_present(release):
        return f"kernel {release} has no rdma_rxe module (not loaded, not built in, not in /lib/modules/{release})"
    if namespaced and kernel_version(release) < NETNS_RXE_KERNEL:
        return (f"kernel {release} has rdma_rxe, but rxe works inside a network namespace only from Linux "
                f"{NETNS_RXE_KERNEL[0]}.{NETNS_RXE_KERNEL[1]}")
    if not shutil.which("rdma"):
        return "the 'rdma' tool is missing (apt install iproute2)"
    if not pyverbs_present():
        return "Python verbs are missing (apt install python3-pyverbs rdma-core)"
    if os.geteuid() != 0:
        return "creating rxe devices needs root"
    return ""
