"""The delay line's logic (testbed/shaping/delayline.py) on a scripted queue, without root or a kernel.

`ScriptedKernel` plays the kernel's side of the NETLINK_NETFILTER socket: packets (queue, id, length) arrive at
scripted times with kernel timestamps, and every verdict the daemon sends is recorded with the time it came
(a batch verdict accepts every queued packet up to its id, as the kernel does). `ScriptedClock` plays time: a
wait ends at its timeout plus a scripted oversleep, or at the next arrival when the daemon watches the socket.

Tested: each packet leaves at arrival + hold + its serialization time; never before a packet that arrived
before it (a shorter jittered hold waits for the longer one ahead, and is counted on time); releases learn to
land on time, with one advance for long sleeps and one for short; drops are counted (ids the daemon never saw,
configured loss) with one verdict per packet; shutdown releases what is held. And a remote machine's delay line
and the single machine's, built from one plan, hold a packet as long (serialization included).
"""

from __future__ import annotations

import dataclasses
import json
import random
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from paperlab import paper_inventory

from testbed.plan import build_plan
from testbed.remote.hostshape import ingress_queues, plan_shapes
from testbed.remote.inventory import load_inventory
from testbed.shaping import nfqueue
from testbed.shaping.delayline import (
    EARLY_RELEASE_S,
    SPARSE_GAP_S,
    DaemonConfig,
    DaemonStats,
    DelayLine,
    QueueConfig,
    Timing,
    serialization_s,
)
from testbed.shaping.delayline_shaper import queue_config

US = 1e-6
MS = 1e-3
WALL_OFFSET_S = 1_700_000_000.0
"""CLOCK_REALTIME minus CLOCK_MONOTONIC on the scripted host."""
SYSCALL_S = 2 * US
"""What every wait costs, even one that does not sleep (so a loop that polls still sees time pass)."""


@dataclass(frozen=True)
class Packet:
    arrival: float
    """Monotonic seconds."""
    queue: int
    packet_id: int
    length: int = 84


@dataclass(frozen=True)
class Verdict:
    at: float
    accepted: bool


class ScriptedClock:
    """Time for the daemon: `oversleep(sleep_s)` is how late a timed wait wakes."""

    def __init__(self, oversleep: Callable[[float], float] = lambda _s: 0.0) -> None:
        self.now = 0.0
        self.oversleep = oversleep
        self.kernel: ScriptedKernel | None = None

    def monotonic(self) -> float:
        return self.now

    def wall(self) -> float:
        return self.now + WALL_OFFSET_S

    def wait(self, readers: list[Any], timeout_s: float) -> list[Any]:
        until = self.now + timeout_s
        arrival = self.kernel.next_arrival() if self.kernel is not None and self.kernel in readers else None
        if arrival is not None and arrival <= until:
            self.now = max(self.now, arrival) + SYSCALL_S
            return [self.kernel]
        self.now = until + (self.oversleep(timeout_s) if timeout_s > 0 else 0.0) + SYSCALL_S
        return []

    def spin_until(self, deadline: float) -> None:
        self.now = max(self.now, deadline)


def _attr(kind: int, payload: bytes) -> bytes:
    return nfqueue._attr(kind, payload)


def packet_message(p: Packet) -> bytes:
    """What the kernel sends for one queued packet: its id, its kernel receive time, its length."""
    stamp_us = round((p.arrival + WALL_OFFSET_S) * 1e6)
    attrs = (_attr(nfqueue.NFQA_PACKET_HDR, struct.pack("!IHB", p.packet_id, 0x0800, 1))
             + _attr(nfqueue.NFQA_TIMESTAMP, struct.pack("!QQ", *divmod(stamp_us, 1_000_000)))
             + _attr(nfqueue.NFQA_CAP_LEN, struct.pack("!I", p.length)))
    return nfqueue._message(nfqueue.NFQNL_MSG_PACKET, p.queue, attrs, seq=0, flags=0)


