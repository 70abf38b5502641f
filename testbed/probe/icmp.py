"""ICMP echo from inside namespaces, many pairs at once, with raw sockets (no `ping` subprocesses)."""

from __future__ import annotations

import os
import selectors
import socket
import struct
import time
from dataclasses import dataclass

from testbed.backends import nsfs

ICMP_ECHO_REQUEST = 8
ICMP_ECHO_REPLY = 0


@dataclass(frozen=True, slots=True)
class EchoResult:
    """Outcome of echoes from one namespace to one address."""

    src: str
    dst: str
    sent: int
    received: int
    rtts_s: tuple[float, ...]

    @property
    def ok(self) -> bool:
        return self.received == self.sent


def _checksum(data: bytes) -> int:
    if len(data) % 2:
        data += b"\0"
    total = sum(struct.unpack(f"!{len(data) // 2}H", data))
    total = (total >> 16) + (total & 0xFFFF)
    total += total >> 16
    return ~total & 0xFFFF


def _echo(ident: int, seq: int) -> bytes:
    payload = struct.pack("!d", time.monotonic()) + b"tb" * 12
    header = struct.pack("!BBHHH", ICMP_ECHO_REQUEST, 0, 0, ident, seq)
    return struct.pack("!BBHHH", ICMP_ECHO_REQUEST, 0, _checksum(header + payload), ident, seq) + payload


def echo_all(targets: dict[str, list[str]], count: int = 1, timeout_s: float = 2.0,
             interval_s: float = 0.0) -> list[EchoResult]:
    """Send `count` echoes from each namespace (key) to each of its addresses; collect replies until `timeout_s`.

    Each source namespace gets its own raw socket, opened inside it; all pairs are probed concurrently.
    """
    sel = selectors.DefaultSelector()
    socks: list[tuple[str, socket.socket, int]] = []
    rtts: dict[tuple[str, str], list[float]] = {}
    seq_dst: dict[tuple[int, int], str] = {}
    try:
        for i, (netns, dsts) in enumerate(targets.items()):
            with nsfs.entered(netns):
                sock = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
            sock.setblocking(False)
            ident = (os.getpid() + i * 7919) & 0xFFFF
            socks.append((netns, sock, ident))
            sel.register(sock, selectors.EVENT_READ, (netns, ident))
            for dst in dsts:
                rtts[(netns, dst)] = []
        pending = 0
        for round_ in range(count):
            for netns, sock, ident in socks:
                for j, dst in enumerate(targets[netns]):
                    seq = (round_ * len(targets[netns]) + j) & 0xFFFF
                    seq_dst[(ident, seq)] = dst
                    sock.sendto(_echo(ident, seq), (dst, 0))
                    pending += 1
            if interval_s and round_ < count - 1:
                pending -= _collect(sel, rtts, seq_dst, time.monotonic() + interval_s, pending)
        _collect(sel, rtts, seq_dst, time.monotonic() + timeout_s, pending)
    finally:
        for _, sock, _ in socks:
            sock.close()
        sel.close()
    return [EchoResult(src, dst, count, len(v), tuple(v)) for (src, dst), v in rtts.items()]


def _collect(sel: selectors.BaseSelector, rtts: dict[tuple[str, str], list[float]],
             seq_dst: dict[tuple[int, int], str], deadline: float, pending: int) -> int:
    got = 0
    while got < pending:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        for key, _ in sel.select(left):
            netns, ident = key.data
            sock = key.fileobj
            while True:
                try:
                    packet = sock.recv(2048)  # type: ignore[union-attr]
                except BlockingIOError:
                    break
                now = time.monotonic()
                ihl = (packet[0] & 0x0F) * 4
                kind, _, _, rid, seq = struct.unpack("!BBHHH", packet[ihl:ihl + 8])
                if kind != ICMP_ECHO_REPLY or rid != ident or (rid, seq) not in seq_dst:
                    continue
                (sent_at,) = struct.unpack("!d", packet[ihl + 8:ihl + 16])
                dst = seq_dst[(rid, seq)]
                rtts[(netns, dst)].append(now - sent_at)
                got += 1
    return got
