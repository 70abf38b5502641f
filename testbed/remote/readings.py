"""What the machines report around a run: CPU steal and run queue (one HostLoad definition with the single
machine), drops on the egress leaves and the delay lines, and the delay lines' hold counters per direction."""

from __future__ import annotations

import time
from typing import Any

from testbed.remote.fleet import Fleet
from testbed.remote.inventory import Machine
from testbed.remote.replies import CountersReply, LoadReply, RttReply
from testbed.shaping.delayline import STATS_INTERVAL_S
from testbed.util.hostload import STEAL_BOUND, HostLoad, steal_fraction

Pair = tuple[str, str]


def loads(fleet: Fleet, machines: list[Machine]) -> dict[str, LoadReply]:
    return {m.name: fleet.agent(m, LoadReply, "load") for m in machines}


def host_load(fleet: Fleet, machines: list[Machine], before: dict[str, LoadReply], wall_s: float) -> HostLoad:
    """Per machine, steal over the run from /proc/stat (other processes cannot be told from the workers on a
    remote machine: foreign_fraction is not measured there and stays 0). The worst machine's figures."""
    after = loads(fleet, machines)
    steal, queue, reasons = 0.0, [], []
    for m in machines:
        part = steal_fraction(before[m.name].cpu, after[m.name].cpu)
        steal = max(steal, part)
        queue.append(after[m.name].procs_running)
        if part > STEAL_BOUND:
            reasons.append(f"{m.name}: CPU steal {part:.1%} > {STEAL_BOUND:.0%}")
    return HostLoad(wall_s=wall_s, steal_fraction=steal, foreign_fraction=0.0,
                    run_queue_mean=sum(queue) / len(queue), run_queue_max=max(queue), daemon_cpu_fraction=None,
                    disturbed=bool(reasons), reasons=reasons, foreign_measured=False)


def counters(fleet: Fleet, shaped: set[str]) -> tuple[dict[Pair, int], dict[Pair, tuple[int, float]]]:
    """Per (src DC, dst DC), over the shaped machines: drops so far (senders' egress leaves, receivers' delay
    line gaps), and the receivers' delay-line releases so far with their summed release error (seconds)."""
    drops: dict[Pair, int] = {}
    holds: dict[Pair, tuple[int, float]] = {}
    for m in fleet.inventory.machines:
        if m.name not in shaped:
            continue
        counts = fleet.agent(m, CountersReply, "counters", fleet.testbed, m.name, root=True)
        for dc, n in counts.egress.items():
            drops[(m.dc, dc)] = drops.get((m.dc, dc), 0) + max(0, n)
        for dc, n in counts.ingress.items():
            drops[(dc, m.dc)] = drops.get((dc, m.dc), 0) + max(0, n)
        for dc, (released, error_s) in counts.holds.items():
            was = holds.get((dc, m.dc), (0, 0.0))
            holds[(dc, m.dc)] = (was[0] + int(released), was[1] + float(error_s))
    return drops, holds


def holds_by_label(plan: Any, holds: dict[Pair, tuple[int, float]]) -> dict[str, tuple[int, float]]:
    """The hold counters per direction label (what runner.link_timing takes)."""
    return {d.label: holds[(d.src_dc, d.dst_dc)] for d in plan.directions if (d.src_dc, d.dst_dc) in holds}


BASELINE_PINGS = 20
"""Pings per DC pair whose releases give each direction's baseline release error (both ways: the echo and its
reply are each held once)."""


def baseline_lateness(fleet: Fleet, plan: Any, shaped: set[str]) -> dict[str, float]:
    """Per direction label, the delay lines' mean release error over a round of pings between each DC pair's
    first machines, with nothing else running: what one machine absorbs into its holds while calibrating and
    several machines' runs are judged against (a run's link timing is its own lateness beyond this)."""
    time.sleep(STATS_INTERVAL_S)                  # the daemons' statistics cover whatever ran before
    before = holds_by_label(plan, counters(fleet, shaped)[1])
    firsts = list(fleet.first_per_dc().values())
    for i, a in enumerate(firsts):
        for b in firsts[i + 1:]:
            fleet.agent(a, RttReply, "rtt", b.data_address, "--count", str(BASELINE_PINGS), root=True)
    time.sleep(STATS_INTERVAL_S)
    after = holds_by_label(plan, counters(fleet, shaped)[1])
    out = {}
    for label, (released, error_s) in after.items():
        was = before.get(label, (0, 0.0))
        if released > was[0]:
            out[label] = (error_s - was[1]) / (released - was[0])
    return out
