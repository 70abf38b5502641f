"""Where a step's time went, per stage, and who used the machine's CPU meanwhile: the testbed's own cost,
measured rather than guessed.

Per stage, over the steady iterations (means, so the parts add up to the step exactly):

    step = reference                 the stage's F+B alone (workloads/reference.py), measured in the same run
                                     before and after its iterations (their mean), in CPU time: what the
                                     compute needs, whatever else shared its core while the reference ran (a
                                     reference that waited would otherwise lend the run a negative cost)
         + compute_cpu_excess        its F/B spans ran more CPU than alone (caches, softirqs served in its
                                     context): the run's own cost, never negative
         + host_drift                its F/B spans ran less CPU than alone: the host ran faster during the run
                                     than at its reference (never positive; not a saving, the host's drift)
         + compute_preempted         its F/B spans sat on the run queue: other threads had its core
         + compute_blocked           its F/B spans slept (page faults, locks)
         + waiting                   blocked on a receive or the final sends, of which `ideal_wait` is what
                                     the schedule must wait with this compute on the configured links
                                     (the simulator, no per-message cost) and the rest is the transport's and
                                     the emulator's cost beyond the configured link
         + executor                  the executor's own work between spans (posting, allocating, accounting)
         + skew                      the step is the first stage's start to the last end over every stage; this
                                     stage's share of it outside its own iteration, of which `ideal_tail` is the
                                     time the ideal pipeline also ends this stage before the last one

`ideal_step` is the simulator's step with the reference compute (CPU time) and the configured links: what the step
would be if the testbed cost nothing; `overhead = step - ideal_step` is the apparatus's cost.

The CPU ledger (whole machine, per step): the workers' compute, the executor, each kind of worker thread
(gloo's I/O loop, ...), each watched group (delay daemons, the runner), the rest of the busy time (kernel,
softirqs in idle context, other processes), steal and idle, from the workers' per-iteration readings
(workloads/threadclock.py, workloads/hostcpu.py).
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from typing import Any

from testbed.run.lateness import SpanLateness, span_lateness
from testbed.util import table
from workloads import schedule as S
from workloads.records import IterationRecord, RankTrace, start_offsets
from workloads.simulate import Costs, Deadlock, simulate

COMPONENTS = ("compute_cpu_excess_s", "compute_preempted_s", "compute_blocked_s", "wait_beyond_ideal_s",
              "executor_s", "skew_beyond_ideal_s")
"""The parts of a step beyond the ideal pipeline, in the order tables show them."""
LABELS = {
    "compute_cpu_excess_s": "compute ran slower than alone (CPU)",
    "compute_preempted_s": "compute preempted (run queue)",
    "compute_blocked_s": "compute blocked (slept)",
    "wait_beyond_ideal_s": "waiting beyond the ideal pipeline",
    "executor_s": "executor between spans",
    "skew_beyond_ideal_s": "end skew beyond the ideal pipeline's",
}


@dataclass(kw_only=True, slots=True)
class StageBreakdown:
    """One stage's mean step, split (seconds per step)."""

    stage: int
    step_s: float
    reference_s: float
    """The stage's F+B alone per step, CPU time (wall time for traces without it and for compute as time)."""
    compute_cpu_excess_s: float
    """Its spans' CPU beyond the reference's, never negative (the run's own cost)."""
    compute_preempted_s: float
    compute_blocked_s: float
    wait_s: float
    ideal_wait_s: float | None
    executor_s: float
    executor_cpu_s: float
    """Of `executor_s`, the main thread's CPU (the rest is its run-queue wait and sleep)."""
    skew_s: float
    ideal_tail_s: float | None = None
    """In the ideal pipeline, the time this stage ends before the last one (its share of the step it idles)."""
    compute_cpu_s: float | None = None
    """CPU the stage's F/B spans ran per step."""
    reference_cpu_s: float | None = None
    """CPU the reference pass ran (the thread's own, whatever shared the core)."""
    host_drift_s: float = 0.0
    """Its spans' CPU short of the reference's, never positive: the host ran faster than at its reference."""
    reference_wall_s: float | None = None
    """The reference's wall time (what the bubble's yardstick uses): beyond `reference_s` it waited for a core."""
    late_s: float | None = None
    """Compute as time: how late the spans' wake-ups were, summed per step (a later span still starts at its
    predecessor's deadline, so this is not added to the step; it shows in the executor's and the waits' parts
    only where a wake-up came after the next message)."""
    lateness: SpanLateness | None = None
    """Compute as time: the spans' lateness, median / p99 / worst, and whether it is within its bound
    (testbed/run/lateness.py)."""

    @property
    def compute_slowdown(self) -> float | None:
        """The spans' CPU over the reference's CPU, less 1: how much slower the compute ran than alone, in CPU
        time (preemption and oversubscription are not in it; the host's drift over the run is measured apart,
        from the reference before and after)."""
        if not self.compute_cpu_s or not self.reference_cpu_s:
            return None
        return self.compute_cpu_s / self.reference_cpu_s - 1

    @property
    def wait_beyond_ideal_s(self) -> float:
        """Its waits beyond those of the ideal pipeline."""
        return self.wait_s - (self.ideal_wait_s or 0.0)

    @property
    def skew_beyond_ideal_s(self) -> float:
        """The step beyond this stage's own iteration, less what the ideal pipeline has there too (a stage that
        ends before the last one idles for the rest of the step in any pipeline: its tail)."""
        return self.skew_s - (self.ideal_tail_s or 0.0)

    def component(self, name: str) -> float:
        return float(getattr(self, name))

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "wait_beyond_ideal_s": self.wait_beyond_ideal_s,
                "skew_beyond_ideal_s": self.skew_beyond_ideal_s, "compute_slowdown": self.compute_slowdown,
                "lateness": self.lateness.to_json() if self.lateness else None}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> StageBreakdown:
        late = data.get("lateness")
        return cls(**{k: v for k, v in data.items()
                      if k not in ("wait_beyond_ideal_s", "skew_beyond_ideal_s", "compute_drift",
                                   "compute_slowdown", "lateness")},
                   lateness=SpanLateness.from_json(late) if late else None)