def _messages(data: bytes) -> list[tuple[int, int, int, int, dict[int, bytes]]]:
    """(message type, flags, seq, queue, attributes) of each netlink message the daemon sent."""
    out, offset = [], 0
    while offset < len(data):
        length, kind, flags, seq, _ = nfqueue.NLMSG_HDR.unpack_from(data, offset)
        _, _, queue = nfqueue.NFGEN_HDR.unpack_from(data, offset + nfqueue.NLMSG_HDR.size)
        attrs, pos = {}, offset + nfqueue.NLMSG_HDR.size + nfqueue.NFGEN_HDR.size
        while pos < offset + length:
            alen, atype = nfqueue.NLA_HDR.unpack_from(data, pos)
            attrs[atype] = data[pos + nfqueue.NLA_HDR.size:pos + alen]
            pos += (alen + 3) & ~3
        out.append((kind & 0xFF, flags, seq, queue, attrs))
        offset += (length + 3) & ~3
    return out


class ScriptedKernel:
    """The kernel's side of the daemon's netlink socket, scripted."""

    def __init__(self, clock: ScriptedClock, packets: list[Packet]) -> None:
        self.clock = clock
        self.unread = sorted(packets, key=lambda p: p.arrival)
        self.queued = {(p.queue, p.packet_id): p for p in packets}
        """In the kernel's queue: arrived (or yet to arrive) and given no verdict."""
        self.verdicts: dict[tuple[int, int], Verdict] = {}
        self.second_verdicts: list[tuple[int, int]] = []
        self.replies: list[bytes] = []
        self.bound: list[int] = []
        self.unbound: list[int] = []
        self.closed = False

    def next_arrival(self) -> float | None:
        return self.unread[0].arrival if self.unread else None

    def _decide(self, key: tuple[int, int], accepted: bool) -> None:
        if key in self.verdicts or key not in self.queued:
            self.second_verdicts.append(key)
            return
        del self.queued[key]
        self.verdicts[key] = Verdict(self.clock.now, accepted)

    # -- the socket, as the daemon uses it ---------------------------------------------------------
    def send(self, data: bytes) -> int:
        for kind, flags, seq, queue, attrs in _messages(data):
            if kind == nfqueue.NFQNL_MSG_CONFIG:
                if nfqueue.NFQA_CFG_CMD in attrs:
                    cmd = attrs[nfqueue.NFQA_CFG_CMD][0]
                    (self.bound if cmd == nfqueue.NFQNL_CFG_CMD_BIND else self.unbound).append(queue)
                if flags & nfqueue.NLM_F_ACK:
                    self.replies.append(nfqueue.NLMSG_HDR.pack(36, nfqueue.NLMSG_ERROR, 0, seq, 0)
                                        + struct.pack("=i", 0) + b"\0" * 16)
            elif kind == nfqueue.NFQNL_MSG_VERDICT:
                verdict, packet_id = struct.unpack("!II", attrs[nfqueue.NFQA_VERDICT_HDR])
                self._decide((queue, packet_id), verdict == nfqueue.NF_ACCEPT)
            elif kind == nfqueue.NFQNL_MSG_VERDICT_BATCH:
                verdict, up_to = struct.unpack("!II", attrs[nfqueue.NFQA_VERDICT_HDR])
                for key in sorted(k for k, p in self.queued.items()
                                  if k[0] == queue and k[1] <= up_to and p.arrival <= self.clock.now):
                    self._decide(key, verdict == nfqueue.NF_ACCEPT)
        return len(data)

    def recv(self, _size: int) -> bytes:
        data, self.replies = b"".join(self.replies), []
        return data

    def recv_into(self, buffer: bytearray) -> int:
        ready = []
        while self.unread and self.unread[0].arrival <= self.clock.now:
            ready.append(self.unread.pop(0))
        if not ready:
            raise BlockingIOError
        data = b"".join(packet_message(p) for p in ready)
        buffer[:len(data)] = data
        return len(data)

    def setblocking(self, _flag: bool) -> None:
        pass

    def close(self) -> None:
        self.closed = True


