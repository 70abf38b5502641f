"""Shortest-delay paths between datacenters (Dijkstra over per-direction one-way delay)."""

from __future__ import annotations

import heapq

from testbed.topology.model import Topology


def shortest_paths(topology: Topology, src: str) -> dict[str, list[str]]:
    """DC path from `src` to every DC, by least total one-way delay; ties go to fewer hops, then names."""
    best: dict[str, tuple[float, int, list[str]]] = {}
    heap: list[tuple[float, int, list[str]]] = [(0.0, 0, [src])]
    while heap:
        delay, hops, path = heapq.heappop(heap)
        here = path[-1]
        if here in best:
            continue
        best[here] = (delay, hops, path)
        for link in topology.links_of(here):
            nxt = link.other(here)
            if nxt not in best:
                heapq.heappush(heap, (delay + link.direction(here).delay_s, hops + 1, [*path, nxt]))
    return {dst: path for dst, (_, _, path) in best.items()}


def path_delay(topology: Topology, path: list[str]) -> float:
    """Total one-way delay along a DC path."""
    total = 0.0
    for here, nxt in zip(path, path[1:], strict=False):
        link = next(lk for lk in topology.links_of(here) if lk.other(here) == nxt)
        total += link.direction(here).delay_s
    return total


def path_rate(topology: Topology, path: list[str]) -> float:
    """Bottleneck rate along a DC path (inf for a path within one DC)."""
    rate = float("inf")
    for here, nxt in zip(path, path[1:], strict=False):
        link = next(lk for lk in topology.links_of(here) if lk.other(here) == nxt)
        rate = min(rate, link.direction(here).rate_bps)
    return rate
