"""The OTN edge at the receiving end of each link direction: a finite buffer, and PFC's thresholds and headroom.

A DC-OTN's edge box buffers what the long link delivers and forwards it into the DC at the rate of its DC-side
port (`edge_rate`, the spine port: the link's own rate unless the file says otherwise). Three ways to be lossless
or not (`lossless:` in the topology file):

- `pfc`: a finite buffer; above XOFF the edge sends PAUSE upstream, which stops the sender's port after the
  reverse direction's delay plus a response time; below XON it sends resume. Headroom is what still arrives after
  PAUSE: the pause's trip back, the last byte's trip forward, the response time, at the link's rate, plus one
  largest unit in transmission at each end. A lossless packet is never dropped while XOFF + headroom fits the
  buffer (the loader refuses a file where it does not).
- `queue` (or `true`): a queue deep enough never to drop (sized from the plan); with `edge_rate` below the rate,
  what it holds is queueing delay, measured.
- `false`: no pause; with `buffer` a finite buffer that drops what does not fit (tail drop).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

PFC_RESPONSE_S = 4e-6
"""How long the upstream port takes to act on a PAUSE it received (802.1Qbb allows a few microseconds; Mellanox's
headroom calculators use 3.8-4.5 us at 100G)."""
LARGEST_UNIT_BYTES = 65536 + 45 * 66
"""The largest unit the emulator carries whole: a 64 KiB GSO packet as the delay line sees it, with the Ethernet,
IP and TCP headers its 45 frames carry on the wire. One may be in transmission at each end when PAUSE acts."""
EDGE_MODES = ("pfc", "queue", "drop")


@dataclass(frozen=True, slots=True)
class EdgeSpec:
    """What the topology file asks of a link's two edges (both directions alike)."""

    mode: str
    """`pfc` (finite buffer, pause), `queue` (deep queue, never drops), `drop` (finite buffer, tail drop)."""
    buffer_bytes: int | None = None
    """The edge buffer per direction; None: deep (mode `queue`), or derived (`pfc`: XOFF + headroom, twice)."""
    xoff_bytes: int | None = None
    """Buffer fill above which PAUSE is sent (pfc); None: buffer - headroom."""
    xon_bytes: int | None = None
    """Buffer fill at or below which resume is sent (pfc); None: half of XOFF."""
    drain_rate_bps: float | None = None
    """The edge's DC-side port rate; None: the direction's rate."""


@dataclass(frozen=True, slots=True)
class EdgeDirection:
    """One direction's edge with every value resolved (what the plan states and the delay line enforces)."""

    mode: str
    buffer_bytes: int
    """0: unbounded (mode `queue`)."""
    xoff_bytes: int
    xon_bytes: int
    headroom_bytes: int
    drain_rate_bps: float
    pause_delay_s: float
    """How long a PAUSE takes to reach the upstream port and act: the reverse direction's delay + response."""


def headroom_bytes(rate_bps: float, forward_delay_s: float, reverse_delay_s: float,
                   response_s: float = PFC_RESPONSE_S) -> int:
    """Bytes that still reach the edge after it sends PAUSE: the sender keeps sending until the pause has crossed
    the reverse direction and the sender has acted on it, and what it sent until then is still in the fibre
    ((reverse + forward delay + response) x rate), plus one largest unit in transmission at each end."""
    return math.ceil((reverse_delay_s + forward_delay_s + response_s) * rate_bps / 8) + 2 * LARGEST_UNIT_BYTES


def resolve_edge(spec: EdgeSpec, rate_bps: float, forward_delay_s: float,
            reverse_delay_s: float) -> EdgeDirection:
    """One direction's edge: defaults filled in (not checked; `problems` says what does not fit)."""
    headroom = headroom_bytes(rate_bps, forward_delay_s, reverse_delay_s)
    drain = spec.drain_rate_bps or rate_bps
    pause_delay = reverse_delay_s + PFC_RESPONSE_S
    if spec.mode == "queue":
        return EdgeDirection("queue", 0, 0, 0, headroom, drain, pause_delay)
    if spec.mode == "drop":
        return EdgeDirection("drop", spec.buffer_bytes or 0, 0, 0, headroom, drain, pause_delay)
    xoff = spec.xoff_bytes
    buffer = spec.buffer_bytes
    if buffer is None:
        buffer = 2 * headroom if xoff is None else xoff + headroom
    if xoff is None:
        xoff = buffer - headroom
    xon = spec.xon_bytes if spec.xon_bytes is not None else max(0, xoff // 2)
    return EdgeDirection("pfc", buffer, xoff, xon, headroom, drain, pause_delay)


def edge_problems(edge: EdgeDirection) -> list[tuple[str, str, str]]:
    """(key, problem, fix) for each way this edge cannot hold its promise."""
    found: list[tuple[str, str, str]] = []
    if edge.mode != "pfc":
        return found
    if edge.xoff_bytes > edge.buffer_bytes:
        found.append(("xoff", f"XOFF threshold {edge.xoff_bytes} B is above the buffer ({edge.buffer_bytes} B)",
                      "give an 'xoff' below 'buffer' (or leave it out: buffer - headroom)"))
    elif edge.buffer_bytes - edge.xoff_bytes < edge.headroom_bytes:
        found.append(("buffer", f"headroom cannot fit: {edge.headroom_bytes} B still arrive after PAUSE at this "
                      f"link's rate and delay, the buffer leaves {edge.buffer_bytes - edge.xoff_bytes} B above "
                      f"XOFF ({edge.xoff_bytes} B)",
                      f"raise 'buffer' to at least {edge.xoff_bytes + edge.headroom_bytes} B, or lower 'xoff' to "
                      f"{max(0, edge.buffer_bytes - edge.headroom_bytes)} B"))
    if edge.xoff_bytes <= 0 and edge.buffer_bytes > 0 and not found:
        found.append(("xoff", "XOFF threshold is not above zero", "give a positive 'xoff' or a larger 'buffer'"))
    if edge.xon_bytes >= edge.xoff_bytes and not found:
        found.append(("xon", f"XON threshold {edge.xon_bytes} B is not below XOFF ({edge.xoff_bytes} B)",
                      "give an 'xon' below 'xoff' (or leave it out: half of XOFF)"))
    return found