class RecordedRandom(random.Random):
    """The daemon's random source, seeded, with the jitter it drew kept in order."""

    def __init__(self, seed: int) -> None:
        super().__init__(seed)
        self.uniforms: list[float] = []

    def uniform(self, a: float, b: float) -> float:
        x = super().uniform(a, b)
        self.uniforms.append(x)
        return x


@dataclass
class Run:
    line: DelayLine
    kernel: ScriptedKernel
    clock: ScriptedClock
    packets: list[Packet]

    def release(self, p: Packet) -> float:
        verdict = self.kernel.verdicts[(p.queue, p.packet_id)]
        assert verdict.accepted, p
        return verdict.at

    def stats(self) -> DaemonStats:
        self.line.write_stats()
        return DaemonStats.from_json(json.loads(self.line.stats_path.read_text()))


def start(tmp_path: Path, queues: list[QueueConfig], packets: list[Packet],
          oversleep: Callable[[float], float] = lambda _s: 0.0, rng: random.Random | None = None,
          name: str = "line") -> tuple[Run, Any]:
    """A delay line on `queues` over the scripted kernel, started (its queues bound); and its socket."""
    config, stats = tmp_path / f"{name}.json", tmp_path / f"{name}.stats.json"
    config.write_text(json.dumps(DaemonConfig(0, queues, Timing(realtime=False)).to_json()))
    clock = ScriptedClock(oversleep)
    kernel = ScriptedKernel(clock, packets)
    clock.kernel = kernel
    line = DelayLine(config, stats, netlink=lambda: kernel, clock=clock)   # type: ignore[arg-type, return-value]
    if rng is not None:
        line.rng = rng
    sock = line.start()
    assert sorted(kernel.bound) == sorted(q.queue for q in queues)
    return Run(line, kernel, clock, packets), sock


def serve(tmp_path: Path, queues: list[QueueConfig], packets: list[Packet], **kwargs: Any) -> Run:
    """`start`, then the daemon's loop until every packet has had its verdict (and a little longer)."""
    run, sock = start(tmp_path, queues, packets, **kwargs)
    end = max(p.arrival for p in packets) + max(q.delay_s + q.jitter_s for q in queues) + 50 * MS
    while run.clock.now < end:
        run.line.step(sock)
    assert not run.kernel.queued, f"{len(run.kernel.queued)} packets never got a verdict"
    assert not run.kernel.second_verdicts, "a packet was given two verdicts"
    return run


def due(p: Packet, q: QueueConfig, jitter_s: float = 0.0) -> float:
    return p.arrival + max(0.0, q.delay_s + serialization_s(p.length, q.rate_bps, q.mtu) + jitter_s)


def at_us(i: int, gap_us: int, start_us: int = 1000) -> float:
    """Arrival times on a microsecond grid (the kernel stamps microseconds)."""
    return (start_us + i * gap_us) * US


# -- release -----------------------------------------------------------------------------------------------


def test_each_packet_is_held_its_delay_plus_its_serialization(tmp_path: Path) -> None:
    q = QueueConfig(queue=1, ifname="otn1", delay_s=5 * MS, rate_bps=1e9, mtu=1500)
    warm = [Packet(at_us(i, 20_000), 1, i + 1) for i in range(80)]
    lengths = [84, 1500, 9000, 65000] * 5
    measured = [Packet(at_us(80 + i, 20_000), 1, 81 + i, n) for i, n in enumerate(lengths)]
    run = serve(tmp_path, [q], warm + measured)
    assert serialization_s(65000, 1e9, 1500) == pytest.approx((65000 + 44 * 14 + 43 * 52) * 8 / 1e9)
    for p in measured:
        held = run.release(p) - p.arrival
        assert held == pytest.approx(q.delay_s + serialization_s(p.length, 1e9, 1500), abs=10 * US), p
    for p in warm + measured:
        assert run.release(p) >= due(p, q) - EARLY_RELEASE_S - 1 * US, f"{p} released before its time"


