"""One schedule's training inside a worker: its own copy of the stage (same initial weights and data order as
if it ran alone), optimizer, executor and iterations, so that a worker can run several schedules interleaved
iteration by iteration (workloads/worker.py) and each still trains exactly as it would on its own.

`OursRun` runs our schedules (schedules as data, workloads/executor.py), timing every span; `TorchRun` runs
PyTorch's own torch.distributed.pipelining schedules, timed per iteration. Iteration 0 is the warm-up: it
runs 1F1B for geopipe and measures the compute from which every rank derives the same GeoPipe plan."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from workloads.hostcpu import HostCpu
from workloads.layouts import TORCH_SCHEDULES, chunks_per_rank, virtual_stages
from workloads.records import IterationRecord, RankTrace, WorkerConfig
from workloads.threadclock import process_threads, thread_usage

WARMUP_SKIP = 2
"""The warm-up's first micro-batches per stage left out of the plan's samples (cold caches, allocator)."""


def log(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


def data_for(cfg: WorkerConfig) -> Any:
    """The run's data: every schedule gets its own iterator with the same seed (the same batches in order)."""
    from workloads.data import batches

    return batches(cfg.microbatches * cfg.microbatch_size, cfg.model.block_size, cfg.seed)


def activation_shape(cfg: WorkerConfig) -> tuple[int, ...]:
    model = cfg.model
    return (cfg.microbatch_size, model.block_size, model.n_embd)


