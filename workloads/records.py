"""What crosses the worker's process boundary, typed: the configuration the runner writes (`WorkerConfig`)
and the trace each rank writes back (`RankTrace`, one `IterationRecord` per iteration, `Span`s inside).
Each has `to_json`/`from_json`; no torch import here, so the runner and the reports read them cheaply."""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from typing import Any

from workloads.compute import CostTable
from workloads.hostcpu import HostWindow, WatchGroup
from workloads.memory import MemoryBudget
from workloads.schedule import GeoPipeSizing
from workloads.threadclock import ThreadUsage


@dataclass(frozen=True, slots=True)
class LinkSetting:
    """One setting of the links between the stages that a run switches to between iterations (the runner
    applies it to the emulated link when rank 0 asks; workloads/worker.py)."""

    label: str
    """Its name and the traces' folder, e.g. `1000km`."""
    link_delay_s: list[float]
    link_rate_bps: list[float]
    schedules: list[str] = field(default_factory=list)
    """The schedules run under this setting (empty: every schedule of the run)."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> LinkSetting:
        return cls(str(data["label"]), [float(x) for x in data["link_delay_s"]], [float(x) for x in data["link_rate_bps"]],
                   list(data.get("schedules", [])))


@dataclass(kw_only=True, slots=True)
class GPTConfig:
    """The model's shape (workloads/model.py builds it; torch-free here, so runners and configs carry it)."""

    vocab_size: int = 128
    """Byte-level vocabulary (ASCII text)."""
    block_size: int = 64
    """Sequence length T."""
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    """Width C."""
    seed: int = 1234

    def __post_init__(self) -> None:
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})")
        if self.n_layer < 1 or self.block_size < 2:
            raise ValueError("need n_layer >= 1 and block_size >= 2")


@dataclass(frozen=True, slots=True)
class TransportKind:
    """One transport between stages: its one spelling (command line, WorkerConfig.transport) and its name in
    summaries and reports."""

    key: str
    label: str
    receiver_driven: bool
    """A message moves when its receiver asks for it (gloo's recv); RDMA writes into a posted slot instead."""


TCP = TransportKind("tcp", "gloo-tcp", receiver_driven=True)
RDMA = TransportKind("rdma", "rdma-rc", receiver_driven=False)
TRANSPORTS: dict[str, TransportKind] = {t.key: t for t in (TCP, RDMA)}
"""Every transport by key: what both one machine and several choose from."""