@dataclass(kw_only=True, slots=True)
class CpuShare:
    """One consumer of the machine's CPU, per step."""

    name: str
    cpu_s: float
    """CPU seconds per step (all cores together)."""
    fraction: float
    """Of the machine's capacity (cores x step)."""
    runq_s: float | None = None
    """Time its threads waited runnable for a core, per step (workers' threads only)."""


@dataclass(kw_only=True, slots=True)
class Breakdown:
    """A schedule's step, split per stage, the machine's CPU ledger, and the contributors ranked."""

    stages: list[StageBreakdown]
    step_s: float
    """Mean step over the steady iterations (the parts add up to it; the summary's step is the median)."""
    ideal_step_s: float | None
    """The simulator's step with the reference compute and the configured links: the testbed costing nothing."""
    cpu: list[CpuShare] = field(default_factory=list)
    cpus: int = 0
    cores_ideal_step_s: float | None = None
    """The ideal pipeline on these cores: the same simulation with each stage's compute as measured while one
    step's messages cross alongside with no schedule (RankTrace.reference_loaded_s, the least of its passes):
    the messages' CPU (gloo's threads, the kernel's path, softirqs) must share the cores with the compute, in
    any schedule. None: not measured (compute as time, traces of older releases)."""
    cores_base_step_s: float | None = None
    """What the cores' ideal step is compared with: the same simulation on each stage's clean reference in wall
    time, the stated yardstick (the mean of its passes; the loaded one is wall time too, its least pass: the
    comparison leans towards the testbed's own cost, never towards the cores'). The ideal step's reference is CPU
    time."""

    @property
    def overhead_s(self) -> float | None:
        return None if self.ideal_step_s is None else self.step_s - self.ideal_step_s

    @property
    def cores_cannot_lose_s(self) -> float | None:
        """Of the own cost, the cores' share: the ideal pipeline on these cores beyond the ideal pipeline, at most
        the own cost (a schedule with idle time can serve some messages there) and never negative."""
        base = self.ideal_step_s if self.cores_base_step_s is None else self.cores_base_step_s
        if self.cores_ideal_step_s is None or base is None or self.overhead_s is None:
            return None
        return min(max(0.0, self.overhead_s), max(0.0, self.cores_ideal_step_s - base))

    @property
    def own_beyond_cores_s(self) -> float | None:
        """The own cost beyond the cores' share: the testbed's (executor, waits, preemption beyond the messages')."""
        share = self.cores_cannot_lose_s
        return None if share is None or self.overhead_s is None else self.overhead_s - share

    def ranked(self) -> list[tuple[str, float]]:
        """The parts beyond the ideal pipeline, mean over stages, largest first (seconds per step)."""
        means = [(name, statistics.mean(s.component(name) for s in self.stages)) for name in COMPONENTS]
        return sorted(means, key=lambda item: -item[1])

    def to_json(self) -> dict[str, Any]:
        return {"stages": [s.to_json() for s in self.stages], "step_s": self.step_s, "ideal_step_s": self.ideal_step_s,
                "overhead_s": self.overhead_s, "cpu": [asdict(c) for c in self.cpu], "cpus": self.cpus,
                "cores_ideal_step_s": self.cores_ideal_step_s, "cores_base_step_s": self.cores_base_step_s,
                "cores_cannot_lose_s": self.cores_cannot_lose_s,
                "own_beyond_cores_s": self.own_beyond_cores_s,
                "ranked": [[name, value] for name, value in self.ranked()]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Breakdown:
        return cls(stages=[StageBreakdown.from_json(s) for s in data["stages"]], step_s=data["step_s"],
                   ideal_step_s=data.get("ideal_step_s"), cpu=[CpuShare(**c) for c in data.get("cpu", [])],
                   cpus=int(data.get("cpus", 0)), cores_ideal_step_s=data.get("cores_ideal_step_s"),
                   cores_base_step_s=data.get("cores_base_step_s"))


def step_of(its: list[IterationRecord]) -> float:
    """One iteration's step over its ranks (rank order): from the first stage's start to the last end. The first
    stage needs no input, so the pipeline starts with it; a rank let out of the start barrier earlier (the barrier
    crosses the emulated links: up to tens of ms apart) only waits for its first input, and one let out later
    shows in the ends."""
    return max(it.end for it in its) - its[0].start


def breakdown(ranks: list[RankTrace], link_delay_s: list[float], link_rate_bps: list[float],
              receiver_driven: bool = True) -> Breakdown | None:
    """The breakdown of one schedule's run from its rank traces; None where the ranks recorded no per-span
    clocks (PyTorch's schedules, traces of older releases)."""
    steady = [i for i, it in enumerate(ranks[0].iterations) if not it.warmup]
    if not steady or not all(_instrumented(r.iterations[i]) for r in ranks for i in steady) \
            or not all(r.reference_compute_s for r in ranks):
        return None
    steps = [step_of([r.iterations[i] for r in ranks]) for i in steady]
    origins = [ranks[0].iterations[i].start for i in steady]
    step = statistics.mean(steps)
    stages = [_stage(r, [r.iterations[i] for i in steady], steps, origins) for r in ranks]
    ideal = _ideal(ranks, [st.reference_s for st in stages], link_delay_s, link_rate_bps, receiver_driven)
    cores = base = None
    if all(r.reference_loaded_s for r in ranks):      # wall against wall: the loaded pass's least, the stated yardstick
        cores = _ideal(ranks, [min(r.reference_loaded_s) for r in ranks], link_delay_s, link_rate_bps, receiver_driven)
        base = _ideal(ranks, [statistics.mean(r.reference_compute_s) for r in ranks], link_delay_s, link_rate_bps,
                      receiver_driven)
    result = Breakdown(stages=stages, step_s=step, ideal_step_s=ideal.iteration_s if ideal else None,
                       cpu=_ledger(ranks, steady), cpus=_cpus(ranks, steady),
                       cores_ideal_step_s=cores.iteration_s if cores else None,
                       cores_base_step_s=base.iteration_s if base else None)
    if ideal is not None:
        for s, st in enumerate(stages):
            st.ideal_wait_s = ideal.exposed_comm_s[s]
            st.ideal_tail_s = ideal.iteration_s - ideal.end_s[s]
    return result


def _instrumented(it: IterationRecord) -> bool:
    return bool(it.spans) and all(s.cpu_s is not None for s in it.spans) and it.main_cpu_s is not None


def _stage(rank: RankTrace, its: list[IterationRecord], steps: list[float], origins: list[float]) -> StageBreakdown:
    """One stage's parts over its iterations; time before the step's origin (the first stage's start) is not in
    the step, so a wait that began before it counts from it."""
    def mean(values: list[float]) -> float:
        return statistics.mean(values)

    compute = [[s for s in it.spans if s.kind in ("F", "B")] for it in its]
    waits = [[s for s in it.spans if s.kind.startswith("wait")] for it in its]
    wall = mean([sum(s.seconds for s in c) for c in compute])
    cpu = mean([sum(s.cpu_s or 0.0 for s in c) for c in compute])
    runq = mean([sum(s.runq_s or 0.0 for s in c) for c in compute])
    wait = mean([sum(max(0.0, s.end - max(s.start, o)) for s in w) for w, o in zip(waits, origins, strict=True)])
    wait_cpu = mean([sum(s.cpu_s or 0.0 for s in w) for w in waits])
    own = mean([it.end - max(it.start, o) for it, o in zip(its, origins, strict=True)])
    reference = statistics.mean(rank.reference_compute_s)      # this run's own: before and after its iterations
    if rank.config.timed:       # compute as time: a span is the device's interval from the table, no CPU in it
        return StageBreakdown(
            stage=rank.rank, step_s=mean(steps), reference_s=reference, compute_cpu_excess_s=max(0.0, wall - reference),
            host_drift_s=min(0.0, wall - reference), reference_wall_s=reference,
            compute_preempted_s=0.0, compute_blocked_s=0.0, wait_s=wait, ideal_wait_s=None,
            executor_s=own - wall - wait, executor_cpu_s=mean([it.main_cpu_s or 0.0 for it in its]) - cpu - wait_cpu,
            skew_s=mean(steps) - own, compute_cpu_s=None, reference_cpu_s=None,
            late_s=mean([sum(s.lateness_s or 0.0 for s in c) for c in compute]), lateness=span_lateness(its))
    reference_cpu = statistics.mean(rank.reference_cpu_s) if rank.reference_cpu_s else None
    floor = reference_cpu if reference_cpu else reference      # the compute's own need (see the module's account)
    return StageBreakdown(
        stage=rank.rank, step_s=mean(steps), reference_s=floor, compute_cpu_excess_s=max(0.0, cpu - floor),
        host_drift_s=min(0.0, cpu - floor), compute_preempted_s=runq, compute_blocked_s=wall - cpu - runq,
        wait_s=wait, ideal_wait_s=None, executor_s=own - wall - wait,
        executor_cpu_s=mean([it.main_cpu_s or 0.0 for it in its]) - cpu - wait_cpu, skew_s=mean(steps) - own,
        compute_cpu_s=cpu, reference_cpu_s=reference_cpu, reference_wall_s=reference)


def _ideal(ranks: list[RankTrace], reference_s: list[float], link_delay_s: list[float],
           link_rate_bps: list[float], receiver_driven: bool) -> Any:
    """The schedule the ranks ran (in the order they posted it), simulated with each stage's reference compute
    per step (split into F and B as its spans were) on the configured links, each stage starting as it did
    against stage 0 (the start barrier), with no per-message or executor cost."""
    try:
        schedule = [S.posting_order([S.Action.parse(a) for a in r.actions], r.posted_receives_first) for r in ranks]
    except ValueError:
        return None
    if not all(schedule):
        return None
    fwd, bwd = [], []
    for r, reference in zip(ranks, reference_s, strict=True):
        f = statistics.mean(it.forward_s or 0.0 for it in r.steady)
        b = statistics.mean(it.backward_s or 0.0 for it in r.steady)
        per_mb = reference / max(1, r.config.microbatches)
        share = f / (f + b) if f + b > 0 else 0.5
        fwd.append(per_mb * share)
        bwd.append(per_mb * (1 - share))
    table = ranks[0].config.cost_table
    bytes_per_s = [r / 8 * (table.scale(s) if table else 1.0) for s, r in enumerate(link_rate_bps)]
    costs = Costs(fwd, bwd, list(link_delay_s), bytes_per_s, int(ranks[0].activation_bytes or 0),
                  0, 0.0, None, receiver_driven=receiver_driven, start_s=start_offsets(ranks))
    try:
        return simulate(schedule, costs)
    except Deadlock:
        return None


def _cpus(ranks: list[RankTrace], steady: list[int]) -> int:
    hosts = [ranks[0].iterations[i].host for i in steady]
    return hosts[0].cpus if hosts and hosts[0] is not None else 0


def _ledger(ranks: list[RankTrace], steady: list[int]) -> list[CpuShare]:
    """Who used the machine's CPU per iteration: rank 0's host readings for the machine, every rank's threads for
    the workers (each rank's own window: they overlap to within the skew)."""
    hosts = [ranks[0].iterations[i].host for i in steady]
    if not hosts or any(h is None for h in hosts):
        return []
    n = len(steady)
    wall = sum(h.wall_s for h in hosts if h is not None) / n
    cpus = hosts[0].cpus if hosts[0] is not None else 1
    capacity = wall * cpus
    shares: dict[str, list[float]] = {}

    def add(name: str, cpu: float, runq: float | None = None) -> None:
        entry = shares.setdefault(name, [0.0, 0.0 if runq is not None else -1.0])
        entry[0] += cpu / n
        if runq is not None:
            entry[1] = max(entry[1], 0.0) + runq / n

    for r in ranks:
        for i in steady:
            it = r.iterations[i]
            spans_cpu = sum(s.cpu_s or 0.0 for s in it.spans if s.kind in ("F", "B"))
            spans_runq = sum(s.runq_s or 0.0 for s in it.spans if s.kind in ("F", "B"))
            add("workers: compute (F/B spans)", spans_cpu, spans_runq)
            add("workers: executor and waits", (it.main_cpu_s or 0.0) - spans_cpu, (it.main_runq_s or 0.0) - spans_runq)
            for t in it.threads:
                if t.name != "main":
                    add(f"workers: {t.name} threads", t.cpu_s, t.runq_s)
    for h in hosts:
        assert h is not None
        for name, cpu in h.groups.items():
            add(name, cpu)
    attributed = sum(v[0] for v in shares.values())
    states = {k: sum(h.states.get(k, 0.0) for h in hosts if h is not None) / n
              for k in ("idle", "iowait", "steal", "softirq")}
    busy = capacity - states["idle"] - states["iowait"] - states["steal"]
    # already per iteration: add() divides by n again
    add("kernel and other processes (busy, not attributed)", n * max(0.0, busy - attributed))
    add("steal (hypervisor)", n * states["steal"])
    add("idle", n * (states["idle"] + states["iowait"]))
    result = [CpuShare(name=name, cpu_s=v[0], fraction=v[0] / capacity if capacity else 0.0,
                       runq_s=None if v[1] < 0 else v[1]) for name, v in shares.items()]
    result.append(CpuShare(name="of which softirq (tick-sampled, also in the threads it interrupted)",
                           cpu_s=states["softirq"], fraction=states["softirq"] / capacity if capacity else 0.0))
    return result


def render(name: str, split: Breakdown) -> str:
    """The step split per stage (ms per step, parts beyond the ideal pipeline ranked) and the CPU ledger."""
    ms = lambda v: f"{v * 1e3:+.0f}" if v is not None else "-"           # noqa: E731
    stages = split.stages
    head = ["part of the step (ms)", *(f"stage {s.stage}" for s in stages), "mean"]
    rows: list[list[object]] = [["step", *(f"{s.step_s * 1e3:.0f}" for s in stages), f"{split.step_s * 1e3:.0f}"],
                                ["reference compute (alone)", *(f"{s.reference_s * 1e3:.0f}" for s in stages), ""],
                                ["ideal waiting (schedule + links)",
                                 *(ms((s.ideal_wait_s or 0) + (s.ideal_tail_s or 0)) for s in stages), ""]]
    for part, mean in split.ranked():
        rows.append([LABELS[part], *(ms(s.component(part)) for s in stages), ms(mean)])
    if any(s.host_drift_s for s in stages):
        rows.append(["the host ran faster than at its reference (drift, not a saving)",
                     *(ms(s.host_drift_s) for s in stages), ms(statistics.mean(s.host_drift_s for s in stages))])
    if any(s.lateness for s in stages):
        rows.append(["timed spans' lateness (us): median / p99 / worst", *(_late_cell(s.lateness) for s in stages), ""])
    ideal = (f"ideal step {split.ideal_step_s * 1e3:.0f} ms, measured {split.step_s * 1e3:.0f} ms: the testbed's own "
             f"cost {split.overhead_s * 1e3:+.0f} ms ({split.overhead_s / split.step_s:.1%} of the step)"
             if split.ideal_step_s is not None and split.overhead_s is not None else "no ideal step (not simulated)")
    if split.cores_ideal_step_s is not None and split.cores_cannot_lose_s is not None:
        ideal += (f"; on these cores, with the step's messages crossing beside the compute, the ideal step is "
                  f"{split.cores_ideal_step_s * 1e3:.0f} ms: {split.cores_cannot_lose_s * 1e3:.0f} ms of the own cost "
                  f"no schedule on these cores can lose")
    out = [table.render(head, rows, title=f"{name}: where the step went ({ideal})")]
    if split.cpu:
        out.append(table.render(
            ["who used the CPU (per iteration)", "CPU ms", f"of {split.cpus} cores", "waited for a core ms"],
            [[c.name, f"{c.cpu_s * 1e3:.0f}", f"{c.fraction:.1%}", "" if c.runq_s is None else f"{c.runq_s * 1e3:.0f}"]
             for c in split.cpu]))
    return "\n\n".join(out)


def _late_cell(late: SpanLateness | None) -> str:
    """median / p99 / worst in microseconds, `!` where the p99 is beyond its bound."""
    if late is None:
        return "-"
    return (f"{late.median_s * 1e6:.0f} / {late.p99_s * 1e6:.0f} / {late.worst_s * 1e6:.0f}"
            + ("" if late.ok else f" ! (bound {late.bound_s * 1e6:.0f})"))


def worst_p99(split: Breakdown) -> SpanLateness | None:
    """The stage whose timed spans' p99 lateness is the largest (None: no timed spans)."""
    late = [s.lateness for s in split.stages if s.lateness]
    return max(late, key=lambda x: x.p99_s) if late else None


def side_by_side(columns: list[tuple[str, list[Breakdown]]]) -> tuple[list[str], list[list[str]]]:
    """One column per (label, breakdowns of its runs): medians over the runs of the step, the ideal step, the
    testbed's own cost and each of its parts (mean over stages), milliseconds per step."""
    def med(values: list[float | None]) -> float | None:
        real = [v for v in values if v is not None]
        return statistics.median(real) if real else None

    def cell(value: float | None, signed: bool = True) -> str:
        return "-" if value is None else (f"{value * 1e3:+.0f}" if signed else f"{value * 1e3:.0f}")

    headers = ["ms per step (median of runs; parts: mean over stages)", *(label for label, _ in columns)]
    rows = [["step", *(cell(med([b.step_s for b in bs]), False) for _, bs in columns)],
            ["ideal step (reference compute, configured links)",
             *(cell(med([b.ideal_step_s for b in bs]), False) for _, bs in columns)],
            ["the testbed's own cost", *(cell(med([b.overhead_s for b in bs])) for _, bs in columns)],
            ["ideal step on these cores (compute measured with the step's messages alongside)",
             *(cell(med([b.cores_ideal_step_s for b in bs]), False) for _, bs in columns)],
            ["  of the own cost, the cores' share (messages' CPU beside the compute)",
             *(cell(med([b.cores_cannot_lose_s for b in bs])) for _, bs in columns)],
            ["  of the own cost, the rest (the testbed's: executor, waits, ...)",
             *(cell(med([b.own_beyond_cores_s for b in bs])) for _, bs in columns)]]
    for part in COMPONENTS:
        rows.append([f"  {LABELS[part]}", *(cell(med([statistics.mean(st.component(part) for st in b.stages)
                                                       for b in bs])) for _, bs in columns)])
        if part == "executor_s":        # the rest of it waited for the core at the spans' edges (other threads)
            rows.append(["    of which the executor's own CPU",
                         *(cell(med([statistics.mean(st.executor_cpu_s for st in b.stages) for b in bs]))
                           for _, bs in columns)])
    rows.append(["  the host ran faster than at its reference (drift)",
                 *(cell(med([statistics.mean(st.host_drift_s for st in b.stages) for b in bs])) for _, bs in columns)])
    if any(worst_p99(b) for _, bs in columns for b in bs):
        rows.append(["timed spans' p99 lateness, worst stage (us; ! runs beyond the bound)",
                     *(_late_p99(bs) for _, bs in columns)])
    rows.append(["delay daemons' CPU (of all cores)",
                 *(_share(bs, "delay daemons") for _, bs in columns)])
    for name in ("workers: gloo", "kernel and other", "idle"):
        rows.append([f"{name}... (of all cores)", *(_share_prefix(bs, name) for _, bs in columns)])
    return headers, rows


def _late_p99(splits: list[Breakdown]) -> str:
    """The median over runs of the worst stage's p99 lateness, and how many runs were beyond their bound."""
    worst = [w for w in (worst_p99(b) for b in splits) if w is not None]
    if not worst:
        return "-"
    late = sum(1 for b in splits if any(s.lateness and not s.lateness.ok for s in b.stages))
    return f"{statistics.median(w.p99_s for w in worst) * 1e6:.0f}" + (f" ! {late} late" if late else "")


def _share_prefix(splits: list[Breakdown], prefix: str) -> str:
    values = [sum(c.fraction for c in b.cpu if c.name.startswith(prefix)) for b in splits if b.cpu]
    return f"{statistics.median(values):.1%}" if values else "-"


def _share(splits: list[Breakdown], name: str) -> str:
    values = [c.fraction for b in splits for c in b.cpu if c.name == name]
    return f"{statistics.median(values):.1%}" if values else "-"
