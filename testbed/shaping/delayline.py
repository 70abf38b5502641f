"""The delay line: a user-space daemon that holds each packet of its NFQUEUE queues for the link's delay.

One daemon per receiving namespace; one queue per incoming OTN link (an iptables raw PREROUTING rule on the
receiver's ingress sends the link's packets there). Verdicts are released in arrival order at
arrival + delay (+ jitter, never reordering), in batches. SIGTERM releases every held packet before the
queues are unbound; SIGHUP re-reads the config (new delays apply to packets arriving afterwards).

Its netlink socket and its clock are parameters (`DelayLine.netlink`, `DelayLine.clock`; by default the
kernel's NETLINK_NETFILTER socket and the host's clocks), so its release, ordering and learning run against a
scripted queue too (tests/test_delayline_logic.py).

Run: python -m testbed.shaping.delayline CONFIG.json STATS.json
"""

from __future__ import annotations

import json
import os
import random
import resource
import select
import signal
import socket
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from testbed.shaping import nfqueue
from testbed.shaping.otn_edge import LOSSY_TOS, EdgeConfig, OtnEdge

RCVBUF_BYTES = 64 * 1024 * 1024
STATS_INTERVAL_S = 0.5
SO_TIMESTAMP = 29  # asm-generic/socket.h (SO_TIMESTAMP_OLD)
EARLY_RELEASE_S = 30e-6
"""Release a packet up to this much before its time rather than sleep again (a sleep overshoots by ~0.1 ms)."""
ADVANCE_STEP_S = 50e-6
"""Lateness is clipped to this per update, so a scheduling hiccup (ms) does not swing the controller."""
MAX_ADVANCE_S = 1e-3
SPARSE_GAP_S = 2e-3
"""A sleep longer than this wakes later (the VM's timer lands later after a deep idle): the daemon learns one
advance for long sleeps (sparse traffic: calibration and verify probes) and one for short ones (dense
traffic: training), so that both release on time: an advance learnt under sparse probes releases dense traffic
early by the difference (0.3-0.4 ms on a 2-core VM)."""
SPIN_WINDOW_S = 1e-3
"""In sparse traffic, wake before a release (by the learnt 90th percentile of select()'s oversleep, at most
this much) and spin to it: select() alone lands 50-200 us late on a 2-core VM, later after long sleeps.
Spinning costs CPU per release, so it is used only below SPIN_MAX_EVENTS_PER_S."""
SPIN_MAX_EVENTS_PER_S = 400
SPIN_MARGIN_S = 30e-6
ARRIVAL_WAKE_S = 1e-3
"""While packets are held, arrivals do not wake the daemon (their kernel timestamps say when they came; they
are read at the next release): half the wake-ups, each ~40 us of CPU on a 2-core VM. Unless some queue holds
less than this, when a new arrival may be due before anything held."""


@dataclass(frozen=True, slots=True)
class QueueConfig:
    """One incoming link direction."""

    queue: int
    ifname: str
    delay_s: float
    jitter_s: float = 0.0
    loss: float = 0.0
    maxlen: int = 65536
    rate_bps: float = 0.0
    """The direction's rate: each packet is held its own serialization time on top (0: not added)."""
    mtu: int = 1500
    edge: EdgeConfig | None = None
    """The OTN edge behind the hold: the upstream port (paused by PFC), the buffer and its DC-side rate."""