@dataclass(kw_only=True, slots=True)
class WorkerConfig:
    """One rank's job, written by the runner as worker-<rank>.json."""

    rank: int
    world: int
    master_addr: str
    master_port: int
    schedules: list[str]
    """Run interleaved, iteration by iteration: gpipe | 1f1b | 1f1b-prefetch | geopipe | torch-* (PyTorch's own
    schedules, workloads/layouts.py)."""
    microbatches: int = 8
    microbatch_size: int = 4
    iterations: int = 4
    """Timed iterations, after one warm-up iteration."""
    model: GPTConfig = field(default_factory=GPTConfig)
    split: list[int] | None = None
    link_delay_s: list[float] = field(default_factory=list)
    """Configured one-way delay between stage s and s+1 (0 within a DC)."""
    link_rate_bps: list[float] = field(default_factory=list)
    """Bottleneck rate between stage s and s+1, bits per second."""
    settings: list[LinkSetting] = field(default_factory=list)
    """Link settings to run every schedule under, interleaved with the schedules (the first is in force at the
    start); traces go to OUT/<label>/<schedule>/. Empty: the links as they are (`link_delay_s`, ...)."""
    memory_budget: MemoryBudget | None = None
    """In-flight memory per stage (JSON: its text, bytes `1000000` or `1f1b+N`)."""
    unbudgeted: list[str] = field(default_factory=list)
    """Schedules of the run that run without the memory budget."""
    lr: float = 3e-3
    seed: int = 1234
    out_dir: str = "."
    cpu: int | None = None
    """Core the worker pins itself to."""
    cgroup: str = ""
    """A dilated run (testbed/run/dilation.py): the capped cgroup's procs file the worker writes its PID to
    first; empty: none."""
    comm_cgroup: str = ""
    """A dilated run: the file that takes the communication threads out of the cap (thread ids)."""
    comm_priority: str = "normal"
    """normal, or realtime: the communication threads (gloo's I/O loop) under SCHED_FIFO, so a message that
    arrives is taken off the socket at once instead of after the compute thread's time slice."""
    comm_affinity: str = "own"
    """own: the communication threads share the worker's core (they inherit its pinning); any: they may run on
    every core, so a message is taken off the socket on whichever core is free (workloads/commthreads.py)."""
    sender: str = "thread"
    """Who writes gloo's sends: `thread` (a sender thread of their own, the receives after a send posted before
    it: workloads/transport.py SenderThread) or `inline` (the executor's thread, in the schedule's order).
    Measured side by side, real compute (`make bench-overhead COMPARE=sender`): at 0 km (host F+B 3.5 ms) 1f1b's
    step 0.196 -> 0.178 s with the thread, 1f1b-prefetch 0.185 -> 0.187 s, geopipe 0.162 -> 0.160 s; at 1000 km
    1f1b -4.6 %, the overlapping schedules +3.0-3.6 % (docs/breakdown.md)."""
    timeout_s: float = 120.0
    transport: str = TCP.key
    """tcp (gloo) or rdma (workloads/rdma over this host's rxe device: `rdma_device`, `rdma_gid_index`)."""
    rdma_device: str = ""
    rdma_gid_index: int = -1
    rdma_mtu: list[int] = field(default_factory=list)
    """Largest RDMA MTU the path between stage s and s+1 carries (its smallest IP MTU)."""
    rdma_slots: int = 4
    """Receive slots per neighbour (each one message): how far a sender may run ahead of its receiver."""
    watch: list[WatchGroup] = field(default_factory=list)
    """Other processes of the run whose CPU each iteration records: the delay daemons, the runner
    (workloads/hostcpu.py)."""
    compute: str = "real"
    """real (the model's arithmetic), replay (F and B as waits: `cost_table`, or one profiled here at start-up)
    or profile (a deployment's table in `cost_table`); workloads/compute.py."""
    cost_table: CostTable | None = None
    """The table a timed run replays; None: real compute, or a replay that profiles this host first."""
    dump_gradients: bool = False
    """Write this rank's gradients of the last iteration to OUT/grads-rank-<r>.pt (checks against a single
    process; with lr 0 every iteration's gradients are those of the initial weights)."""

    def budget_for(self, schedule: str) -> MemoryBudget | None:
        return None if schedule in self.unbudgeted else self.memory_budget

    @property
    def timed(self) -> bool:
        return self.compute != "real"

    def link_bytes_per_s(self) -> list[float]:
        """Per stage link, the rate a message's transfer takes as the deployment sees it: the emulated rate
        times the table's rate scale (the wire carries the message's bytes over that scale)."""
        table = self.cost_table
        return [r / 8 * (table.scale(s) if table else 1.0) for s, r in enumerate(self.link_rate_bps)]

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "memory_budget": None if self.memory_budget is None else self.memory_budget.text,
                "cost_table": self.cost_table.to_json() if self.cost_table else None}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> WorkerConfig:
        """Also reads configurations of 0.2 (one `schedule`), and of releases before `sender` (they sent from a
        thread with compute as time only)."""
        budget = data.get("memory_budget")
        known = {k: v for k, v in data.items() if k != "schedule"}
        known.setdefault("sender", "thread" if data.get("compute", "real") != "real" else "inline")
        return cls(**{**known, "schedules": list(data.get("schedules", [data.get("schedule")])),
                      "memory_budget": None if budget is None else MemoryBudget.parse(budget),
                      "model": GPTConfig(**data.get("model", {})),
                      "watch": [WatchGroup.from_json(g) for g in data.get("watch", [])],
                      "settings": [LinkSetting.from_json(x) for x in data.get("settings", [])],
                      "cost_table": CostTable.from_json(data["cost_table"]) if data.get("cost_table") else None})


