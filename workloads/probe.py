"""What one message costs the transport beyond the link's delay and transfer time, measured by the workers
at start-up: a ping-pong of activation-sized messages between every pair of neighbouring ranks, each side's
receive posted before the other sends (as the overlapping schedules post them). GeoPipe's plan and the
analytical model take it as the per-message cost instead of fitting one to a run."""

from __future__ import annotations

import time
from typing import Any

from workloads.records import WorkerConfig

PROBE_TAG = 1 << 24
"""Tags of the message-cost probe: above every schedule's (2 x micro-batch + direction)."""
PROBE_ROUNDS = 10


def probe_message_cost(cfg: WorkerConfig, transport: Any, elements: list[int]) -> list[float]:
    """Per link between stage s and s+1: what one message of the run's size on that link (`elements` float32s)
    costs beyond the configured delay and transfer time, the median of PROBE_ROUNDS ping-pongs (each side's
    receive posted before the other sends, as the overlapping schedules post them). Every rank gets every
    link's figure."""
    import statistics

    import torch
    import torch.distributed as dist

    mine: dict[int, float] = {}
    # One link at a time: with every other link probing at once, a 16-stage pipeline on 2 cores had 8 pairs
    # ping-ponging over 2 cores and read 0.3-1.8 ms a message on 10 Gbit/s fabric links (the CPU's queue, not the
    # link's cost; in the run most stages sleep); alone, each pair has the cores a run gives it.
    for link in range(cfg.world - 1):
        transport.barrier()
        if cfg.rank in (link, link + 1):
            peer = link + 1 if cfg.rank == link else link
            buf, out = torch.zeros(elements[link]), torch.zeros(elements[link])
            size = buf.numel() * buf.element_size()
            samples = []
            pending = transport.irecv(out, peer, PROBE_TAG)
            for i in range(PROBE_ROUNDS + 2):
                t0 = time.monotonic()
                if cfg.rank == link:
                    transport.isend(buf, peer, PROBE_TAG).wait()
                    pending.wait()
                    pending = transport.irecv(out, peer, PROBE_TAG) if i < PROBE_ROUNDS + 1 else None
                else:
                    pending.wait()
                    nxt = transport.irecv(out, peer, PROBE_TAG) if i < PROBE_ROUNDS + 1 else None
                    transport.isend(buf, peer, PROBE_TAG).wait()
                    pending = nxt
                if i >= 2 and cfg.rank == link:           # the first two warm the path up
                    samples.append(time.monotonic() - t0)
            if cfg.rank == link:
                expected = 2 * (cfg.link_delay_s[link] + size * 8 / cfg.link_rate_bps[link])
                mine[link] = (statistics.median(samples) - expected) / 2      # signed: a link can deliver early
    gathered: list[Any] = [None] * cfg.world
    dist.all_gather_object(gathered, mine)
    merged = {k: v for part in gathered for k, v in part.items()}
    return [merged.get(link, 0.0) for link in range(cfg.world - 1)]