@dataclass(frozen=True, slots=True)
class Timing:
    """How the daemon keeps time (what `make bench-overhead` compares)."""

    realtime: bool = True
    """SCHED_FIFO (priority REALTIME_PRIORITY): a release preempts the workers' compute at once instead of
    waiting for its time slice (at normal priority, behind two computing workers on 2 cores, releases land
    0.34 ms late on average and up to 18 ms late). Where the kernel refuses it, the daemon runs at normal priority
    and its stats say so (`realtime` false)."""
    spin: bool = False
    """Spin the last stretch to each release in sparse traffic (wakes early by the learnt oversleep); off, a
    release waits in select() woken early by the learnt mean lateness: a few tens of microseconds of jitter
    instead of ~0.1 ms of CPU per release."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


REALTIME_PRIORITY = 10


@dataclass(slots=True)
class DaemonConfig:
    """The daemon's configuration file: written by the shaper, re-read on SIGHUP (a new `generation`)."""

    generation: int
    queues: list[QueueConfig]
    timing: Timing = field(default_factory=Timing)

    def to_json(self) -> dict[str, Any]:
        return {"generation": self.generation, "queues": [asdict(q) for q in self.queues],
                "timing": self.timing.to_json()}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> DaemonConfig:
        return cls(int(data.get("generation", 0)),
                   [QueueConfig(**{**q, "edge": EdgeConfig.from_json(q.get("edge"))}) for q in data["queues"]],
                   Timing(**data.get("timing", {})))


@dataclass(slots=True)
class QueueStats:
    """Counters of one queue, since the daemon started."""

    packets: int = 0
    released: int = 0
    held: int = 0
    max_held: int = 0
    kernel_stamped: int = 0
    """Packets whose arrival time came from the kernel's receive timestamp (else: our recv time)."""
    late_us_max: float = 0.0
    """Worst lateness of a release against its due time, microseconds."""
    late_us_sum: float = 0.0
    error_us_sum: float = 0.0
    """Sum over released packets of release time - due time (signed): / released is the mean error of the
    delay the link delivers, under whatever load the host had (testbed/run reads it per run)."""
    id_gaps: int = 0
    """Packet ids skipped: packets the kernel dropped before we saw them (socket overflow)."""
    random_drops: int = 0
    """Packets dropped on purpose (configured loss, fault experiments only)."""
    last_id: int = 0
    edge: dict[str, Any] | None = None
    """The OTN edge's counters (otn_edge.EdgeCounters) where the queue has one."""


@dataclass(kw_only=True, slots=True)
class DaemonStats:
    """The daemon's statistics file, rewritten a few times a second while it runs."""

    pid: int
    ready: bool
    uptime_s: float
    advance_us: float
    spin: bool
    oversleep_p90_us: float
    realtime: bool = False
    """Running under SCHED_FIFO (Timing.realtime asked and granted)."""
    advance_sparse_us: float = 0.0
    generation: int
    """Configuration generation in force."""
    cpu_s: float
    """User + system CPU time of the daemon."""
    queues: dict[int, QueueStats]

    def to_json(self) -> dict[str, Any]:
        return {**{k: getattr(self, k) for k in ("pid", "ready", "uptime_s", "advance_us", "spin", "oversleep_p90_us",
                                                  "generation", "cpu_s", "realtime", "advance_sparse_us")},
                "queues": {str(q): asdict(s) for q, s in self.queues.items()}}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> DaemonStats:
        known = set(QueueStats.__dataclass_fields__)
        return cls(**{**data, "queues": {int(q): QueueStats(**{k: v for k, v in s.items() if k in known})
                                         for q, s in data["queues"].items()}})


class Clock(Protocol):
    """The daemon's time: what it reads, how it waits for a socket or a deadline, how it spins to one."""

    def monotonic(self) -> float: ...

    def wall(self) -> float:
        """CLOCK_REALTIME seconds: the clock of the kernel's receive timestamps."""
        ...

    def wait(self, readers: list[Any], timeout_s: float) -> list[Any]:
        """Those of `readers` that became readable within `timeout_s` (select's first list)."""
        ...

    def spin_until(self, deadline: float) -> None: ...


class SystemClock:
    """The host's clocks; waiting is select(), spinning a busy loop."""

    def monotonic(self) -> float:
        return time.monotonic()

    def wall(self) -> float:
        return time.time()

    def wait(self, readers: list[Any], timeout_s: float) -> list[Any]:
        return select.select(readers, [], [], timeout_s)[0]

    def spin_until(self, deadline: float) -> None:
        while time.monotonic() < deadline:
            pass