@dataclass(slots=True)
class Span:
    """A timed interval of one rank: F, B (compute), wait-F / wait-B (blocked on a receive), wait-send."""

    kind: str
    mb: int
    """Micro-batch, -1 for the end-of-iteration wait for sends."""
    start: float
    end: float
    cpu_s: float | None = None
    """CPU the rank's main thread ran during the span (workloads/threadclock.py); None where not measured."""
    runq_s: float | None = None
    """Time the main thread sat runnable but not running during the span: other threads had its core."""
    late_s: float | None = None
    """A timed span (compute as time): `actual_end - end`; None for arithmetic."""
    woke: float | None = None
    """A timed span: when its sleep returned (`start`/`end` are the device timeline's plan); None for arithmetic
    and in traces of releases before it was recorded."""
    actual_end: float | None = None
    """A timed span: when it really returned to the executor (its message could leave no earlier)."""

    @property
    def seconds(self) -> float:
        return self.end - self.start

    @property
    def lateness_s(self) -> float | None:
        """A timed span's actual end less its planned end (older traces: their `late_s`); None for arithmetic."""
        return self.late_s if self.actual_end is None else self.actual_end - self.end


@dataclass(kw_only=True, slots=True)
class IterationRecord:
    """One iteration of one rank (monotonic clock seconds; PyTorch's schedules leave the span fields empty)."""

    iteration: int
    warmup: bool
    start: float
    end: float
    spans: list[Span] = field(default_factory=list)
    memory: list[tuple[float, int]] = field(default_factory=list)
    """(time, in-flight activation bytes) after each change, thinned."""
    peak_inflight_bytes: int | None = None
    loss: float | None = None
    optimizer_s: float | None = None
    compute_s: float | None = None
    """Sum of F and B spans; None where the schedule is not instrumented (torch-*)."""
    wait_s: float | None = None
    forward_s: float | None = None
    """Mean F span."""
    backward_s: float | None = None
    stash_bytes: int | None = None
    """Largest per-micro-batch stash saved by autograd."""
    main_cpu_s: float | None = None
    """CPU the main thread ran over the iteration (its spans and the executor's work between them)."""
    main_runq_s: float | None = None
    """Time the main thread waited for its core over the iteration."""
    threads: list[ThreadUsage] = field(default_factory=list)
    """CPU and run-queue wait of every thread of the worker over the iteration, by thread name
    (`main`, gloo's threads, ...): what the rank's own process spent beside its compute."""
    host: HostWindow | None = None
    """The whole machine's CPU over the iteration: per state (idle, softirq, steal, ...) and per watched group."""
    send_lag_s: list[float] = field(default_factory=list)
    """Per send, in order: from its F's or B's end to when the transport began to post it."""
    recv_lag_s: list[float] = field(default_factory=list)
    """Per receive, in order: from the stage's compute before it (or the iteration's start) to its post."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> IterationRecord:
        return cls(**{**data, "spans": [Span(**s) for s in data.get("spans", [])],
                      "memory": [(float(t), int(v)) for t, v in data.get("memory", [])],
                      "threads": [ThreadUsage(**t) for t in data.get("threads", [])],
                      "host": HostWindow.from_json(data["host"]) if data.get("host") else None})


@dataclass(kw_only=True, slots=True)
class RankTrace:
    """Everything one rank measured in one run of one schedule: rank-<r>.json."""

    config: WorkerConfig
    schedule: str
    rank: int
    iterations: list[IterationRecord]
    actions: list[str] = field(default_factory=list)
    """The action list it executed in its timed iterations (`RF3 F3 SF3 ...`)."""
    geopipe_sizing: GeoPipeSizing | None = None
    activation_bytes: int | None = None
    transport: str = ""
    reference_compute_s: list[float] = field(default_factory=list)
    """This rank's F+B of one iteration's micro-batches with no communication, each time it was measured
    (before and after the timed iterations); see workloads/reference.py."""
    reference_cpu_s: list[float] = field(default_factory=list)
    """The thread's CPU time over each reference pass: what the compute costs in CPU alone, whatever else
    shared the core (a run with more workers than cores measures its wall-clock reference contended)."""
    budget_bytes: int | None = None
    """The in-flight budget this rank ran under (enforced), None for none."""
    compute_spread: list[float] = field(default_factory=list)
    """Warm-up per-micro-batch F+B: [fast quantile, median, mean] seconds (what geopipe's slack comes from)."""
    transport_detail: dict[str, Any] = field(default_factory=dict)
    """RDMA: per neighbour rank the QPs, RDMA MTU, ACK timeout exponent and slot pool; pool bytes in total."""
    message_cost_s: list[float] = field(default_factory=list)
    """Per link between stage s and s+1: the transport's cost per activation-sized message beyond the configured
    delay and transfer, probed by ping-pong at start-up (workloads.worker.probe_message_cost)."""
    reference_loaded_s: list[float] = field(default_factory=list)
    """Real compute: the same pass as `reference_compute_s` while one step's messages cross alongside, posted
    after each micro-batch and waited for only after the pass (workloads/runs.py: measure_loaded_reference), wall
    seconds, every pass (several before and after the timed iterations): the compute on these cores with the
    step's traffic and no schedule."""
    receives_before_sends: bool | None = None
    """The executor posted the receives that follow an F's or B's send before it (`actions` is in that order);
    None in traces of releases before it was recorded (there: compute as time did, real mode did not)."""
    dilation: float = 1.0
    """Times here are undilated: the worker ran dilated by this factor and its wall-clock times were divided
    by it (testbed/run/dilation.py); 1.0: as measured."""

    @property
    def steady(self) -> list[IterationRecord]:
        return [it for it in self.iterations if not it.warmup]

    @property
    def posted_receives_first(self) -> bool:
        """Whether the executor posted the receives after a send before it (older traces: it did with compute as
        time, and their `actions` is then the schedule's order; `schedule.posting_order` is idempotent, so replaying
        `posting_order(actions, this)` is right for both)."""
        return self.config.timed if self.receives_before_sends is None else self.receives_before_sends

    def to_json(self) -> dict[str, Any]:
        return {"config": self.config.to_json(), "schedule": self.schedule, "rank": self.rank,
                "iterations": [it.to_json() for it in self.iterations], "actions": list(self.actions),
                "geopipe_sizing": asdict(self.geopipe_sizing) if self.geopipe_sizing else None,
                "activation_bytes": self.activation_bytes, "transport": self.transport,
                "reference_compute_s": list(self.reference_compute_s), "budget_bytes": self.budget_bytes,
                "compute_spread": list(self.compute_spread), "transport_detail": dict(self.transport_detail),
                "message_cost_s": list(self.message_cost_s), "dilation": self.dilation,
                "reference_cpu_s": list(self.reference_cpu_s), "receives_before_sends": self.receives_before_sends,
                "reference_loaded_s": list(self.reference_loaded_s)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RankTrace:
        """Also reads traces of 0.1 (`geo_plan`)."""
        sizing = data.get("geopipe_sizing", data.get("geo_plan"))
        return cls(config=WorkerConfig.from_json(data["config"]), schedule=data["schedule"], rank=int(data["rank"]),
                   iterations=[IterationRecord.from_json(it) for it in data["iterations"]],
                   actions=list(data.get("actions", [])),
                   geopipe_sizing=GeoPipeSizing.from_json(sizing) if sizing else None,
                   activation_bytes=data.get("activation_bytes"), transport=data.get("transport", ""),
                   reference_compute_s=list(data.get("reference_compute_s", [])),
                   budget_bytes=data.get("budget_bytes"), compute_spread=list(data.get("compute_spread", [])),
                   transport_detail=dict(data.get("transport_detail", {})), dilation=float(data.get("dilation", 1.0)),
                   message_cost_s=list(data.get("message_cost_s", [])),
                   reference_cpu_s=list(data.get("reference_cpu_s", [])),
                   receives_before_sends=data.get("receives_before_sends"),
                   reference_loaded_s=list(data.get("reference_loaded_s", [])))


def start_offsets(ranks: list[RankTrace]) -> list[float] | None:
    """Per rank (in rank order): the median over the steady iterations of its start minus rank 0's. The start
    barrier crosses the emulated links, so a later stage begins up to a link delay before stage 0 and its first
    receives are posted (their notices on the way) before the pipeline's first forward."""
    steady = [r.steady for r in ranks]
    if len(ranks) < 2 or not steady[0] or len({len(its) for its in steady}) != 1:
        return None
    return [statistics.median(it.start - first.start for it, first in zip(its, steady[0], strict=True))
            for its in steady]
