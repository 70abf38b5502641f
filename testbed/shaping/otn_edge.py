"""The OTN edge as the delay line enforces it: the upstream port, the fibre, and the receiving edge's buffer.

Each packet the delay line takes (when the sender's rate limiter let it go) goes through three stages, in
order, on one timeline computed when it arrives:

1. the upstream port sends it when it is free and not paused (a paused port holds every packet behind the
   first: head-of-line blocking, one FIFO for all traffic on the direction);
2. the fibre carries it for the direction's hold (delay + its own serialization at the link's rate);
3. the edge buffer forwards it into the DC at the edge's rate (its DC-side port), after what is ahead of it.

With PFC, a packet that takes the buffer above XOFF makes the edge send PAUSE; it stops the upstream port
`pause_delay_s` later (the reverse direction's delay + response). The port resumes `pause_delay_s` after the
buffer drains to XON. Where a packet does not fit the buffer it is dropped: lossy traffic (DSCP CS1, TOS 0x20)
above XOFF, anything above the buffer (a PFC link that drops a lossless packet has failed its promise, counted as
`drops`). Release times never decrease, so the delay line's order-keeping batch verdicts still hold.

The timeline is exact for the packets it sees: everything the pause decision needs (what reached the buffer
before the pause acts) has arrived before the first packet that waits for it. The sender's own qdisc does not
fill during a pause (its rate limiter keeps sending into the delay line, which holds the packets as the paused
port would); the sender's TCP sees the same timing.
"""

from __future__ import annotations

from collections import deque
from dataclasses import asdict, dataclass
from typing import Any

LOSSY_TOS = 0x20
"""DSCP CS1 ("lower effort", RFC 8622): the class an edge may drop (background traffic marked lossy)."""


@dataclass(frozen=True, slots=True)
class EdgeConfig:
    """One direction's edge, resolved (from the plan's EdgeDirection)."""

    mode: str
    """`pfc`, `queue` or `drop`."""
    line_rate_bps: float
    drain_rate_bps: float
    buffer_bytes: int
    """0: unbounded."""
    xoff_bytes: int = 0
    xon_bytes: int = 0
    headroom_bytes: int = 0
    pause_delay_s: float = 0.0

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> EdgeConfig | None:
        return None if data is None else cls(**data)


