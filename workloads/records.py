"""What crosses the worker's process boundary, typed: the configuration the runner writes (`WorkerConfig`)
and the trace each rank writes back (`RankTrace`, one `IterationRecord` per iteration, `Span`s inside).
Each has `to_json`/`from_json`; no torch import here, so the runner and the reports read them cheaply."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from workloads.schedule import GeoPipeSizing


@dataclass(kw_only=True, slots=True)
class WorkerConfig:
    """One rank's job, written by the runner as worker-<rank>.json."""

    rank: int
    world: int
    master_addr: str
    master_port: int
    schedule: str
    """gpipe | 1f1b | 1f1b-prefetch | geopipe | torch-* (PyTorch's own schedules, see workloads.worker)."""
    microbatches: int = 8
    microbatch_size: int = 4
    iterations: int = 4
    """Timed iterations, after one warm-up iteration."""
    model: dict[str, Any] = field(default_factory=dict)
    """GPTConfig fields (n_layer, n_embd, n_head, block_size)."""
    split: list[int] | None = None
    link_delay_s: list[float] = field(default_factory=list)
    """Configured one-way delay between stage s and s+1 (0 within a DC)."""
    link_rate_bps: list[float] = field(default_factory=list)
    """Bottleneck rate between stage s and s+1, bits per second."""
    memory_budget: str | None = None
    """In-flight memory per stage: bytes (`1000000`) or `1f1b+N` (workloads.memory.MemoryBudget)."""
    lr: float = 3e-3
    seed: int = 1234
    out_dir: str = "."
    cpu: int | None = None
    """Core the worker pins itself to."""
    timeout_s: float = 120.0
    transport: str = "tcp"
    """tcp (gloo) or rdma (workloads/rdma over this host's rxe device: `rdma_device`, `rdma_gid_index`)."""
    rdma_device: str = ""
    rdma_gid_index: int = -1
    rdma_mtu: list[int] = field(default_factory=list)
    """Largest RDMA MTU the path between stage s and s+1 carries (its smallest IP MTU)."""
    rdma_slots: int = 4
    """Receive slots per neighbour (each one message): how far a sender may run ahead of its receiver."""
    dump_gradients: bool = False
    """Write this rank's gradients of the last iteration to OUT/grads-rank-<r>.pt (checks against a single
    process; with lr 0 every iteration's gradients are those of the initial weights)."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> WorkerConfig:
        budget = data.get("memory_budget")
        return cls(**{**data, "memory_budget": None if budget is None else str(budget)})


@dataclass(slots=True)
class Span:
    """A timed interval of one rank: F, B (compute), wait-F / wait-B (blocked on a receive), wait-send."""

    kind: str
    mb: int
    """Micro-batch, -1 for the end-of-iteration wait for sends."""
    start: float
    end: float

    @property
    def seconds(self) -> float:
        return self.end - self.start


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

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> IterationRecord:
        return cls(**{**data, "spans": [Span(**s) for s in data.get("spans", [])],
                      "memory": [(float(t), int(v)) for t, v in data.get("memory", [])]})


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
    budget_bytes: int | None = None
    """The in-flight budget this rank ran under (enforced), None for none."""
    compute_spread: list[float] = field(default_factory=list)
    """Warm-up per-micro-batch F+B: [fast quantile, median, mean] seconds (what geopipe's slack comes from)."""
    transport_detail: dict[str, Any] = field(default_factory=dict)
    """RDMA: per neighbour rank the QPs, RDMA MTU, ACK timeout exponent and slot pool; pool bytes in total."""

    @property
    def steady(self) -> list[IterationRecord]:
        return [it for it in self.iterations if not it.warmup]

    def to_json(self) -> dict[str, Any]:
        return {"config": self.config.to_json(), "schedule": self.schedule, "rank": self.rank,
                "iterations": [it.to_json() for it in self.iterations], "actions": list(self.actions),
                "geopipe_sizing": asdict(self.geopipe_sizing) if self.geopipe_sizing else None,
                "activation_bytes": self.activation_bytes, "transport": self.transport,
                "reference_compute_s": list(self.reference_compute_s), "budget_bytes": self.budget_bytes,
                "compute_spread": list(self.compute_spread), "transport_detail": dict(self.transport_detail)}

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
                   transport_detail=dict(data.get("transport_detail", {})))