class OursRun:
    """One of our schedules (gpipe, 1f1b, 1f1b-prefetch, geopipe) on this rank."""

    def __init__(self, cfg: WorkerConfig, name: str, transport: Any, transport_detail: dict[str, Any],
                 message_cost: list[float], host: HostCpu) -> None:
        import torch

        from workloads import schedule as S
        from workloads.executor import StageExecutor
        from workloads.model import build_stages, loss_fn
        from workloads.stagecompute import Arithmetic, Timed

        self.cfg, self.name, self.transport, self.host = cfg, name, transport, host
        self.detail, self.message_cost = transport_detail, message_cost
        self.stage: Any = None
        self.optimizer: Any = None
        compute: Arithmetic | Timed
        if cfg.cost_table is not None:          # compute as time: no model, no optimizer, no arithmetic
            compute = Timed(cfg.cost_table, cfg.rank, cfg.world)
        else:
            self.stage = build_stages(cfg.model, cfg.world, cfg.split)[cfg.rank]
            self.optimizer = torch.optim.AdamW(self.stage.parameters(), lr=cfg.lr)
            compute = Arithmetic(self.stage, cfg.rank, cfg.world, activation_shape(cfg), cfg.microbatches, loss_fn)
        self.executor = StageExecutor(compute, cfg.rank, cfg.world, transport, cfg.microbatches)
        self.budget = cfg.budget_for(name)
        if self.budget is not None and self.budget.bytes is not None:
            self.executor.budget_bytes = self.budget.bytes
        self.data = data_for(cfg)
        self.schedule = S.build("1f1b" if name == "geopipe" else name, cfg.world, cfg.microbatches)
        self.geo: Any = None
        self.spread: list[float] = []
        self.reference: list[float] = []
        self.reference_cpu: list[float] = []
        self.reference_loaded: list[float] = []
        """The compute alone while one step's messages cross alongside, wall seconds (measure_loaded_reference)."""
        self.iterations: list[IterationRecord] = []

    @property
    def chunks(self) -> list[Any]:
        return [self.stage] if self.stage is not None else []

    @property
    def indices(self) -> list[int]:
        return [self.cfg.rank]

    def iteration(self, it: int) -> None:
        cfg = self.cfg
        x, y = self.data.next()
        inputs = list(x.chunk(cfg.microbatches)) if cfg.rank == 0 and self.stage is not None else None
        targets = list(y.chunk(cfg.microbatches)) if cfg.rank == cfg.world - 1 and self.stage is not None else None
        if self.optimizer is not None:
            self.optimizer.zero_grad(set_to_none=True)
        self.transport.barrier()
        threads_before, host_before = process_threads(), self.host.read()
        trace = self.executor.run(self.schedule[cfg.rank], inputs, targets)
        host_after = self.host.read()
        threads = thread_usage(threads_before, process_threads(), threading.get_native_id())
        t0 = time.monotonic()
        if self.optimizer is not None:
            self.optimizer.step()
        opt_s = time.monotonic() - t0
        record = IterationRecord(
            iteration=it, warmup=it == 0, start=trace.start, end=trace.end, spans=trace.spans,
            memory=_thin(trace.memory), peak_inflight_bytes=trace.peak_inflight_bytes, loss=trace.loss,
            optimizer_s=opt_s, compute_s=trace.compute_s, wait_s=trace.wait_s, forward_s=trace.mean_compute("F"),
            backward_s=trace.mean_compute("B"), stash_bytes=max(trace.stash_bytes) if trace.stash_bytes else 0,
            main_cpu_s=trace.cpu_s, main_runq_s=trace.runq_s, threads=threads,
            host=self.host.window(host_before, host_after), send_lag_s=trace.send_lag_s,
            recv_lag_s=trace.recv_lag_s)
        self.iterations.append(record)
        log("iteration", rank=cfg.rank, schedule=self.name, iteration=it, seconds=trace.end - trace.start,
            loss=trace.loss)
        if it == 0:
            self.spread = _compute_spread(record)
            self._after_warmup(record)

    def _after_warmup(self, record: IterationRecord) -> None:
        """Every rank shares what its warm-up measured; a relative budget becomes bytes per stage; geopipe is
        sized for the whole pipeline from the measurements (by rank 0, sent to every rank: the per-micro-batch
        compute times as a distribution and the probed per-message cost) and dry-run."""
        import torch.distributed as dist

        from workloads import schedule as S
        from workloads.sampling import from_spans
        from workloads.sizing import size_geopipe

        cfg, executor = self.cfg, self.executor
        spans = [(sp.kind, sp.mb, sp.seconds) for sp in record.spans if sp.kind in ("F", "B")]
        measured: list[Any] = [None] * cfg.world
        dist.all_gather_object(measured, {"forward_s": record.forward_s or 0.0, "backward_s": record.backward_s or 0.0,
                                          "stash_bytes": record.stash_bytes or 0, "spans": spans})
        stash = [m["stash_bytes"] for m in measured]
        budgets = (self.budget.per_stage(cfg.world, cfg.microbatches, stash, executor.act_bytes)
                   if self.budget is not None else None)
        if budgets is not None:
            executor.budget_bytes = budgets[cfg.rank]
        if self.name != "geopipe":
            return
        plan: list[Any] = [None]
        if cfg.rank == 0:           # one rank sizes (the same inputs give the same plan), the others receive it
            samples = from_spans([m["spans"] for m in measured], skip=WARMUP_SKIP)
            plan[0] = size_geopipe(cfg.world, cfg.microbatches, link_delay_s=cfg.link_delay_s,
                                   link_bytes_per_s=cfg.link_bytes_per_s(), activation_bytes=executor.act_bytes,
                                   forward_s=samples.mean_forward(), backward_s=samples.mean_backward(),
                                   stash_bytes=stash, budget_bytes=budgets, samples=samples,
                                   message_overhead_s=max(0.0, *self.message_cost))
        dist.broadcast_object_list(plan, src=0)
        self.geo = plan[0]
        self.schedule = S.build("geopipe", cfg.world, cfg.microbatches, self.geo)
        refuse_deadlock(self.schedule, cfg, [m["forward_s"] + m["backward_s"] for m in measured], executor.act_bytes)

    def finish(self) -> None:
        if self.cfg.dump_gradients and self.stage is not None:
            import torch

            torch.save({n: p.grad for n, p in self.stage.named_parameters()},
                       Path(self.cfg.out_dir, self.name, f"grads-rank-{self.cfg.rank}.pt"))

    def trace(self) -> RankTrace:
        return RankTrace(config=self.cfg, schedule=self.name, rank=self.cfg.rank, iterations=self.iterations,
                         actions=[str(a) for a in self.executor.posting_order(self.schedule[self.cfg.rank])],
                         geopipe_sizing=self.geo,
                         activation_bytes=self.executor.act_bytes, transport=self.transport.name,
                         reference_compute_s=self.reference, budget_bytes=self.executor.budget_bytes,
                         compute_spread=self.spread, transport_detail=self.detail, message_cost_s=self.message_cost,
                         reference_cpu_s=self.reference_cpu,
                         receives_before_sends=self.transport.receives_before_sends,
                         reference_loaded_s=self.reference_loaded)