@dataclass(slots=True)
class EdgeCounters:
    """What one edge did since the daemon started (in the daemon's statistics file, per queue)."""

    pauses: int = 0
    """PAUSE episodes (XOFF sent, later XON)."""
    pause_s: float = 0.0
    """Total time the upstream port sat paused."""
    buffer_peak_bytes: int = 0
    drops: int = 0
    """Lossless packets dropped at the buffer (a PFC link: must stay 0)."""
    lossy_drops: int = 0
    queue_delay_max_s: float = 0.0
    """Longest wait in the edge buffer."""
    bytes_in: int = 0
    buffer_now_bytes: int = 0
    """What the buffer held when the statistics were written (packets that have reached it, not yet forwarded)."""
    buffer_interval_peak_bytes: int = 0
    """The buffer's peak since the statistics were written before (a time series of occupancy, sampled whole)."""
    at_s: float = 0.0
    """When these counters were written (the daemon's monotonic clock: the system's, as every process reads it)."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(slots=True)
class _Buffered:
    arrive: float
    depart: float
    size: int


class OtnEdge:
    """One direction's upstream port, fibre and edge buffer, on the delay line's clock."""

    def __init__(self, config: EdgeConfig) -> None:
        self.config = config
        self.counters = EdgeCounters()
        self.port_free = float("-inf")
        self.last_depart = float("-inf")
        self.buffer: deque[_Buffered] = deque()
        self.buffered_bytes = 0
        self.pause_at: float | None = None
        """When the pending PAUSE stops the upstream port (XOFF sent, resume not yet worked out)."""
        self.xoff_sent_at = 0.0
        self.pause_log: list[_Buffered] | None = None
        """While a pause is pending: what the buffer held when XOFF was sent, and everything admitted since."""
        self.paused_from = float("inf")
        self.resume_at = float("-inf")
        """The last pause the upstream port took: [paused_from, resume_at)."""

    def admit(self, arrival: float, size: int, hold_s: float, lossy: bool = False) -> float | None:
        """When the packet leaves the edge into the DC (its release), or None: dropped at the buffer.
        `size`: its bytes on the wire; `hold_s`: the fibre's hold (delay + serialization) for it."""
        cfg = self.config
        start = max(arrival, self.port_free)
        if self.pause_at is not None and start >= self.pause_at:
            self._resolve_pause()
        if self.paused_from <= start < self.resume_at:
            start = self.resume_at
        self.port_free = start + size * 8 / cfg.line_rate_bps
        at_edge = start + hold_s
        self._forget_departed(at_edge)
        limit = cfg.buffer_bytes if not (lossy and cfg.mode == "pfc") else cfg.xoff_bytes
        if cfg.buffer_bytes and self.buffered_bytes + size > limit:
            if lossy:
                self.counters.lossy_drops += 1
            else:
                self.counters.drops += 1
            return None
        depart = max(at_edge, self.last_depart + size * 8 / cfg.drain_rate_bps)
        self.last_depart = depart
        entry = _Buffered(at_edge, depart, size)
        self.buffer.append(entry)
        self.buffered_bytes += size
        if self.pause_log is not None:
            self.pause_log.append(entry)
        c = self.counters
        c.bytes_in += size
        c.buffer_peak_bytes = max(c.buffer_peak_bytes, self.buffered_bytes)
        c.buffer_interval_peak_bytes = max(c.buffer_interval_peak_bytes, self.buffered_bytes)
        c.queue_delay_max_s = max(c.queue_delay_max_s, depart - at_edge)
        if cfg.mode == "pfc" and self.pause_at is None and self.buffered_bytes > cfg.xoff_bytes \
                and at_edge >= self.resume_at - cfg.pause_delay_s:
            self.pause_at = at_edge + cfg.pause_delay_s
            self.xoff_sent_at = at_edge
            self.pause_log = list(self.buffer)
            c.pauses += 1
        return depart

    def snapshot(self, now: float) -> dict[str, Any]:
        """The counters at `now`, for the statistics file: a settled pause, the buffer's occupancy now and its peak
        since the last snapshot (which starts again from now)."""
        self.settle(now)
        c = self.counters
        c.buffer_now_bytes = sum(e.size for e in self.buffer if e.arrive <= now < e.depart)
        c.buffer_interval_peak_bytes = max(c.buffer_interval_peak_bytes, c.buffer_now_bytes)
        c.at_s = now
        data = c.to_json()
        c.buffer_interval_peak_bytes = c.buffer_now_bytes
        return data

    def settle(self, now: float, quiet_s: float = 0.1) -> None:
        """Account a pending pause that no later packet has resolved (traffic stopped behind it), once `quiet_s`
        has passed since it acted (every packet sent before it has reached the daemon by then)."""
        if self.pause_at is not None and now >= self.pause_at + quiet_s:
            self._resolve_pause()

    def _forget_departed(self, now: float) -> None:
        while self.buffer and self.buffer[0].depart <= now:
            self.buffered_bytes -= self.buffer.popleft().size

    def _resolve_pause(self) -> None:
        """The pending pause has stopped the port, and every packet sent before it is known: work out when the
        buffer drains to XON (the edge sends resume then) and when the port hears it."""
        assert self.pause_at is not None
        xon_at = self._drained_to(self.config.xon_bytes, self.xoff_sent_at)
        self.paused_from = self.pause_at
        self.resume_at = max(self.pause_at, xon_at + self.config.pause_delay_s)
        self.counters.pause_s += self.resume_at - self.paused_from
        self.pause_at = None
        self.pause_log = None

    def _drained_to(self, level: int, after: float) -> float:
        """The first time at or after `after` that the buffer holds at most `level` bytes, given what it holds and
        what is on its way into it (arrivals and departures are each in time order)."""
        entries = self.pause_log or []
        held = 0
        i = 0
        for entry in entries:
            while i < len(entries) and entries[i].arrive <= entry.depart:
                held += entries[i].size
                i += 1
            held -= entry.size
            if entry.depart >= after and held <= level:
                return entry.depart
        return entries[-1].depart if entries else after
