"""TCP throughput between two namespaces with iperf3 (server in one, client in the other)."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from dataclasses import dataclass

from testbed.backends.base import Backend, BackendError

IPERF_PORT = 47912


@dataclass(frozen=True, slots=True)
class ThroughputResult:
    bits_per_s: float
    retransmits: int
    seconds: float


def tcp_throughput(backend: Backend, src: str, dst: str, dst_addr: str, seconds: float = 3.0,
                   omit_s: float = 1.0) -> ThroughputResult:
    """Goodput src -> dst as the receiver counts it, after `omit_s` of slow start."""
    iperf3 = shutil.which("iperf3")
    if iperf3 is None:
        raise BackendError("throughput verification needs iperf3 (apt-get install iperf3, or make install)")
    server = backend.popen(dst, [iperf3, "-s", "-1", "-B", dst_addr, "-p", str(IPERF_PORT)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        time.sleep(0.2)
        result = backend.exec(src, [iperf3, "-c", dst_addr, "-p", str(IPERF_PORT), "-t", f"{seconds:g}",
                                    "-O", f"{omit_s:g}", "-J"], capture_output=True, text=True,
                              timeout=seconds + omit_s + 30)
        if result.returncode != 0:
            raise BackendError(f"iperf3 {src} -> {dst} failed: {result.stdout[-400:]} {result.stderr[-400:]}")
        data = json.loads(result.stdout)
        if "error" in data or "sum_received" not in data.get("end", {}):
            raise BackendError(f"iperf3 {src} -> {dst} gave no result: {data.get('error', 'no sum_received')}")
        end = data["end"]
        return ThroughputResult(bits_per_s=float(end["sum_received"]["bits_per_second"]),
                                retransmits=int(end["sum_sent"].get("retransmits", 0)),
                                seconds=float(end["sum_received"]["seconds"]))
    finally:
        if server.poll() is None:
            server.terminate()
        server.wait(timeout=5)