class TorchRun:
    """One of PyTorch's own torch.distributed.pipelining schedules on the same model, timed the same way. The
    multi-stage ones (interleaved, ZBV, DualPipeV) split the model into 2 x world chunks."""

    def __init__(self, cfg: WorkerConfig, name: str, transport: Any) -> None:
        import torch
        from torch.distributed.pipelining import PipelineStage
        from torch.distributed.pipelining import schedules as torch_schedules

        from workloads.model import build_stages, loss_fn

        self.cfg, self.name, self.transport = cfg, name, transport
        self.total = cfg.world * chunks_per_rank(name)
        self.indices = virtual_stages(name, cfg.rank, cfg.world)
        modules = build_stages(cfg.model, self.total, cfg.split if self.total == cfg.world else None)
        self.chunks = [modules[i] for i in self.indices]
        self.optimizer = torch.optim.AdamW([p for c in self.chunks for p in c.parameters()], lr=cfg.lr)
        stages = [PipelineStage(c, i, self.total, torch.device("cpu"))
                  for c, i in zip(self.chunks, self.indices, strict=True)]
        kind = getattr(torch_schedules, TORCH_SCHEDULES[name][0])
        self.schedule = kind(stages[0] if len(stages) == 1 else stages, cfg.microbatches, loss_fn=loss_fn)
        self.data = data_for(cfg)
        self.reference: list[float] = []
        self.reference_cpu: list[float] = []
        self.iterations: list[IterationRecord] = []

    def iteration(self, it: int) -> None:
        x, y = self.data.next()
        self.optimizer.zero_grad(set_to_none=True)
        self.transport.barrier()
        start = time.monotonic()
        losses: list[Any] = []
        args = (x,) if 0 in self.indices else ()
        kwargs = {"target": y, "losses": losses} if self.total - 1 in self.indices else {}
        self.schedule.step(*args, **kwargs)
        end = time.monotonic()
        self.optimizer.step()
        loss = float(sum(v.item() for v in losses) / len(losses)) if losses else None
        self.iterations.append(IterationRecord(iteration=it, warmup=it == 0, start=start, end=end, loss=loss))
        log("iteration", rank=self.cfg.rank, schedule=self.name, iteration=it, seconds=end - start, loss=loss)

    def finish(self) -> None:
        return None

    def trace(self) -> RankTrace:
        return RankTrace(config=self.cfg, schedule=self.name, rank=self.cfg.rank, iterations=self.iterations,
                         transport=self.transport.name, reference_compute_s=self.reference,
                         reference_cpu_s=self.reference_cpu)