def netlink_socket() -> socket.socket:
    """The kernel's NETLINK_NETFILTER socket, bound, with a receive buffer for bursts and no ENOBUFS errors."""
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, nfqueue.NETLINK_NETFILTER)
    sock.bind((0, 0))
    sock.setsockopt(socket.SOL_SOCKET, nfqueue.SO_RCVBUFFORCE, RCVBUF_BYTES)
    sock.setsockopt(nfqueue.SOL_NETLINK, nfqueue.NETLINK_NO_ENOBUFS, 1)
    return sock


@dataclass(slots=True)
class DelayLine:
    """The event loop around one NETLINK_NETFILTER socket (`netlink` makes it) on one clock."""

    config_path: Path
    stats_path: Path
    netlink: Callable[[], socket.socket] = netlink_socket
    clock: Clock = field(default_factory=SystemClock)
    queues: dict[int, QueueConfig] = field(default_factory=dict)
    stats: dict[int, QueueStats] = field(default_factory=dict)
    held: dict[int, deque[tuple[float, int]]] = field(default_factory=dict)
    edges: dict[int, OtnEdge] = field(default_factory=dict)
    dropping: list[tuple[int, int]] = field(default_factory=list)
    """(queue, packet id) the edges dropped, whose verdicts go out before the next release."""
    seq: int = 0
    stopping: bool = False
    reload: bool = False
    started: float | None = None
    """When it started (its clock's monotonic time; None: when it is made)."""
    _stamp_sock: socket.socket | None = None
    rng: random.Random = field(default_factory=lambda: random.Random(4791))
    advance_s: float = 100e-6
    """How much before a release time the loop asks to wake in dense traffic; learnt from measured release
    lateness so that releases land on time on average (select() overshoots by ~0.05-0.2 ms on a loaded VM)."""
    advance_sparse_s: float = 100e-6
    """The same for a release more than SPARSE_GAP_S after the previous one."""
    first_late_s: float | None = None
    release_events: int = 0
    generation: int = 0
    oversleep_p90_s: float = 150e-6
    spin: bool = True
    """Spin to release times (sparse traffic) or rely on the learnt advance (dense traffic)."""
    timing: Timing = field(default_factory=Timing)
    realtime: bool = False
    _waitables: list[Any] = field(default_factory=list, init=False)
    _wakeup: int | None = field(default=None, init=False)
    _buffer: bytearray = field(default_factory=lambda: bytearray(1 << 20), init=False)
    _next_stats: float = field(default=0.0, init=False)

    def __post_init__(self) -> None:
        if self.started is None:
            self.started = self.clock.monotonic()

    def load_config(self) -> None:
        config = DaemonConfig.from_json(json.loads(self.config_path.read_text()))
        self.generation = config.generation
        self.queues = {q.queue: q for q in config.queues}
        if config.timing != self.timing or not self.stats:
            self.timing = config.timing
            self.realtime = _set_realtime(config.timing.realtime)
            self.spin = self.spin and config.timing.spin
        for q, cfg in self.queues.items():
            self.stats.setdefault(q, QueueStats())
            self.held.setdefault(q, deque())
            if cfg.edge is None:
                self.edges.pop(q, None)
            elif q in self.edges:              # a new rate applies to what arrives next; what it holds stays
                self.edges[q].config = cfg.edge
            else:
                self.edges[q] = OtnEdge(cfg.edge)

    def _send(self, sock: socket.socket, message_for_seq: object) -> None:
        self.seq += 1
        sock.send(message_for_seq(self.seq))  # type: ignore[operator]

    def open(self) -> socket.socket:
        """The socket, bound to every configured queue (each acknowledged), non-blocking."""
        sock = self.netlink()
        for q in self.queues.values():
            for build in (lambda s, q=q: nfqueue.bind_queue(q.queue, s),
                          lambda s, q=q: nfqueue.configure_queue(q.queue, q.maxlen, s)):
                self.seq += 1
                sock.send(build(self.seq))
                self._expect_ack(sock, self.seq)
        sock.setblocking(False)
        self._enable_rx_timestamps()
        return sock

    def _enable_rx_timestamps(self) -> None:
        """Any socket asking for SO_TIMESTAMP turns on kernel receive timestamps, which NFQUEUE then reports
        (NFQA_TIMESTAMP): arrival is taken from the kernel, not from when this process woke up."""
        self._stamp_sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._stamp_sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMP, 1)

    @staticmethod
    def _expect_ack(sock: socket.socket, seq: int) -> None:
        while True:
            for item in nfqueue.parse(sock.recv(65536)):
                if isinstance(item, nfqueue.NetlinkError) and item.seq == seq:
                    if item.errno:
                        raise OSError(item.errno, f"nfnetlink_queue config refused: {os.strerror(item.errno)}")
                    return

    def on_packets(self, buffer: memoryview, now: float) -> None:
        real_minus_mono = self.clock.wall() - now
        for item in nfqueue.parse(buffer):
            if not isinstance(item, nfqueue.QueuedPacket):
                continue
            cfg = self.queues.get(item.queue)
            if cfg is None:
                continue
            st = self.stats[item.queue]
            if st.last_id and item.packet_id != st.last_id + 1:
                st.id_gaps += item.packet_id - st.last_id - 1
            st.last_id = item.packet_id
            st.packets += 1
            arrival = now
            if item.timestamp is not None:
                stamped = item.timestamp - real_minus_mono
                if now - 0.5 < stamped <= now:
                    arrival = stamped
                    st.kernel_stamped += 1
            delay = cfg.delay_s + serialization_s(item.length, cfg.rate_bps, cfg.mtu)
            if cfg.jitter_s:
                delay = max(0.0, delay + self.rng.uniform(-cfg.jitter_s, cfg.jitter_s))
            queue = self.held[item.queue]
            edge = self.edges.get(item.queue)
            if edge is None:
                release: float | None = arrival + delay
            else:
                release = edge.admit(arrival, wire_bytes(item.length, cfg.mtu), delay, item.tos & 0xFC == LOSSY_TOS)
                if release is None:
                    self.dropping.append((item.queue, item.packet_id))
                    continue
            if queue and release < queue[-1][0]:
                release = queue[-1][0]          # never reorder
            queue.append((release, item.packet_id))
            st.held = len(queue)
            st.max_held = max(st.max_held, st.held)

    def release_due(self, sock: socket.socket, now: float, everything: bool = False) -> None:
        for qnum, packet_id in self.dropping:      # before any batch verdict that would accept them
            self._send(sock, lambda s, p=packet_id, q=qnum: nfqueue.verdict(q, p, False, s))
        self.dropping.clear()
        for qnum, queue in self.held.items():
            last = None
            cfg = self.queues.get(qnum)
            st = self.stats[qnum]
            while queue and (everything or queue[0][0] <= now + EARLY_RELEASE_S):
                due, packet_id = queue.popleft()
                if self.first_late_s is None or now - due > self.first_late_s:
                    self.first_late_s = now - due
                late_us = (now - due) * 1e6
                if not everything:
                    st.error_us_sum += late_us
                if late_us > 0 and not everything:
                    st.late_us_sum += late_us
                    st.late_us_max = max(st.late_us_max, late_us)
                if cfg is not None and cfg.loss and not everything and self.rng.random() < cfg.loss:
                    self._send(sock, lambda s, p=packet_id, q=qnum: nfqueue.verdict(q, p, False, s))
                    st.random_drops += 1
                    continue
                last = packet_id
                st.released += 1
            if last is not None:
                self.release_events += 1
                self._send(sock, lambda s, last=last, q=qnum: nfqueue.verdict_batch(q, last, s))
            st.held = len(queue)

    def _learn_oversleep(self, oversleep: float) -> None:
        """Track the 90th percentile of how late select() wakes (stochastic quantile estimate)."""
        step = 5e-6
        if oversleep > self.oversleep_p90_s:
            self.oversleep_p90_s = min(SPIN_WINDOW_S, self.oversleep_p90_s + 9 * step)
        else:
            self.oversleep_p90_s = max(0.0, self.oversleep_p90_s - step)

    def next_deadline(self) -> float | None:
        heads = [q[0][0] for q in self.held.values() if q]
        return min(heads) if heads else None

    def write_stats(self) -> None:
        for q, edge in self.edges.items():
            self.stats[q].edge = edge.snapshot(self.clock.monotonic())
        usage = resource.getrusage(resource.RUSAGE_SELF)
        stats = DaemonStats(pid=os.getpid(), ready=True, uptime_s=self.clock.monotonic() - (self.started or 0.0),
                            advance_us=self.advance_s * 1e6, spin=self.spin, oversleep_p90_us=self.oversleep_p90_s * 1e6,
                            generation=self.generation, cpu_s=usage.ru_utime + usage.ru_stime, realtime=self.realtime,
                            advance_sparse_us=self.advance_sparse_s * 1e6,
                            queues={q: s for q, s in self.stats.items() if q in self.queues})
        tmp = self.stats_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(stats.to_json()))
        os.replace(tmp, self.stats_path)

    def start(self, wakeup: int | None = None) -> socket.socket:
        """Read the configuration, bind the queues, write the first statistics (the shaper's sign of ready).
        `wakeup` is the read end of the signal wake-up pipe, so signals end a wait at once."""
        self.load_config()
        sock = self.open()
        self._wakeup = wakeup
        self._waitables = [sock] + ([wakeup] if wakeup is not None else [])
        self.write_stats()
        self._next_stats = self.clock.monotonic() + STATS_INTERVAL_S
        return sock

    def run(self, wakeup: int | None = None) -> None:
        """Serve until SIGTERM."""
        sock = self.start(wakeup)
        print("ready", flush=True)
        while not self.stopping:
            self.step(sock)
        self.shutdown(sock)

    def step(self, sock: socket.socket) -> None:
        """One turn: take a new configuration if asked, wait for the next release (or an arrival that may be due
        first), read what arrived, release what is due, and learn from how late the release woke."""
        if self.reload:
            self.reload = False
            self.load_config()
            for q in self.queues.values():
                self._send(sock, lambda s, q=q: nfqueue.configure_queue(q.queue, q.maxlen, s))
            self.write_stats()
        waitables, clock = self._waitables, self.clock
        deadline = self.next_deadline()
        now = clock.monotonic()
        sparse = deadline is not None and deadline - now > SPARSE_GAP_S       # a long sleep wakes later
        lead = (self.oversleep_p90_s + SPIN_MARGIN_S if self.spin
                else self.advance_sparse_s if sparse else self.advance_s)
        shortest = self.min_hold_s()
        if deadline is None:                   # nothing held: the next packet's arrival wakes us
            watch, wake_at = waitables, now + STATS_INTERVAL_S
        elif shortest < lead + ARRIVAL_WAKE_S:  # a queue that holds (almost) nothing: arrivals are due at once
            watch, wake_at = waitables, deadline - lead
        else:                                  # holding: wake for the release only; arrivals carry kernel
            deadline = min(deadline, now + shortest)       # timestamps and are read then
            watch, wake_at = waitables[1:], deadline - lead
        wake_at = min(wake_at, self._next_stats)
        readable = clock.wait(watch, max(0.0, wake_at - now))
        if not readable and deadline is not None and wake_at > now:
            self._learn_oversleep(clock.monotonic() - wake_at)
        if self.spin and not readable and deadline is not None:
            clock.spin_until(deadline)
        if self._wakeup is not None and self._wakeup in readable:
            os.read(self._wakeup, 512)
        self._drain(sock, self._buffer)
        now = clock.monotonic()
        self.first_late_s = None
        self.release_due(sock, now)
        if self.first_late_s is not None and deadline is not None and not readable and not self.spin:
            step = 0.1 * min(ADVANCE_STEP_S, max(-ADVANCE_STEP_S, self.first_late_s))
            if sparse:
                self.advance_sparse_s = min(MAX_ADVANCE_S, max(0.0, self.advance_sparse_s + step))
            else:
                self.advance_s = min(MAX_ADVANCE_S, max(0.0, self.advance_s + step))
        if now >= self._next_stats:
            self.spin = self.timing.spin and self.release_events < SPIN_MAX_EVENTS_PER_S * STATS_INTERVAL_S
            self.release_events = 0
            self.write_stats()
            self._next_stats = now + STATS_INTERVAL_S

    def _drain(self, sock: socket.socket, buffer: bytearray) -> None:
        """Read every packet the kernel has queued for us (each with its kernel arrival time)."""
        while True:
            try:
                n = sock.recv_into(buffer)
            except BlockingIOError:
                return
            except InterruptedError:
                continue
            self.on_packets(memoryview(buffer)[:n], self.clock.monotonic())

    def min_hold_s(self) -> float:
        """The shortest hold any queue gives a packet arriving now: no release can fall due sooner."""
        return min((max(0.0, q.delay_s - q.jitter_s) for q in self.queues.values()), default=0.0)

    def shutdown(self, sock: socket.socket) -> None:
        """Release everything held (SIGKILL would drop it), then unbind the queues."""
        self.release_due(sock, self.clock.monotonic(), everything=True)
        sock.setblocking(True)
        for q in self.queues.values():
            self._send(sock, lambda s, q=q: nfqueue.unbind_queue(q.queue, s))
        self.write_stats()
        sock.close()


