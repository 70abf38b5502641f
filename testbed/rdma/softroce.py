"""SoftRoCE at bring-up: one rxe device per host, on the host's interface inside its namespace; checked
(port ACTIVE, the IPv4 GID of the host's address, the RDMA MTU) and removed at `down`.

Each device is recorded in the state file before it is created, so `down` after a SIGKILL of `up` still
removes it; deleting a namespace also unregisters the rxe devices on its interfaces (the device follows its
netdev), which `down` checks afterwards.
"""

from __future__ import annotations

import hashlib
import ipaddress
import re
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from testbed.backends.base import Backend, BackendError
from testbed.plan import Plan
from testbed.rdma.support import rxe_in_namespaces
from testbed.state.records import RdmaRecord, RxeDevice
from testbed.topology import Topology

SYSFS = Path("/sys/class/infiniband")
ACTIVE_WAIT_S = 10.0
IB_NAME_MAX = 63
RDMA_MTUS = (4096, 2048, 1024, 512, 256)
ROCE_OVERHEAD = 20 + 8 + 12 + 16 + 4 + 4
"""IPv4 + UDP + BTH + RETH + immediate + ICRC bytes around an RDMA MTU's payload (RoCEv2)."""


def device_name(testbed: str, index: int) -> str:
    """`rxe_<testbed>_<i>`: unique on the machine (rxe names share one RDMA namespace), short enough for IB."""
    name = f"rxe_{testbed}_{index}"
    if len(name) > IB_NAME_MAX:
        name = f"rxe_{hashlib.sha256(testbed.encode()).hexdigest()[:12]}_{index}"
    return name


def rdma_mtu_for(path_mtu: int) -> int:
    """The largest RDMA MTU whose RoCEv2 frames fit an IP MTU (0 where none does)."""
    return next((m for m in RDMA_MTUS if m + ROCE_OVERHEAD <= path_mtu), 0)


def check_topology(topology: Topology) -> None:
    """RoCE frames of at least RDMA MTU 1024 must fit every OTN link (the loader checks `rdma:` in files; this
    checks `--rdma softroce` given on the command line)."""
    small = [link for link in topology.links if rdma_mtu_for(link.mtu) < 1024]
    if small:
        raise BackendError("; ".join(f"{topology.source}: links[{lk.index}].mtu {lk.mtu} is too small for RoCE "
                                     "(--rdma softroce)" for lk in small)
                           + ": use mtu: 9000 in the topology (RDMA MTU 4096)")


def attach(backend: Backend, plan: Plan) -> RdmaRecord:
    """Create and check one rxe device per host. Raises with the first failure; `detach` removes what exists."""
    rxe_in_namespaces().require()
    record = backend.state.rdma = RdmaRecord()
    for index, host in enumerate(plan.hosts):
        iface = host.interfaces[0]
        device = RxeDevice(node=host.name, name=device_name(plan.testbed, index), netdev=iface.name)
        record.devices.append(device)
        backend.state.save()
        _rdma(backend, host.name, ["link", "add", device.name, "type", "rxe", "netdev", iface.name])
    for host in plan.hosts:
        device = record.device_of(host.name)
        assert device is not None
        _check(backend, device, host.ip())
    backend.state.save()
    return record


def detach(backend: Backend) -> list[str]:
    """Remove every recorded rxe device that still exists; returns the names still present afterwards."""
    record = backend.state.rdma
    if record is None:
        return []
    for device in record.devices:
        if exists(device.name):
            try:
                _rdma(backend, device.node, ["link", "delete", device.name])
            except (BackendError, OSError):
                subprocess.run(["rdma", "link", "delete", device.name], capture_output=True, timeout=10)
    return leftover(record)


def leftover(record: RdmaRecord, wait_s: float = 3.0) -> list[str]:
    """Recorded devices still registered after `wait_s` (removal follows the netdev asynchronously)."""
    deadline = time.monotonic() + wait_s
    while True:
        present = [d.name for d in record.devices if exists(d.name)]
        if not present or time.monotonic() > deadline:
            return present
        time.sleep(0.1)


def exists(name: str) -> bool:
    return (SYSFS / name).exists()


def _rdma(backend: Backend, node: str, args: list[str]) -> str:
    result = backend.exec(node, ["rdma", *args], capture_output=True, text=True, timeout=30)
    if result.returncode != 0:
        raise BackendError(f"{node}: 'rdma {' '.join(args)}' failed: {(result.stderr or result.stdout).strip()}")
    return str(result.stdout)


def _check(backend: Backend, device: RxeDevice, address: str) -> None:
    check_device(device, address, lambda argv: backend.exec(device.node, argv, capture_output=True, text=True,
                                                            timeout=30))


def check_device(device: RxeDevice, address: str, run: Callable[[list[str]], Any]) -> None:
    """Port ACTIVE, the GID that maps the host's IPv4 address (RoCEv2), and the RDMA MTU the port runs at
    (`run` runs a command where the device's netdev lives: one machine's namespace, or a remote machine)."""
    deadline = time.monotonic() + ACTIVE_WAIT_S
    state = ""
    while time.monotonic() < deadline:
        state = _read(SYSFS / device.name / "ports/1/state")
        if "ACTIVE" in state:
            break
        time.sleep(0.1)
    else:
        raise BackendError(f"{device.node}: rxe device {device.name} on {device.netdev} did not become ACTIVE "
                           f"within {ACTIVE_WAIT_S:g} s (port state {state.strip() or 'unknown'})")
    wanted = ipaddress.IPv6Address(f"::ffff:{address}")
    while True:
        for gid_file in sorted((SYSFS / device.name / "ports/1/gids").iterdir(), key=lambda p: int(p.name)):
            try:
                gid = ipaddress.IPv6Address(_read(gid_file).strip())
            except ValueError:
                continue
            if gid == wanted:
                device.gid_index, device.gid = int(gid_file.name), str(gid)
                break
        if device.gid_index >= 0 or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    if device.gid_index < 0:
        raise BackendError(f"{device.node}: rxe device {device.name} has no GID for {address} (RoCEv2 needs the "
                           "interface's IPv4 address in the GID table)")
    info = run(["ibv_devinfo", "-d", device.name, "-i", "1"])
    match = re.search(r"active_mtu:\s*(\d+)", info.stdout or "")
    if info.returncode != 0 or not match:
        raise BackendError(f"{device.node}: ibv_devinfo cannot query {device.name}: {(info.stderr or '').strip()} "
                           "(apt install ibverbs-utils)")
    device.active_mtu = int(match.group(1))


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""