def test_releases_learn_to_land_on_time_one_advance_for_long_sleeps_one_for_short(tmp_path: Path) -> None:
    """A wait longer than SPARSE_GAP_S wakes 250 us late here, a shorter one 60 us: after sparse probes and then
    dense traffic, each kind of release lands on time, each with its own advance."""
    q = QueueConfig(queue=1, ifname="otn1", delay_s=5 * MS)
    sparse = [Packet(at_us(i, 20_000), 1, i + 1) for i in range(200)]
    t0 = 200 * 20_000 + 1000
    dense = [Packet(at_us(i, 100, t0), 1, 201 + i) for i in range(4000)]
    run = serve(tmp_path, [q], sparse + dense,
                oversleep=lambda sleep_s: 250 * US if sleep_s > SPARSE_GAP_S else 60 * US)
    assert run.line.advance_sparse_s == pytest.approx(250 * US, abs=15 * US)
    assert run.line.advance_s == pytest.approx(60 * US, abs=15 * US)
    for phase in (sparse[-50:], dense[-1000:]):
        errors = [run.release(p) - due(p, q) for p in phase]
        assert abs(sum(errors) / len(errors)) < 10 * US, f"mean release error {sum(errors) / len(errors) * 1e6:.0f} us"
        assert max(errors) < 40 * US and min(errors) >= -EARLY_RELEASE_S - 1 * US


# -- ordering ----------------------------------------------------------------------------------------------


def test_no_packet_leaves_before_one_that_arrived_before_it(tmp_path: Path) -> None:
    """Jitter draws holds up to 2 ms apart for packets 200 us apart: a packet drawn a shorter hold than one ahead
    of it leaves with that one (never before it), and the daemon counts it as released on time."""
    q = QueueConfig(queue=1, ifname="otn1", delay_s=5 * MS, jitter_s=1 * MS)
    packets = [Packet(at_us(i, 200), 1, i + 1) for i in range(2000)]
    rng = RecordedRandom(7)
    run = serve(tmp_path, [q], packets, rng=rng)
    assert len(rng.uniforms) == len(packets)
    releases = [run.release(p) for p in packets]
    assert releases == sorted(releases), "a packet left before one that arrived before it"
    own = [due(p, q, u) for p, u in zip(packets, rng.uniforms, strict=True)]
    effective = [max(own[:i + 1]) for i in range(len(own))]
    waited = sum(1 for i in range(1, len(own)) if own[i] < effective[i - 1])
    assert waited > len(packets) / 4, "the script did not exercise a shorter hold behind a longer one"
    for p, at, when in zip(packets, releases, effective, strict=True):
        assert at >= when - EARLY_RELEASE_S - 1 * US, f"{p} left {(when - at) * 1e6:.0f} us before its time"
    stats = run.stats().queues[1]
    assert stats.released == len(packets) and stats.held == 0
    kernel_error = sum(at - when for at, when in zip(releases, effective, strict=True))
    assert stats.error_us_sum * US == pytest.approx(kernel_error, abs=len(packets) * 1 * US), \
        "the daemon's release error is not the one the kernel saw (against the hold it could keep)"
    assert stats.late_us_max < 100


# -- drops -------------------------------------------------------------------------------------------------


