"""The topology's background loads during a run: iperf3 flows started before the workers and stopped after them.

Each load (testbed/topology/background.py) is one iperf3 server in the receiving host and one client in the
sending host (`-P flows`, `-b rate/flows` per flow where paced, `-S 0x20` for the lossy class). The client is
stopped with SIGTERM when the run ends, and writes its report then: bytes sent, seconds and TCP's retransmitted
segments (its sockets' own count). Every process is registered in the testbed's state while it runs, so that
`testbed down` stops it after a crash; the namespaces' teardown would too.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from testbed.backends.base import Backend
from testbed.errors import TestbedError
from testbed.plan.builder import HOST_IFNAME
from testbed.probe.tcpstats import counters_by_node, counters_during
from testbed.shaping.otn_edge import LOSSY_TOS
from testbed.state.records import ProcessRecord
from testbed.topology.background import BackgroundLoad
from testbed.util import procs
from testbed.util.interrupts import cleanup

BACKGROUND_PORT = 47930
"""The first load's iperf3 port (one port per load, in the receiving host's namespace)."""
LONGEST_S = 86400
"""The clients' `-t`: longer than any run; the run stops them."""
START_WAIT_S = 0.3


class BackgroundError(TestbedError, RuntimeError):
    """A background load that could not start; the message says why."""


@dataclass(slots=True)
class LoadReport:
    """What one load carried during the run (iperf3's client report)."""

    load: str
    flows: int
    lossy: bool
    rate_bps: float | None
    """The rate asked for (None: unpaced)."""
    dilation: float = 1.0
    """The run's time dilation k: the load ran at rate / k, as the links did; `sent_bps` is undilated."""
    bytes_sent: int = 0
    seconds: float = 0.0
    retransmits: int = 0
    """TCP segments the load's flows sent again (the sockets' own count)."""
    note: str = ""

    @property
    def sent_bps(self) -> float:
        return self.bytes_sent * 8 * self.dilation / self.seconds if self.seconds > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "sent_bps": self.sent_bps}


@dataclass(slots=True)
class _Running:
    load: BackgroundLoad
    server: subprocess.Popen[bytes]
    client: subprocess.Popen[bytes] | None
    report: Path


def iperf_command(load: BackgroundLoad, address: str, port: int) -> list[str]:
    """The client's command line for one load."""
    argv = ["-c", address, "-p", str(port), "-t", str(LONGEST_S), "-P", str(load.flows), "-J", "-i", "0"]
    if load.rate_bps:
        argv += ["-b", f"{load.rate_bps / load.flows:.0f}"]
    if load.lossy:
        argv += ["-S", str(LOSSY_TOS)]
    return argv


def require_iperf3() -> str:
    """iperf3's path, or an error that says how to install it (checked before a run with background loads)."""
    iperf3 = shutil.which("iperf3")
    if iperf3 is None:
        raise BackgroundError("the topology's background traffic needs iperf3 (apt-get install iperf3, or make install)")
    return iperf3


@contextlib.contextmanager
def background_traffic(backend: Backend, loads: tuple[BackgroundLoad, ...], out_dir: Path,
                       log: Callable[[str], None] = print, dilation: float = 1.0) -> Iterator[list[LoadReport]]:
    """Every load running inside the block (a paced one at rate / `dilation`, as a dilated run's links run); the
    list filled with their reports when it ends (however it ends)."""
    reports: list[LoadReport] = []
    if not loads:
        yield reports
        return
    iperf3 = require_iperf3()
    running: list[_Running] = []
    try:
        for index, load in enumerate(loads):
            slowed = dataclasses.replace(load, rate_bps=load.rate_bps and load.rate_bps / dilation)
            _start(backend, iperf3, slowed, BACKGROUND_PORT + index, out_dir / f"background-{index}.json", running)
            log(f"background: {load.describe()}")
        backend.state.save()
        yield reports
    finally:
        with cleanup():
            reports += [dataclasses.replace(_stop(backend, r), rate_bps=r.load.rate_bps and r.load.rate_bps * dilation,
                                            dilation=dilation) for r in running]
            backend.state.save()


