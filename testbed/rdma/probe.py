"""RDMA probe between two emulated hosts, over the same endpoint the workers use (workloads/rdma/endpoint.py):
one-way latency from ping-pongs and the goodput of back-to-back messages, over the hosts' rxe devices.

    python -m testbed.rdma.probe serve  --device D --gid-index G --port P
    python -m testbed.rdma.probe client --device D --gid-index G --server ADDR:P [--size B --count N ...]

The two sides exchange their QP numbers, GIDs and slot pools over one TCP connection (the rendezvous),
then the client measures and prints one JSON line. No torch: the probe starts in well under a second.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import socket
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any

from workloads.rdma.endpoint import LinkParams, RdmaEndpoint

SERVER_RANK, CLIENT_RANK = 0, 1
PING_TAG, BULK_TAG, ACK_TAG = 1, 2, 3


@dataclass(frozen=True, slots=True)
class ProbeResult:
    one_way_s: float
    """Median of the ping-pongs' half round trips."""
    one_way_min_s: float
    """Half the shortest round trip: the path's floor (a guest's stalls only ever add time)."""
    one_way_p90_s: float
    goodput_bps: float
    """Bulk bytes over (last completion - first post - one way)."""
    bulk_s: float
    size: int
    count: int
    qps: int
    rdma_mtu: int
    transfer_s: list[float]
    """Per message of the ping-pong size: the one-way times."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ProbeResult:
        """The client's last stdout line read back (RDMA verify)."""
        return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})


def _params(args: argparse.Namespace) -> LinkParams:
    return LinkParams.for_path(args.rtt, args.rate, args.mtu, max(args.size, args.ping_size), slots=args.slots)


def _rendezvous(sock: socket.socket, info: dict[str, Any]) -> dict[str, Any]:
    sock.sendall((json.dumps({str(k): v for k, v in info.items()}) + "\n").encode())
    line = sock.makefile("r").readline()
    if not line:
        raise SystemExit("rdma probe: the peer closed the rendezvous")
    return {int(k): v for k, v in json.loads(line).items()}


def serve(args: argparse.Namespace) -> int:
    params = _params(args)
    listener = socket.create_server(("0.0.0.0", args.port))
    listener.settimeout(args.timeout)      # a client that never comes does not leave the server behind
    print(json.dumps({"listening": args.port}), flush=True)
    conn, _ = listener.accept()
    conn.settimeout(None)
    listener.close()
    endpoint = RdmaEndpoint(args.device, args.gid_index, SERVER_RANK, {CLIENT_RANK: params}, timeout_s=args.timeout)
    try:
        remote = _rendezvous(conn, endpoint.local_info())
        endpoint.connect({CLIENT_RANK: remote[SERVER_RANK]})
        buf = ctypes.create_string_buffer(max(args.size, args.ping_size))
        addr = ctypes.addressof(buf)
        arrived, posted = [], []
        for _ in range(args.pings):
            got = endpoint.recv(addr, args.ping_size, CLIENT_RANK, PING_TAG)
            got.wait()
            arrived.append(got.finished_at)
            posted.append(time.monotonic())
            endpoint.send(addr, args.ping_size, CLIENT_RANK, PING_TAG).wait()
        if args.trace:
            print(json.dumps({"server_arrived": arrived, "server_posted": posted}), file=sys.stderr, flush=True)
        for _ in range(args.count):
            endpoint.recv(addr, args.size, CLIENT_RANK, BULK_TAG).wait()
        endpoint.send(addr, 8, CLIENT_RANK, ACK_TAG).wait()
        conn.recv(1)                     # the client is done: close only after it stops writing credits
    finally:
        endpoint.close()
        conn.close()
    return 0


def client(args: argparse.Namespace) -> int:
    params = _params(args)
    host, port = args.server.rsplit(":", 1)
    deadline = time.monotonic() + args.timeout
    while True:
        try:
            conn = socket.create_connection((host, int(port)), timeout=args.timeout)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    endpoint = RdmaEndpoint(args.device, args.gid_index, CLIENT_RANK, {SERVER_RANK: params}, timeout_s=args.timeout)
    try:
        remote = _rendezvous(conn, endpoint.local_info())
        endpoint.connect({SERVER_RANK: remote[CLIENT_RANK]})
        send_buf = ctypes.create_string_buffer(b"\x5a" * max(args.size, args.ping_size))
        recv_buf = ctypes.create_string_buffer(max(args.size, args.ping_size))
        saddr, raddr = ctypes.addressof(send_buf), ctypes.addressof(recv_buf)
        one_way, trace = [], []
        for _ in range(args.pings):
            t0 = time.monotonic()
            pending = endpoint.recv(raddr, args.ping_size, SERVER_RANK, PING_TAG)
            sent = endpoint.send(saddr, args.ping_size, SERVER_RANK, PING_TAG)
            sent.wait()
            pending.wait()
            one_way.append((time.monotonic() - t0) / 2)
            trace.append((t0, sent.finished_at, pending.finished_at))
        if args.trace:
            print(json.dumps({"client": trace}), file=sys.stderr, flush=True)
        if recv_buf.raw[:args.ping_size] != send_buf.raw[:args.ping_size]:
            raise SystemExit("rdma probe: the echoed bytes differ from those sent")
        ack = endpoint.recv(raddr, 8, SERVER_RANK, ACK_TAG)
        t0 = time.monotonic()
        sends = [endpoint.send(saddr, args.size, SERVER_RANK, BULK_TAG) for _ in range(args.count)]
        for s in sends:
            s.wait()
        ack.wait()
        bulk = ack.finished_at - t0
        median = statistics.median(one_way)
        ordered = sorted(one_way)
        result = ProbeResult(one_way_s=median, one_way_min_s=ordered[0],
                             one_way_p90_s=ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))],
                             goodput_bps=8 * args.size * args.count / max(1e-9, bulk - median), bulk_s=bulk,
                             size=args.size, count=args.count, qps=params.qps, rdma_mtu=params.rdma_mtu,
                             transfer_s=one_way)
        conn.sendall(b"x")
        print(json.dumps(result.to_json()), flush=True)
    finally:
        endpoint.close()
        conn.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m testbed.rdma.probe")
    parser.add_argument("role", choices=["serve", "client"])
    parser.add_argument("--device", required=True)
    parser.add_argument("--gid-index", type=int, required=True)
    parser.add_argument("--port", type=int, default=18515)
    parser.add_argument("--server", help="ADDR:PORT (client)")
    parser.add_argument("--size", type=int, default=1 << 20, help="bulk message bytes")
    parser.add_argument("--count", type=int, default=8, help="bulk messages")
    parser.add_argument("--ping-size", type=int, default=64)
    parser.add_argument("--pings", type=int, default=10)
    parser.add_argument("--rtt", type=float, default=0.01, help="path round trip, s (sizes QPs and ACK timeout)")
    parser.add_argument("--rate", type=float, default=1e9, help="path rate, bit/s")
    parser.add_argument("--mtu", type=int, default=4096, help="RDMA MTU cap")
    parser.add_argument("--slots", type=int, default=8)
    parser.add_argument("--timeout", type=float, default=60.0)
    parser.add_argument("--trace", action="store_true", help="print per-ping timestamps on stderr")
    args = parser.parse_args(argv)
    return serve(args) if args.role == "serve" else client(args)


if __name__ == "__main__":
    sys.exit(main())