def test_drops_are_counted_and_every_packet_gets_one_verdict(tmp_path: Path) -> None:
    """Queue 1: the kernel dropped ids 11-13 before the daemon saw them (socket overflow): three id gaps.
    Queue 2: configured loss 0.25: each drop a verdict of its own, counted as intended."""
    q1 = QueueConfig(queue=1, ifname="otn1", delay_s=2 * MS)
    q2 = QueueConfig(queue=2, ifname="otn2", delay_s=3 * MS, loss=0.25)
    ids = [*range(1, 11), *range(14, 31)]
    packets = [Packet(at_us(i, 500), 1, n) for i, n in enumerate(ids)]
    packets += [Packet(at_us(i, 300, 77), 2, i + 1) for i in range(400)]
    run = serve(tmp_path, [q1, q2], packets)
    stats = run.stats()
    one, two = stats.queues[1], stats.queues[2]
    assert (one.packets, one.id_gaps, one.released, one.random_drops, one.held) == (len(ids), 3, len(ids), 0, 0)
    dropped = [k for k, v in run.kernel.verdicts.items() if k[0] == 2 and not v.accepted]
    assert two.random_drops == len(dropped) and 60 < len(dropped) < 140
    assert two.released + two.random_drops == two.packets == 400 and two.id_gaps == 0 and two.held == 0
    assert all(v.accepted for k, v in run.kernel.verdicts.items() if k[0] == 1)


def test_shutdown_releases_everything_held_and_counts_no_error_for_it(tmp_path: Path) -> None:
    q = QueueConfig(queue=3, ifname="otn3", delay_s=20 * MS)
    packets = [Packet(at_us(i, 1000), 3, i + 1) for i in range(10)]
    run, sock = start(tmp_path, [q], packets)
    while run.clock.now < 15 * MS:
        run.line.step(sock)
    assert not run.kernel.verdicts and run.line.stats[3].held == 10
    run.line.shutdown(sock)
    assert all(run.release(p) == pytest.approx(run.clock.now) for p in packets)
    assert run.kernel.unbound == [3] and run.kernel.closed
    stats = run.stats().queues[3]
    assert (stats.released, stats.held, stats.error_us_sum) == (10, 0, 0.0)


# -- one config, one hold: the remote machine's delay line and the single machine's ----------------------------


def test_a_remote_and_a_local_delay_line_from_one_plan_hold_a_packet_as_long(tmp_path: Path) -> None:
    """dc-a -> dc-b of the 3dc-lab topology (50 Mbit/s, 4 ms): the single machine's queue for the direction and
    dc-b's machine's queue for dc-a, the same path latency taken off both; packets of every size held as long
    by both, a 64 KiB GSO packet 10.9 ms longer than a ping (its serialization at 50 Mbit/s)."""
    inventory = load_inventory(paper_inventory(tmp_path))
    plan = build_plan(inventory.topology, "t")
    direction = next(d for d in plan.directions if (d.src_dc, d.dst_dc) == ("dc-a", "dc-b"))
    subtract_s = 0.12 * MS
    local = queue_config(direction, {direction.label: subtract_s})
    shape = dataclasses.replace(plan_shapes(inventory, "t")["dc-b-h1"], subtract_s={"dc-a": subtract_s})
    index = next(i for i, peer in enumerate(shape.ingress) if peer.dc == "dc-a")
    remote = ingress_queues(shape)[index]
    assert dataclasses.replace(remote, queue=local.queue, ifname=local.ifname) == local
    assert remote.rate_bps == direction.rate_bps == 50e6 and remote.mtu == direction.mtu

    lengths = [84] * 40 + [84, 1500, 65000, 84, 9000, 1500, 65000]
    held: dict[str, list[float]] = {}
    for name, q in (("local", local), ("remote", remote)):
        packets = [Packet(at_us(i, 30_000), q.queue, i + 1, n) for i, n in enumerate(lengths)]
        run = serve(tmp_path, [q], packets, name=name)
        held[name] = [run.release(p) - p.arrival for p in packets]
    assert held["remote"] == pytest.approx(held["local"], abs=2 * US)
    by_length = dict(zip(lengths[40:], held["remote"][40:], strict=True))
    assert by_length[84] == pytest.approx(4 * MS - subtract_s + serialization_s(84, 50e6, 1500), abs=10 * US)
    assert by_length[65000] - by_length[84] == pytest.approx(
        serialization_s(65000, 50e6, 1500) - serialization_s(84, 50e6, 1500), abs=10 * US)
    assert by_length[65000] - by_length[84] > 10.8 * MS