def _start(backend: Backend, iperf3: str, load: BackgroundLoad, port: int, report: Path,
           running: list[_Running]) -> None:
    """Start the load's server, then its client; each joins `running` as soon as it exists (the caller stops
    whatever started, also when this fails or a signal arrives half-way)."""
    address = backend.state.plan.node(load.dst).ip(HOST_IFNAME)
    server_log = report.with_suffix(".server.log")
    with open(server_log, "wb") as out:
        server = backend.popen(load.dst, [iperf3, "-s", "-B", address, "-p", str(port)], stdout=out,
                               stderr=subprocess.STDOUT, start_new_session=True)
    entry = _Running(load, server, None, report)
    running.append(entry)
    backend.state.processes.append(ProcessRecord.of(server.pid, "background", load.dst))
    time.sleep(START_WAIT_S)
    if server.poll() is not None:
        raise BackgroundError(f"background {load.label}: the iperf3 server on {load.dst} (port {port}) exited at "
                              f"once: {_error_of(server_log)}")
    with open(report, "wb") as out:
        entry.client = backend.popen(load.src, [iperf3, *iperf_command(load, address, port)], stdout=out,
                                     stderr=subprocess.STDOUT, start_new_session=True)
    backend.state.processes.append(ProcessRecord.of(entry.client.pid, "background", load.src))
    time.sleep(START_WAIT_S)
    if entry.client.poll() is not None:
        raise BackgroundError(f"background {load.label}: iperf3 exited at once ({_error_of(report)})")


def _stop(backend: Backend, running: _Running) -> LoadReport:
    client = running.client
    if client is not None and client.poll() is None:
        client.send_signal(signal.SIGTERM)                 # iperf3 writes its report on SIGTERM
        with contextlib.suppress(subprocess.TimeoutExpired):
            client.wait(timeout=5)
    started = [p for p in (client, running.server) if p is not None]
    procs.terminate([p.pid for p in started if p.poll() is None], grace_s=2.0)
    for proc in started:
        proc.wait()
    pids = {p.pid for p in started}
    backend.state.processes = [r for r in backend.state.processes if r.pid not in pids]
    return read_report(running.load, running.report)


def read_report(load: BackgroundLoad, path: Path) -> LoadReport:
    """The load's report from iperf3's JSON (a note instead where it wrote none)."""
    report = LoadReport(load.label, load.flows, load.lossy, load.rate_bps)
    try:
        sent = json.loads(path.read_text())["end"]["sum_sent"]
    except (OSError, ValueError, KeyError, TypeError):
        report.note = f"iperf3 wrote no report: {_error_of(path)}"
        return report
    report.bytes_sent, report.seconds = int(sent.get("bytes", 0)), float(sent.get("seconds", 0.0))
    report.retransmits = int(sent.get("retransmits", 0))
    return report


def _error_of(path: Path) -> str:
    try:
        text = path.read_text()
    except OSError:
        return "no output"
    with contextlib.suppress(ValueError):
        return str(json.loads(text).get("error", "no error stated"))
    return text[-300:].strip() or "no output"


TRAFFIC_FILE = "traffic.json"
"""In each launch's folder: the background loads' reports and every host's TCP counters (retransmits, loss
probes, timeouts) during the launch."""


@contextlib.contextmanager
def shared_traffic(backend: Backend, out_dir: Path, dilation: float = 1.0) -> Iterator[None]:
    """The plan's background loads running inside the block, and every host's TCP counters (retransmitted
    segments, tail-loss probes, timeouts) read over it; both written to out_dir/traffic.json when it ends (however it ends)."""
    hosts = [h.name for h in backend.state.plan.hosts]
    before = counters_by_node(backend, hosts)
    reports: list[LoadReport] = []
    try:
        with background_traffic(backend, backend.state.plan.background, out_dir, log=lambda _line: None,
                                dilation=dilation) as reports:
            yield
    finally:
        with cleanup():
            during = counters_during(before, counters_by_node(backend, hosts))
            (out_dir / TRAFFIC_FILE).write_text(json.dumps(
                {"background": [r.to_json() for r in reports], "tcp": during}, indent=1))


def read_traffic(out_dir: Path) -> dict[str, Any]:
    """A launch's traffic.json ({} where the launch wrote none)."""
    path = out_dir / TRAFFIC_FILE
    return json.loads(path.read_text()) if path.exists() else {}
