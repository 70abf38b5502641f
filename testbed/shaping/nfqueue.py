"""The nfnetlink_queue wire protocol, as pure functions (build and parse messages); no sockets here.

Constants from linux/netfilter/nfnetlink_queue.h and linux/netfilter/nfnetlink.h.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass

NETLINK_NETFILTER = 12
SOL_NETLINK = 270
NETLINK_NO_ENOBUFS = 5
SO_RCVBUFFORCE = 33

NFNL_SUBSYS_QUEUE = 3
NFQNL_MSG_PACKET = 0
NFQNL_MSG_VERDICT = 1
NFQNL_MSG_CONFIG = 2
NFQNL_MSG_VERDICT_BATCH = 3

NLM_F_REQUEST = 0x1
NLM_F_ACK = 0x4
NLMSG_ERROR = 0x2
NLMSG_HDR = struct.Struct("=IHHII")
NFGEN_HDR = struct.Struct("!BBH")   # family, version, res_id (big-endian queue number)
NLA_HDR = struct.Struct("=HH")

NFQA_CFG_CMD = 1
NFQA_CFG_PARAMS = 2
NFQA_CFG_QUEUE_MAXLEN = 3
NFQA_CFG_MASK = 4
NFQA_CFG_FLAGS = 5
NFQNL_CFG_CMD_BIND = 1
NFQNL_CFG_CMD_UNBIND = 2
NFQNL_COPY_META = 1
NFQNL_COPY_PACKET = 2
COPY_BYTES = 2
"""Bytes of each packet copied to us: two. In metadata-only mode the kernel does not say how long a packet
is (NFQA_CAP_LEN is sent only when packet data is copied); with bytes copied it does. The second is the IPv4
header's TOS byte, the class an OTN edge may drop (testbed/shaping/otn_edge.py)."""
NFQA_CFG_F_FAIL_OPEN = 1
NFQA_CFG_F_GSO = 4

NFQA_PACKET_HDR = 1
NFQA_VERDICT_HDR = 2
NFQA_TIMESTAMP = 4
NFQA_PAYLOAD = 10
NFQA_CAP_LEN = 13
"""The packet's length, when less than all of it was copied."""
NF_DROP = 0
NF_ACCEPT = 1
AF_INET = 2


def _attr(kind: int, payload: bytes) -> bytes:
    length = NLA_HDR.size + len(payload)
    return NLA_HDR.pack(length, kind) + payload + b"\0" * ((4 - length % 4) % 4)


def _message(msg: int, queue: int, attrs: bytes, seq: int, flags: int = NLM_F_REQUEST) -> bytes:
    body = NFGEN_HDR.pack(AF_INET, 0, queue) + attrs
    return NLMSG_HDR.pack(NLMSG_HDR.size + len(body), (NFNL_SUBSYS_QUEUE << 8) | msg, flags, seq, 0) + body


def bind_queue(queue: int, seq: int) -> bytes:
    """Bind this socket to queue `queue` (IPv4)."""
    return _message(NFQNL_MSG_CONFIG, queue, _attr(NFQA_CFG_CMD, struct.pack("!BxH", NFQNL_CFG_CMD_BIND, AF_INET)),
                    seq, NLM_F_REQUEST | NLM_F_ACK)


def unbind_queue(queue: int, seq: int) -> bytes:
    return _message(NFQNL_MSG_CONFIG, queue, _attr(NFQA_CFG_CMD, struct.pack("!BxH", NFQNL_CFG_CMD_UNBIND, AF_INET)),
                    seq, NLM_F_REQUEST | NLM_F_ACK)


def configure_queue(queue: int, maxlen: int, seq: int) -> bytes:
    """Two bytes of each packet copied (so its length comes with it, and its TOS byte), queue length `maxlen`,
    GSO packets passed whole, no fail-open (overflow drops, loudly)."""
    attrs = (_attr(NFQA_CFG_PARAMS, struct.pack("!IB", COPY_BYTES, NFQNL_COPY_PACKET))
             + _attr(NFQA_CFG_QUEUE_MAXLEN, struct.pack("!I", maxlen))
             + _attr(NFQA_CFG_MASK, struct.pack("!I", NFQA_CFG_F_GSO | NFQA_CFG_F_FAIL_OPEN))
             + _attr(NFQA_CFG_FLAGS, struct.pack("!I", NFQA_CFG_F_GSO)))
    return _message(NFQNL_MSG_CONFIG, queue, attrs, seq, NLM_F_REQUEST | NLM_F_ACK)


