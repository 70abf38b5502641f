"""Latency probes timed after every ingress queue: the receiver busy-polls in user space.

Kernel receive timestamps (and plain `ping`) are taken before PREROUTING, so they miss the delay line's
NFQUEUE hold; a sleeping receiver adds its wake-up latency (~0.1 ms here). Busy-polling one socket for
the few milliseconds a probe is in flight costs one core briefly and times arrival within microseconds.
Sender and receiver run in this one process (sockets opened inside each namespace), so one-way delay is a
difference of the same CLOCK_MONOTONIC.
"""

from __future__ import annotations

import os
import socket
import statistics
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass

from testbed.backends import nsfs
from testbed.probe.icmp import ICMP_ECHO_REPLY, _echo

PROBE_PORT = 47911
PROBE_INTERVAL_S = 0.005


@dataclass(frozen=True, slots=True)
class LatencySample:
    """Probe results in seconds; `lost` probes got no answer within the timeout."""

    values_s: tuple[float, ...]
    lost: int

    @property
    def median_s(self) -> float:
        return statistics.median(self.values_s) if self.values_s else float("nan")

    @property
    def iqr_s(self) -> float:
        """Interquartile range: the measurement's own spread."""
        if len(self.values_s) < 4:
            return 0.0
        q = statistics.quantiles(self.values_s, n=4)
        return q[2] - q[0]


def _spin_recv(sock: socket.socket, deadline: float, accept: object) -> float | None:
    while True:
        try:
            data = sock.recv(2048)
        except BlockingIOError:
            if time.monotonic() > deadline:
                return None
            os.sched_yield()   # let the delay daemon and softirqs run on this core: 2-core machines
            continue
        now = time.monotonic()
        if accept(data):  # type: ignore[operator]
            return now


def _probe(count: int, interval_s: float, timeout_s: float, send: Callable[[int, float], None], rx: socket.socket,
           accept: Callable[[int, bytes], bool]) -> LatencySample:
    """Send probe `seq` at time t, spin on `rx` until `accept(seq, data)`; one probe in flight at a time."""
    values, lost = [], 0
    for seq in range(count):
        sent = time.monotonic()
        send(seq, sent)
        got = _spin_recv(rx, sent + timeout_s, lambda d, seq=seq: accept(seq, d))
        if got is None:
            lost += 1
        else:
            values.append(got - sent)
        time.sleep(interval_s)
    return LatencySample(tuple(values), lost)


def one_way(src_netns: str, dst_netns: str, dst_addr: str, count: int = 10, interval_s: float = PROBE_INTERVAL_S,
            timeout_s: float = 1.0) -> LatencySample:
    """One-way delay src -> dst: UDP probes to a socket bound inside the destination namespace."""
    with nsfs.entered(dst_netns):
        rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    with nsfs.entered(src_netns):
        tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    with rx, tx:
        rx.bind((dst_addr, PROBE_PORT))
        rx.setblocking(False)
        return _probe(count, interval_s, timeout_s,
                      lambda seq, sent: tx.sendto(struct.pack("!Id", seq, sent), (dst_addr, PROBE_PORT)), rx,
                      lambda seq, data: struct.unpack("!Id", data[:12])[0] == seq)


def round_trip(src_netns: str, dst_addr: str, count: int = 10, interval_s: float = PROBE_INTERVAL_S,
               timeout_s: float = 1.0) -> LatencySample:
    """ICMP echo round trip, reply timed by busy-polling a raw socket in the source namespace."""
    with nsfs.entered(src_netns):
        sock = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
    ident = (id(sock) >> 4) & 0xFFFF

    def is_reply(seq: int, data: bytes) -> bool:
        ihl = (data[0] & 0x0F) * 4
        kind, _, _, rid, rseq = struct.unpack("!BBHHH", data[ihl:ihl + 8])
        return kind == ICMP_ECHO_REPLY and rid == ident and rseq == seq

    with sock:
        sock.setblocking(False)
        return _probe(count, interval_s, timeout_s, lambda seq, _sent: sock.sendto(_echo(ident, seq), (dst_addr, 0)),
                      sock, is_reply)