WIRE_HEADER_BYTES = 14
"""Ethernet header per frame."""
SEGMENT_HEADER_BYTES = 52
"""IPv4 + TCP with timestamps: what each further segment of a GSO packet repeats on the wire."""


def serialization_s(length: int | None, rate_bps: float, mtu: int) -> float:
    """How long the link takes to carry a packet of IP length `length` (a GSO packet as the frames it becomes:
    each with an Ethernet header, each segment after the first with its own IP and TCP headers), as HTB meters
    it. HTB releases a packet when its tokens allow and the veth delivers it at once; a real link delivers its
    last byte this much later, so the hold adds it (a 64 KiB GSO packet at 1 Gbit/s: 0.53 ms)."""
    if not length or rate_bps <= 0:
        return 0.0
    return wire_bytes(length, mtu) * 8 / rate_bps


def wire_bytes(length: int | None, mtu: int) -> int:
    """A packet of IP length `length` as the bytes its frames take on the wire (a GSO packet as its frames)."""
    if not length:
        return WIRE_HEADER_BYTES + 46
    frames = max(1, -(-length // mtu))
    return length + frames * WIRE_HEADER_BYTES + (frames - 1) * SEGMENT_HEADER_BYTES


def _set_realtime(wanted: bool) -> bool:
    """SCHED_FIFO at REALTIME_PRIORITY when `wanted` (else normal); False where the kernel refuses it."""
    try:
        if wanted:
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(REALTIME_PRIORITY))
            return True
        os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
    except (PermissionError, OSError):
        pass
    return False


def _tighten_timers() -> None:
    """Timer slack 1 ns instead of 50 us: select() wakes closer to the release time (measured: median
    oversleep 114 -> 59 us on the 2-core CI VM); the remaining oversleep is learnt and subtracted."""
    import ctypes

    PR_SET_TIMERSLACK = 29
    ctypes.CDLL(None).prctl(PR_SET_TIMERSLACK, 1, 0, 0, 0)


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    line = DelayLine(Path(argv[0]), Path(argv[1]))

    def stop(_signum: int, _frame: object) -> None:
        line.stopping = True

    def reload(_signum: int, _frame: object) -> None:
        line.reload = True

    _tighten_timers()
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGHUP, reload)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    line.run(wake_r)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
