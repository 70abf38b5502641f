"""The nfnetlink_queue wire format, without a kernel: messages we build, messages we parse."""

import struct

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
    assert attrs[nfqueue.NFQA_CFG_PARAMS][4] == nfqueue.NFQNL_COPY_META


def test_error_messages_parse_as_acks_and_errors() -> None:
    ack = nfqueue.NLMSG_HDR.pack(36, nfqueue.NLMSG_ERROR, 0, 5, 0) + struct.pack("=i", 0) + b"\0" * 16
    err = nfqueue.NLMSG_HDR.pack(36, nfqueue.NLMSG_ERROR, 0, 6, 0) + struct.pack("=i", -1) + b"\0" * 16
    items = list(nfqueue.parse(ack + err))
    assert items == [nfqueue.NetlinkError(5, 0), nfqueue.NetlinkError(6, 1)]


def test_proc_counters() -> None:
    text = "    0   7738     3 1     0     2     5       10  1\n"
    q = nfqueue.parse_proc(text)[0]
    assert (q.portid, q.waiting, q.dropped, q.user_dropped, q.id_sequence) == (7738, 3, 2, 5, 10)