def verdict(queue: int, packet_id: int, accept: bool, seq: int) -> bytes:
    """Verdict for one packet."""
    return _message(NFQNL_MSG_VERDICT, queue,
                    _attr(NFQA_VERDICT_HDR, struct.pack("!II", NF_ACCEPT if accept else NF_DROP, packet_id)), seq)


def verdict_batch(queue: int, up_to_id: int, seq: int) -> bytes:
    """Accept every queued packet with id <= `up_to_id` (ids are assigned in arrival order)."""
    return _message(NFQNL_MSG_VERDICT_BATCH, queue,
                    _attr(NFQA_VERDICT_HDR, struct.pack("!II", NF_ACCEPT, up_to_id)), seq)


@dataclass(frozen=True, slots=True)
class QueuedPacket:
    queue: int
    packet_id: int
    timestamp: float | None = None
    """Kernel receive time (CLOCK_REALTIME seconds) when rx timestamping is on, else None."""
    length: int | None = None
    """The packet's IP length (a GSO packet's whole length), None where the kernel did not say."""
    tos: int = 0
    """The IPv4 header's TOS byte (DSCP << 2 | ECN), from the copied bytes."""


@dataclass(frozen=True, slots=True)
class NetlinkError:
    seq: int
    errno: int


def parse(buffer: bytes | memoryview) -> Iterator[QueuedPacket | NetlinkError]:
    """Packets and error/ack messages in one recv buffer (acks have errno 0)."""
    view = memoryview(buffer)
    offset = 0
    while offset + NLMSG_HDR.size <= len(view):
        length, kind, _flags, seq, _pid = NLMSG_HDR.unpack_from(view, offset)
        if length < NLMSG_HDR.size:
            break
        if kind == NLMSG_ERROR:
            (err,) = struct.unpack_from("=i", view, offset + NLMSG_HDR.size)
            yield NetlinkError(seq, -err)
        elif kind == (NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_PACKET:
            _, _, queue = NFGEN_HDR.unpack_from(view, offset + NLMSG_HDR.size)
            pos = offset + NLMSG_HDR.size + NFGEN_HDR.size
            end = offset + length
            packet_id = None
            stamp = None
            packet_len = None
            tos = 0
            while pos + NLA_HDR.size <= end:
                alen, atype = NLA_HDR.unpack_from(view, pos)
                if alen < NLA_HDR.size:
                    break
                atype &= 0x7FFF
                if atype == NFQA_PACKET_HDR:
                    (packet_id,) = struct.unpack_from("!I", view, pos + NLA_HDR.size)
                elif atype == NFQA_TIMESTAMP:
                    sec, usec = struct.unpack_from("!QQ", view, pos + NLA_HDR.size)
                    stamp = sec + usec * 1e-6
                elif atype == NFQA_PAYLOAD and alen >= NLA_HDR.size + 2:
                    tos = view[pos + NLA_HDR.size + 1]
                elif atype == NFQA_CAP_LEN:
                    (packet_len,) = struct.unpack_from("!I", view, pos + NLA_HDR.size)
                pos += (alen + 3) & ~3
            if packet_id is not None:
                yield QueuedPacket(queue, packet_id, stamp, packet_len, tos)
        offset += (length + 3) & ~3


@dataclass(frozen=True, slots=True)
class QueueCounters:
    """A line of /proc/net/netfilter/nfnetlink_queue (read inside the namespace)."""

    queue: int
    portid: int
    waiting: int
    dropped: int
    """Dropped because the queue was full (queue_dropped)."""
    user_dropped: int
    """Dropped because the listener's socket buffer was full (queue_user_dropped)."""
    id_sequence: int


def parse_proc(text: str) -> dict[int, QueueCounters]:
    """Parse /proc/net/netfilter/nfnetlink_queue."""
    result = {}
    for line in text.splitlines():
        f = line.split()
        if len(f) >= 8:
            q = QueueCounters(int(f[0]), int(f[1]), int(f[2]), int(f[5]), int(f[6]), int(f[7]))
            result[q.queue] = q
    return result