def measure_reference(cfg: WorkerConfig, run: OursRun | TorchRun, between: Callable[[int], None] | None = None,
                      between_cpu_counts: bool = False) -> tuple[float, float]:
    """This rank's uncontended compute (workloads/reference.py) through `run`'s chunks, all ranks at once after
    a barrier: (wall seconds of its F and B, the thread's CPU seconds over the pass). `between` runs after each
    micro-batch (reference_compute_s says what of it counts)."""
    import torch.distributed as dist

    from workloads.model import loss_fn
    from workloads.reference import reference_compute_s

    x, y = data_for(cfg).next()
    dist.barrier()
    if cfg.cost_table is not None:      # compute as time: the table's F+B, exactly what the spans replay
        seconds = cfg.cost_table.reference_s(cfg.rank, cfg.microbatches)
        return seconds, seconds
    total = cfg.world * chunks_per_rank(run.name)
    cpu = time.thread_time()
    wall = reference_compute_s(run.chunks, [i == 0 for i in run.indices], [i == total - 1 for i in run.indices],
                               cfg.microbatches, activation_shape(cfg), list(x.chunk(cfg.microbatches)),
                               list(y.chunk(cfg.microbatches)), loss_fn, between, between_cpu_counts)
    return wall, time.thread_time() - cpu


LOADED_TAG = 1 << 20
"""Tags of the loaded reference's messages, clear of the schedules' (2 x micro-batch + direction)."""


def measure_loaded_reference(cfg: WorkerConfig, run: OursRun) -> float:
    """The pass of `measure_reference` while one step's messages cross alongside: after each micro-batch's F+B
    the rank posts a receive from each neighbour and a send of an activation-sized message to each (through the
    run's transport, as the pipeline posts its own), and waits for them only after the pass, so no compute waits
    on a message. Its wall time (with the core waited for meanwhile; the posting's own CPU only where the
    transport writes the sends in this thread) is the stage's compute on these cores with the step's traffic and
    no schedule."""
    import torch
    import torch.distributed as dist

    from workloads.executor import tag_of

    shape = activation_shape(cfg)
    peers = [p for p in (cfg.rank - 1, cfg.rank + 1) if 0 <= p < cfg.world]
    payload = {p: torch.zeros(shape) for p in peers}
    into = {p: torch.empty(shape) for p in peers}
    works: list[Any] = []

    def exchange(mb: int) -> None:         # activations go up the ranks (F), gradients down (B)
        works.extend(run.transport.irecv(into[p], p, LOADED_TAG + tag_of("F" if p < cfg.rank else "B", mb))
                     for p in peers)
        works.extend(run.transport.isend(payload[p], p, LOADED_TAG + tag_of("F" if p > cfg.rank else "B", mb))
                     for p in peers)

    wall, _ = measure_reference(cfg, run, exchange, between_cpu_counts=run.transport.writes_sends_in_caller)
    for work in works:
        work.wait()
    dist.barrier()
    return wall


def refuse_deadlock(schedule: Any, cfg: WorkerConfig, compute_s: list[float], activation_bytes: int) -> None:
    """Dry-run the schedule on the measured times before running it: one the simulator shows deadlocking
    (gloo's receiver-driven sends) fails at once with why, instead of hanging until the run's time-out."""
    from workloads.simulate import Costs, Deadlock, simulate

    half = [c / 2 for c in compute_s]
    try:
        simulate(schedule, Costs(half, half, cfg.link_delay_s, cfg.link_bytes_per_s(), activation_bytes,
                                 0, 0.0, None))
    except Deadlock as exc:
        raise RuntimeError(f"the geopipe schedule sized for {cfg.world} stages would deadlock ({exc}); "
                           "run fewer stages (--stages) or another schedule") from None


def _compute_spread(record: IterationRecord) -> list[float]:
    """[10th percentile, median, mean] of the iteration's per-micro-batch F+B seconds."""
    import statistics

    from workloads.sizing import quantile

    per_mb: dict[int, float] = {}
    for span in record.spans:
        if span.kind in ("F", "B"):
            per_mb[span.mb] = per_mb.get(span.mb, 0.0) + span.seconds
    values = list(per_mb.values())
    return [quantile(values, 0.1), statistics.median(values), statistics.mean(values)]


def _thin(points: list[tuple[float, int]], keep: int = 400) -> list[tuple[float, int]]:
    if len(points) <= keep:
        return points
    step = len(points) / keep
    return [points[int(i * step)] for i in range(keep)] + [points[-1]]
