"""Measure a run again when the host disturbed it, keep the best attempt: one rule for one machine and several.

An attempt is disturbed when the host's load says so (testbed.util.hostload: CPU steal, other processes), when
its delay lines were off their delay beyond tolerance (the run did not emulate the asked network: the daemons
lost the CPU) or, with compute as time, when its spans ended late beyond their bound (testbed/run/lateness.py:
the run did not replay the asked compute). A disturbed attempt is measured again up to MAX_REPEATS times; the
best one is kept: links on their delay and spans on time first, then the least CPU lost to others.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Generic, TypeVar

from testbed.run.summary import LinkTiming
from testbed.util.hostload import HostLoad
from testbed.util.interrupts import raise_if_pending

MAX_REPEATS = 1
"""A disturbed run is measured again at most this many times."""

T = TypeVar("T")


@dataclass
class Attempt(Generic[T]):
    """One measurement of a run: what it measured, the host's load over it, its links' timing, where it wrote."""

    value: T
    load: HostLoad
    timing: list[LinkTiming]
    where: Path
    late: list[str] = field(default_factory=list)
    """Compute as time: each stage whose spans' lateness is beyond its bound, and why (ScheduleSummary.late_spans);
    empty: on time."""


def attempt_rank(load: HostLoad, timing: list[LinkTiming], late: list[str] | None = None) -> tuple[bool, float]:
    """How good one attempt was, lower is better: links off their delay or timed spans late first, then the share
    of the CPU other work took. Either makes the attempt disturbed, named in `load.reasons`."""
    off = [t for t in timing if not t.ok]
    if off:
        load.disturbed = True
        load.reasons.append("delay line off its delay: " + ", ".join(
            f"{t.direction} {t.mean_error_s * 1e6:+.0f} us (tolerance {t.tolerance_s * 1e6:.0f} us)" for t in off))
    if late:
        load.disturbed = True
        load.reasons.append("timed spans late: " + "; ".join(late))
    return bool(off or late), load.lost_fraction


def attempt_folder(run_dir: Path, attempt: int) -> Path:
    """Where attempt `attempt` writes: the run's folder, then repeat1, repeat2, ... inside it."""
    return run_dir if attempt == 0 else run_dir / f"repeat{attempt}"


def best_attempt(measure: Callable[[int], Attempt[T]], log: Callable[[str], None],
                 cpu_matters: bool = True) -> tuple[Attempt[T], int]:
    """`measure(attempt)` until an attempt is undisturbed or MAX_REPEATS more were taken; the best attempt and
    how many repeats were taken. With compute as time (`cpu_matters` False) the host's CPU load does not change
    what the run computes, so only links off their delay or spans late make it measure again (the load is still
    recorded)."""
    best: tuple[Attempt[T], tuple[bool, float]] | None = None
    attempt = 0
    for attempt in range(MAX_REPEATS + 1):
        raise_if_pending()
        got = measure(attempt)
        rank = attempt_rank(got.load, got.timing, got.late)
        if best is None or rank < best[1]:
            best = (got, rank)
        if not (rank[0] if not cpu_matters else got.load.disturbed):
            break
        log(f"  host disturbed ({'; '.join(got.load.reasons)})"
            + ("; measuring again" if attempt < MAX_REPEATS else "; kept, marked disturbed"))
    assert best is not None
    return best[0], attempt
