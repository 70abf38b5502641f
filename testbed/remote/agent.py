"""What the controller runs on each machine over SSH: `python -m testbed.remote.agent COMMAND ...`.

Every command prints one JSON object on stdout (the controller parses it) and exits non-zero with a message on
stderr when it fails. Import-light: the controller calls it many times.

    env                          kernel, Python, torch, CPUs, shaper the kernel allows, rxe
    shape SPEC.json [--mode M]   install a HostShape with shaper M (auto: what the kernel allows, as `up` picks)
    unshape TESTBED HOST         remove what `shape` installed for TESTBED (by its state file)
    rtt ADDRESS [--count N]      ICMP round trips timed after ingress (the delay line's hold included)
    sink ADDRESS PORT            accept one TCP connection, count its bytes, print goodput
    source ADDRESS PORT SECONDS  send as fast as TCP allows for SECONDS
    worker CONFIG LOG PIDFILE    exec a pipeline worker (stderr to LOG, its pid in PIDFILE)
    kill PIDFILE                 stop that worker (SIGTERM, then SIGKILL), if it still runs
    freeport ADDRESS             a TCP port free on ADDRESS (the rendezvous)
    load                         CPU times (/proc/stat) and runnable tasks, for the host-load record
    counters TESTBED HOST        drops of this testbed's qdiscs per destination DC, delay-line gaps per source DC
    rxe TESTBED HOST INDEX ADDR  an rxe device on the shaped NIC for the RDMA transport (removed by unshape)
    rdma-probe ARGS...           exec the RDMA probe (testbed/rdma/probe.py: serve or client) for RDMA verify
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import socket
import sys
import time
from pathlib import Path

from testbed.remote.replies import (
    CountersReply,
    EnvReply,
    KillReply,
    ListeningReply,
    LoadReply,
    PortReply,
    RemovedReply,
    RttReply,
    ShapeReply,
    SinkReply,
    SourceReply,
)


def _env() -> EnvReply:
    from testbed.backends.capabilities import kernel_shaper

    try:
        import torch
        torch_version: str | None = torch.__version__
    except ImportError:
        torch_version = None
    return EnvReply(hostname=socket.gethostname(), kernel=platform.release(), python=sys.version.split()[0],
                    executable=sys.executable, torch=torch_version, cpus=os.cpu_count(), shaper=kernel_shaper(),
                    rxe=Path("/sys/module/rdma_rxe").exists(), rdma=_rdma_missing(), uid=os.getuid(),
                    boot_id=Path("/proc/sys/kernel/random/boot_id").read_text().strip(),
                    package=str(Path(__file__).resolve().parent.parent.parent), time=time.time())


def _rdma_missing() -> str:
    from testbed.rdma.support import rxe_here

    support = rxe_here()
    return "" if support.ok else support.reason


def _freeport(address: str) -> PortReply:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((address, 0))
        return PortReply(port=sock.getsockname()[1])


def _load() -> LoadReply:
    lines = Path("/proc/stat").read_text().splitlines()
    cpu = [int(x) for x in lines[0].split()[1:]]
    running = next((int(line.split()[1]) for line in lines if line.startswith("procs_running")), 0)
    return LoadReply(cpu=cpu, procs_running=running, cpus=os.cpu_count())


def _counters(testbed: str, host: str) -> CountersReply:
    from testbed.remote.hostshape import counters

    return counters(testbed, host)


def _shape(spec: str, mode: str) -> ShapeReply:
    from testbed.remote.hostshape import HostShape, apply
    from testbed.shaping.registry import machine_shaper

    shape = HostShape.from_json(json.loads(Path(spec).read_text()))
    installed = apply(shape, machine_shaper(mode))
    return ShapeReply(mode=installed.mode, classes=installed.classes, rules=len(installed.rules),
                      daemon_pid=installed.daemon_pid)


def _rtt(address: str, count: int) -> RttReply:
    from testbed.probe.latency import round_trip

    sample = round_trip("/proc/self/ns/net", address, count=count, timeout_s=2.0)
    return RttReply(values_s=list(sample.values_s), lost=sample.lost)


def _sink(address: str, port: int) -> SinkReply:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind((address, port))
        server.listen(1)
        server.settimeout(30)
        print(json.dumps(ListeningReply(listening=port).to_json()), flush=True)
        conn, _ = server.accept()
        with conn:
            total, first, last = 0, None, None
            buf = bytearray(1 << 16)
            while True:
                n = conn.recv_into(buf)
                if not n:
                    break
                last = time.monotonic()
                if first is None:
                    first = last
                else:
                    total += n          # bytes after the first read: the first read's arrival starts the clock
    seconds = (last - first) if first and last and last > first else 0.0
    return SinkReply(bytes=total, seconds=seconds, bps=8 * total / seconds if seconds else 0.0)


def _source(address: str, port: int, seconds: float) -> SourceReply:
    payload = b"\0" * (1 << 16)
    sent = 0
    with socket.create_connection((address, port), timeout=10) as conn:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            sent += conn.send(payload)
    return SourceReply(bytes=sent)


def _worker(config: str, log: str, pidfile: str) -> None:
    Path(pidfile).write_text(str(os.getpid()))
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 2)
    os.execv(sys.executable, [sys.executable, "-m", "workloads.worker", config])


def _rdma_probe(probe_args: list[str]) -> None:
    """Become the RDMA probe: `serve` prints {"listening": PORT} (a ListeningReply), `client` its ProbeResult."""
    os.execv(sys.executable, [sys.executable, "-m", "testbed.rdma.probe", *probe_args])


def _kill(pidfile: str) -> KillReply:
    path = Path(pidfile)
    if not path.exists():
        return KillReply(stopped=None)
    pid = int(path.read_text())
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        path.unlink(missing_ok=True)
        return KillReply(stopped=None)
    if b"workloads.worker" not in cmdline:                  # a recycled pid: not ours
        path.unlink(missing_ok=True)
        return KillReply(stopped=None)
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline and Path(f"/proc/{pid}").exists():
        time.sleep(0.05)
    if Path(f"/proc/{pid}").exists():
        os.kill(pid, signal.SIGKILL)
    path.unlink(missing_ok=True)
    return KillReply(stopped=pid)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="testbed.remote.agent")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("env")
    p = sub.add_parser("shape")
    p.add_argument("spec")
    p.add_argument("--mode", default="auto", help="auto or a shaper's name (testbed.shaping.registry.SHAPERS)")
    p = sub.add_parser("unshape")
    p.add_argument("testbed")
    p.add_argument("host")
    p = sub.add_parser("rtt")
    p.add_argument("address")
    p.add_argument("--count", type=int, default=10)
    p = sub.add_parser("sink")
    p.add_argument("address")
    p.add_argument("port", type=int)
    p = sub.add_parser("source")
    p.add_argument("address")
    p.add_argument("port", type=int)
    p.add_argument("seconds", type=float)
    p = sub.add_parser("worker")
    p.add_argument("config")
    p.add_argument("log")
    p.add_argument("pidfile")
    p = sub.add_parser("kill")
    p.add_argument("pidfile")
    p = sub.add_parser("freeport")
    p.add_argument("address")
    sub.add_parser("load")
    p = sub.add_parser("counters")
    p.add_argument("testbed")
    p.add_argument("host")
    p = sub.add_parser("rxe")
    p.add_argument("testbed")
    p.add_argument("host")
    p.add_argument("index", type=int)
    p.add_argument("address")
    p = sub.add_parser("rdma-probe")
    p.add_argument("probe_args", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    try:
        if args.command == "worker":
            _worker(args.config, args.log, args.pidfile)
        if args.command == "rdma-probe":
            _rdma_probe(args.probe_args)
        from testbed.remote import hostshape
        result = {
            "env": lambda: _env(),
            "shape": lambda: _shape(args.spec, args.mode),
            "unshape": lambda: RemovedReply(removed=hostshape.remove(args.testbed, args.host)),
            "rtt": lambda: _rtt(args.address, args.count),
            "sink": lambda: _sink(args.address, args.port),
            "source": lambda: _source(args.address, args.port, args.seconds),
            "kill": lambda: _kill(args.pidfile),
            "freeport": lambda: _freeport(args.address),
            "load": _load,
            "counters": lambda: _counters(args.testbed, args.host),
            "rxe": lambda: hostshape.add_rxe(args.testbed, args.host, args.index, args.address),
        }[args.command]()
    except Exception as exc:   # noqa: BLE001 - one line for the controller, which names the host
        print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(result.to_json()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
