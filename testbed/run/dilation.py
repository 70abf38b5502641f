"""Time dilation (DieCast, NSDI'08) for a machine with fewer cores than the run needs.

Two workers on two cores leave nothing for the delay daemons, gloo's I/O threads and the kernel: each of
them takes its core from a worker's compute whenever it runs, by an amount that depends on the traffic
(testbed/run/breakdown.py measures it: "compute preempted"). Dilation by k removes the competition instead
of measuring it: each worker is capped at 1/k of a core (a cgroup with a CFS bandwidth limit), so the
workers together leave `reserve` cores to everything else; every OTN link runs k times slower (delay x k,
rate / k), so the pipeline sees the same ratio of compute to communication as undilated; and every time
the workers measure is divided by k. What the daemons and I/O threads take then comes out of the reserve,
not out of the compute: a capped worker's progress is its quota whoever else runs.

`k` follows from the caps: k = workers / (cores - reserve); the plan and the summary say why.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from testbed.backends import cgroups
from testbed.backends.base import Backend
from testbed.deploy.linkset import set_link
from testbed.errors import TestbedError
from testbed.plan.model import LinkDirection
from testbed.util.interrupts import cleanup
from workloads.records import IterationRecord, RankTrace, Span

RESERVE_CORES = 0.3
"""What `auto` leaves beside the workers: the delay daemons, gloo's I/O threads, softirqs and the runner took
0.12-0.2 of a core undilated at 1000 km on 2 cores (the breakdown's CPU ledger); dilated by k they need
1/k of that, so 0.3 leaves room for bursts."""
DEFAULT_DILATION = "off"
"""What `testbed run` and `testbed experiment` use unless told (make bench-overhead --compare dilation)."""
MIN_RESERVE_CORES = 0.1
"""A factor that leaves less than this to the rest is refused: it would dilate without relieving anything."""
PERIOD_S = 0.005
"""CFS bandwidth period: a worker computes at most its quota per 5 ms, so an 18 ms forward is throttled a few
times in small slices rather than once for long."""


class DilationError(TestbedError, ValueError):
    """A dilation that cannot be had here (the message says why and what to use)."""


@dataclass(frozen=True, slots=True)
class Dilation:
    """How a run is dilated: k, each worker's cap, and why."""

    factor: float
    """k: 1.0 runs undilated."""
    worker_cores: float
    """Each worker's CPU cap in cores (1/k)."""
    reserve_cores: float
    """Cores the capped workers leave to everything else."""
    period_s: float
    reason: str

    @property
    def on(self) -> bool:
        return self.factor > 1.0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Dilation:
        return cls(**data)


OFF = Dilation(1.0, 1.0, 0.0, PERIOD_S, "off")


def plan_dilation(mode: str, workers: int, cpus: int, timed: bool = False) -> Dilation:
    """`off`, `auto` (k from the caps: workers / (cores - RESERVE_CORES), 1 where cores are to spare) or a
    factor (`1.25`). With compute as time (`timed`) a span takes no CPU, so nothing is capped: k is slow motion,
    every span, delay and transfer k times longer, and the messages' own CPU k times smaller beside them."""
    if mode == "off":
        return OFF
    if timed:
        return _slow_motion(mode, workers, cpus)
    if mode == "auto":
        if workers < cpus:
            return Dilation(1.0, 1.0, float(cpus - workers), PERIOD_S,
                            f"auto: {workers} workers on {cpus} cores leave {cpus - workers} core(s) for the rest: "
                            "nothing competes, no dilation")
        cap = (cpus - RESERVE_CORES) / workers
        return Dilation(1 / cap, cap, RESERVE_CORES, PERIOD_S,
                        f"auto: {workers} workers capped at {cap:.3f} core each leave {RESERVE_CORES:g} of {cpus} "
                        f"cores to the delay daemons, communication threads and kernel: k = {workers} / ({cpus} - "
                        f"{RESERVE_CORES:g}) = {1 / cap:.3f}")
    factor = _factor(mode)
    if factor == 1:
        return OFF
    reserve = cpus - workers / factor
    if reserve < MIN_RESERVE_CORES:
        raise DilationError(f"--dilation {factor:g}: {workers} workers at 1/{factor:g} core each need "
                            f"{workers / factor:.2f} of {cpus} cores, leaving nothing to the rest (less than "
                            f"{MIN_RESERVE_CORES:g} core); use at least {workers / (cpus - MIN_RESERVE_CORES):.2f} (or auto)")
    return Dilation(factor, 1 / factor, reserve, PERIOD_S,
                    f"asked: {workers} workers capped at {1 / factor:.3f} core each leave {reserve:.2f} of {cpus} cores")


def _factor(mode: str) -> float:
    """`--dilation`'s factor: a number of at least 1."""
    try:
        factor = float(mode)
    except ValueError:
        raise DilationError(f"--dilation {mode!r}: use off, auto or a factor such as 1.25") from None
    if factor < 1:
        raise DilationError(f"--dilation {factor:g}: a factor is at least 1 (1 is off)")
    return factor


def _slow_motion(mode: str, workers: int, cpus: int) -> Dilation:
    """Compute as time: `auto` gives each worker's messages the share of the cores one core per worker would
    (k = workers / cores, 1 where they fit); a factor is taken as it is."""
    if mode == "auto":
        factor = max(1.0, workers / cpus)
        reason = f"auto, compute as time: {workers} workers on {cpus} cores, k = {workers} / {cpus}"
    else:
        factor = _factor(mode)
        reason = f"asked, compute as time: k = {factor:g}"
    if factor == 1:
        return OFF
    return Dilation(factor, 1.0, float(cpus), PERIOD_S, reason + " (slow motion: spans, delays and transfers k times "
                    "longer, no worker capped)")


@contextlib.contextmanager
def worker_caps(backend: Backend, dilation: Dilation, workers: int) -> Iterator[list[cgroups.WorkerCap]]:
    """One capped cgroup per worker (in rank order; empty when undilated), recorded in the testbed's state
    before each exists and removed on the way out."""
    if not dilation.on or dilation.worker_cores >= 1.0:      # slow motion (compute as time) caps nothing
        yield []
        return
    controller = cgroups.cpu_controller()
    state = backend.state
    paths = [str(controller.path(f"testbed-{state.name}-w{rank}")) for rank in range(workers)]
    state.cgroups = sorted(set(state.cgroups) | set(paths))
    state.save()
    try:
        yield [cgroups.create_worker_cap(controller, Path(p).name, dilation.worker_cores, dilation.period_s)
               for p in paths]
    finally:
        with cleanup():
            problems = cgroups.remove_all(paths)
            state.cgroups = [p for p in state.cgroups if p not in paths or Path(p).exists()]
            state.save()
            if problems:
                raise cgroups.CgroupError("; ".join(problems))


@contextlib.contextmanager
def dilated_links(backend: Backend, factor: float) -> Iterator[None]:
    """Every OTN direction k times slower (delay x k, jitter x k, rate / k) for the run, restored after it.
    The undilated directions are kept in the state first, so a run killed meanwhile is undone by the next
    (`restore_links`)."""
    if factor <= 1.0:
        yield
        return
    state = backend.state
    restore_links(backend)
    state.undilated = list(state.plan.directions)
    state.save()
    try:
        for d in state.undilated:
            set_link(backend, d.src_dc, d.dst_dc, from_dc=d.src_dc, delay_s=d.delay_s * factor,
                     rate_bps=d.rate_bps / factor, jitter_s=d.jitter_s * factor)
        yield
    finally:
        with cleanup():
            restore_links(backend)


def restore_links(backend: Backend) -> list[LinkDirection]:
    """Put back directions a dilated run left (one that was killed); returns those restored."""
    state = backend.state
    restored = list(state.undilated)
    for d in restored:
        set_link(backend, d.src_dc, d.dst_dc, from_dc=d.src_dc, delay_s=d.delay_s, rate_bps=d.rate_bps,
                 jitter_s=d.jitter_s)
    if restored:
        state.undilated = []
        state.save()
    return restored


def undilate(trace: RankTrace, factor: float) -> RankTrace:
    """A rank's trace in undilated time: every wall-clock time and duration divided by k. CPU seconds stay as
    they are (a worker capped at 1/k of a core and clocked k times slower sees a whole core: one CPU second
    does one second's work); a span's run-queue wait becomes what is left of its undilated wall time beyond
    its CPU and its undilated sleep, so the parts still add up."""
    if factor == 1.0:
        return trace
    k = factor

    def scaled(value: float | None) -> float | None:
        return None if value is None else value / k

    def span(s: Span) -> Span:
        wall = s.end - s.start
        s = dataclasses.replace(s, start=s.start / k, end=s.end / k, late_s=scaled(s.late_s), woke=scaled(s.woke),
                                actual_end=scaled(s.actual_end))
        if s.cpu_s is None or s.runq_s is None:
            return s
        blocked = max(0.0, wall - s.cpu_s - s.runq_s) / k
        return dataclasses.replace(s, runq_s=max(0.0, wall / k - s.cpu_s - blocked))

    def iteration(it: IterationRecord) -> IterationRecord:
        spans = [span(s) for s in it.spans]
        main_runq = None
        if it.main_cpu_s is not None and it.main_runq_s is not None:
            wall = it.end - it.start
            blocked = max(0.0, wall - it.main_cpu_s - it.main_runq_s) / k
            main_runq = max(0.0, wall / k - it.main_cpu_s - blocked)
        return dataclasses.replace(
            it, start=it.start / k, end=it.end / k, spans=spans, memory=[(t / k, v) for t, v in it.memory],
            optimizer_s=scaled(it.optimizer_s), compute_s=sum(s.seconds for s in spans if s.kind in ("F", "B"))
            if it.compute_s is not None else None, wait_s=scaled(it.wait_s), forward_s=scaled(it.forward_s),
            backward_s=scaled(it.backward_s), main_runq_s=main_runq, send_lag_s=[x / k for x in it.send_lag_s],
            recv_lag_s=[x / k for x in it.recv_lag_s])

    sizing = trace.geopipe_sizing
    if sizing is not None:
        sizing = dataclasses.replace(sizing, cover_s=tuple(c / k for c in sizing.cover_s))
    return dataclasses.replace(trace, iterations=[iteration(it) for it in trace.iterations], geopipe_sizing=sizing,
                               reference_compute_s=[r / k for r in trace.reference_compute_s],
                               reference_loaded_s=[r / k for r in trace.reference_loaded_s],
                               compute_spread=[c / k for c in trace.compute_spread],
                               message_cost_s=[c / k for c in trace.message_cost_s], dilation=k)
