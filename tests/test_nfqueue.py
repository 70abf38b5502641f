"""The nfnetlink_queue wire format, without a kernel: messages we build, messages we parse."""

import struct

import pytest

from testbed.shaping import nfqueue


def _packet_message(queue: int, packet_id: int, stamp: tuple[int, int] | None = None) -> bytes:
    attrs = nfqueue._attr(nfqueue.NFQA_PACKET_HDR, struct.pack("!IHB", packet_id, 0x0800, 0))
    if stamp:
        attrs += nfqueue._attr(nfqueue.NFQA_TIMESTAMP, struct.pack("!QQ", *stamp))
    return nfqueue._message(nfqueue.NFQNL_MSG_PACKET, queue, attrs, seq=0, flags=0)


def test_parse_packets_with_and_without_timestamps() -> None:
    buf = _packet_message(3, 41) + _packet_message(3, 42, (1700000000, 250000))
    items = list(nfqueue.parse(buf))
    assert [(i.queue, i.packet_id) for i in items] == [(3, 41), (3, 42)]
    assert items[0].timestamp is None
    assert items[1].timestamp == 1700000000.25


def test_verdict_batch_layout() -> None:
    msg = nfqueue.verdict_batch(7, 1234, seq=9)
    length, kind, flags, seq, _ = nfqueue.NLMSG_HDR.unpack_from(msg)
    assert length == len(msg) and seq == 9
    assert kind == (nfqueue.NFNL_SUBSYS_QUEUE << 8) | nfqueue.NFQNL_MSG_VERDICT_BATCH
    _, _, queue = nfqueue.NFGEN_HDR.unpack_from(msg, 16)
    assert queue == 7
    alen, atype = nfqueue.NLA_HDR.unpack_from(msg, 20)
    assert atype == nfqueue.NFQA_VERDICT_HDR and struct.unpack_from("!II", msg, 24) == (nfqueue.NF_ACCEPT, 1234)


def test_config_asks_for_gso_and_no_fail_open() -> None:
    msg = nfqueue.configure_queue(0, 5000, seq=1)
    attrs = {}
    pos = 20
    while pos < len(msg):
        alen, atype = nfqueue.NLA_HDR.unpack_from(msg, pos)
        attrs[atype] = msg[pos + 4:pos + alen]
        pos += (alen + 3) & ~3
    assert struct.unpack("!I", attrs[nfqueue.NFQA_CFG_QUEUE_MAXLEN])[0] == 5000
    assert struct.unpack("!I", attrs[nfqueue.NFQA_CFG_FLAGS])[0] == nfqueue.NFQA_CFG_F_GSO
    mask = struct.unpack("!I", attrs[nfqueue.NFQA_CFG_MASK])[0]
    assert mask & nfqueue.NFQA_CFG_F_FAIL_OPEN    # explicitly cleared
    assert struct.unpack("!IB", attrs[nfqueue.NFQA_CFG_PARAMS][:5]) == (2, nfqueue.NFQNL_COPY_PACKET)   # 2 bytes


def test_error_messages_parse_as_acks_and_errors() -> None:
    ack = nfqueue.NLMSG_HDR.pack(36, nfqueue.NLMSG_ERROR, 0, 5, 0) + struct.pack("=i", 0) + b"\0" * 16
    err = nfqueue.NLMSG_HDR.pack(36, nfqueue.NLMSG_ERROR, 0, 6, 0) + struct.pack("=i", -1) + b"\0" * 16
    items = list(nfqueue.parse(ack + err))
    assert items == [nfqueue.NetlinkError(5, 0), nfqueue.NetlinkError(6, 1)]


def test_proc_counters() -> None:
    text = "    0   7738     3 1     0     2     5       10  1\n"
    q = nfqueue.parse_proc(text)[0]
    assert (q.portid, q.waiting, q.dropped, q.user_dropped, q.id_sequence) == (7738, 3, 2, 5, 10)


def test_packet_length_comes_with_metadata_only_copies() -> None:
    """With one byte copied the kernel says how long the packet is (NFQA_CAP_LEN): the delay line adds that
    packet's serialization time to its hold."""
    attrs = (nfqueue._attr(nfqueue.NFQA_PACKET_HDR, struct.pack("!IHB", 7, 0x0800, 0))
             + nfqueue._attr(nfqueue.NFQA_CAP_LEN, struct.pack("!I", 65536)))
    (item,) = nfqueue.parse(nfqueue._message(nfqueue.NFQNL_MSG_PACKET, 1, attrs, seq=0, flags=0))
    assert (item.packet_id, item.length) == (7, 65536)


def test_tos_byte_comes_from_the_copied_bytes() -> None:
    """The second copied byte is the IPv4 TOS: the class an OTN edge may drop (CS1, 0x20)."""
    attrs = (nfqueue._attr(nfqueue.NFQA_PACKET_HDR, struct.pack("!IHB", 8, 0x0800, 0))
             + nfqueue._attr(nfqueue.NFQA_PAYLOAD, bytes([0x45, 0x20]))
             + nfqueue._attr(nfqueue.NFQA_CAP_LEN, struct.pack("!I", 1500)))
    (item,) = nfqueue.parse(nfqueue._message(nfqueue.NFQNL_MSG_PACKET, 1, attrs, seq=0, flags=0))
    assert (item.packet_id, item.tos) == (8, 0x20)


def test_serialization_of_a_frame_and_of_a_gso_packet() -> None:
    """Hand-computed at 1 Gbit/s, MTU 1500: one 1500 B packet is 1514 B on the wire (12.1 us); a 64 KiB GSO
    packet is 44 frames, each with an Ethernet header and 43 of them with their own IP+TCP headers:
    65536 + 44 x 14 + 43 x 52 = 68388 B (547 us). No rate or no length: nothing added."""
    from testbed.shaping.delayline import serialization_s

    assert serialization_s(1500, 1e9, 1500) == pytest.approx(1514 * 8 / 1e9)
    assert serialization_s(65536, 1e9, 1500) == pytest.approx(68388 * 8 / 1e9)
    assert serialization_s(65536, 1e9, 9000) == pytest.approx((65536 + 8 * 14 + 7 * 52) * 8 / 1e9)
    assert serialization_s(None, 1e9, 1500) == 0.0 and serialization_s(1500, 0.0, 1500) == 0.0
