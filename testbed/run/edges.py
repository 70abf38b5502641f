"""What each OTN edge did during one run (pauses, pause time, buffer peak, drops), for summary.json."""

from __future__ import annotations

from typing import Any

from testbed.plan.model import LinkDirection
from testbed.shaping.otn_edge import EdgeCounters


def edge_during(direction: LinkDirection, before: dict[str, EdgeCounters],
                after: dict[str, EdgeCounters]) -> dict[str, Any] | None:
    """The direction's edge over the run: counters as differences, the buffer's peak since the link came up
    beside its XOFF and headroom (a PFC edge holds its promise while peak <= XOFF + headroom). None: no edge."""
    edge, end = direction.edge, after.get(direction.label)
    if edge is None or end is None:
        return None
    start = before.get(direction.label, EdgeCounters())
    return {"mode": edge.mode, "pauses": end.pauses - start.pauses, "pause_s": end.pause_s - start.pause_s,
            "drops": end.drops - start.drops, "lossy_drops": end.lossy_drops - start.lossy_drops,
            "buffer_peak_bytes": end.buffer_peak_bytes, "buffer_bytes": edge.buffer_bytes,
            "xoff_bytes": edge.xoff_bytes, "headroom_bytes": edge.headroom_bytes,
            "queue_delay_max_s": end.queue_delay_max_s, "drain_rate_bps": edge.drain_rate_bps}
