"""One pipeline rank, run inside one emulated host: `python -m workloads.worker CONFIG.json`.

Rendezvous over the emulated network (gloo, TCP store on rank 0), one warm-up iteration (excluded from
metrics; for geopipe it runs 1F1B and measures the per-micro-batch compute times, their spread and the
stash size, from which every rank derives the same GeoPipe plan; a `1f1b+N` budget becomes bytes there),
then timed iterations. Before and after them, every rank measures its compute alone (the reference).
Progress goes to stdout as JSON lines; the per-rank trace is written to OUT/rank-<r>.json.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from workloads.records import IterationRecord, RankTrace, WorkerConfig


def log(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


def main(config_path: str) -> int:
    cfg = WorkerConfig.from_json(json.loads(Path(config_path).read_text()))
    if cfg.cpu is not None:
        os.sched_setaffinity(0, {cfg.cpu})
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://{cfg.master_addr}:{cfg.master_port}", rank=cfg.rank,
                            world_size=cfg.world, timeout=__import__("datetime").timedelta(seconds=cfg.timeout_s))
    log("ready", rank=cfg.rank)
    model_cfg = _model_cfg(cfg)
    try:
        run = run_torch_reference if cfg.schedule.startswith("torch-") else run_ours
        result = run(cfg, model_cfg)
    finally:
        dist.destroy_process_group()
    Path(cfg.out_dir, f"rank-{cfg.rank}.json").write_text(json.dumps(result.to_json()))
    log("done", rank=cfg.rank)
    return 0


def _data(cfg: WorkerConfig, model_cfg: Any) -> Any:
    from workloads.data import batches

    return batches(cfg.microbatches * cfg.microbatch_size, model_cfg.block_size, cfg.seed)


TORCH_SCHEDULES = {
    "torch-gpipe": ("ScheduleGPipe", "single"),
    "torch-1f1b": ("Schedule1F1B", "single"),
    "torch-interleaved-1f1b": ("ScheduleInterleaved1F1B", "loop"),
    "torch-zbv": ("ScheduleZBVZeroBubble", "v"),
    "torch-dualpipev": ("ScheduleDualPipeV", "v"),
    "torch-interleaved-zb": ("ScheduleInterleavedZeroBubble", "loop"),
    "torch-looped-bfs": ("ScheduleLoopedBFS", "loop"),
}
"""PyTorch's own schedules: class in torch.distributed.pipelining, and how its stages sit on the ranks
(`single`: one per rank; `loop`: two per rank, r and r + p (interleaved); `v`: two per rank, r and 2p-1-r)."""


def stage_layout(schedule: str) -> str:
    """How a schedule's model chunks sit on the ranks: runs with the same layout compute the same per rank."""
    return TORCH_SCHEDULES[schedule][1] if schedule in TORCH_SCHEDULES else "single"


def virtual_stages(schedule: str, rank: int, world: int) -> list[int]:
    """The model chunks (of `len` x world for the multi-stage schedules) that `rank` runs, in order."""
    layout = stage_layout(schedule)
    if layout == "loop":
        return [rank, rank + world]
    if layout == "v":
        return [rank, 2 * world - 1 - rank]
    return [rank]


def chunks_per_rank(schedule: str) -> int:
    return 1 if stage_layout(schedule) == "single" else 2


def run_ours(cfg: WorkerConfig, model_cfg: Any) -> RankTrace:
    import torch

    from workloads import schedule as S
    from workloads.executor import StageExecutor
    from workloads.memory import MemoryBudget
    from workloads.model import build_stages, loss_fn
    stage = build_stages(model_cfg, cfg.world, cfg.split)[cfg.rank]
    optimizer = torch.optim.AdamW(stage.parameters(), lr=cfg.lr)
    shape = (cfg.microbatch_size, model_cfg.block_size, model_cfg.n_embd)
    transport, detail = _transport(cfg, int(torch.Size(shape).numel()) * 4)
    executor = StageExecutor(stage, cfg.rank, cfg.world, transport, shape, cfg.microbatches, loss_fn)
    budget = MemoryBudget.parse(cfg.memory_budget) if cfg.memory_budget else None
    if budget is not None and budget.bytes is not None:
        executor.budget_bytes = budget.bytes
    data = _data(cfg, model_cfg)
    first_name = "1f1b" if cfg.schedule == "geopipe" else cfg.schedule
    schedule = S.build(first_name, cfg.world, cfg.microbatches)
    geo, spread, reference = None, [], []
    iterations = []
    for it in range(cfg.iterations + 1):
        x, y = data.next()
        inputs = list(x.chunk(cfg.microbatches)) if cfg.rank == 0 else None
        targets = list(y.chunk(cfg.microbatches)) if cfg.rank == cfg.world - 1 else None
        if it == 1:
            reference.append(_reference(cfg, [stage], [cfg.rank], cfg.world, shape))
        optimizer.zero_grad(set_to_none=True)
        transport.barrier()
        trace = executor.run(schedule[cfg.rank], inputs, targets)
        t0 = time.monotonic()
        optimizer.step()
        opt_s = time.monotonic() - t0
        record = IterationRecord(
            iteration=it, warmup=it == 0, start=trace.start, end=trace.end, spans=trace.spans,
            memory=_thin(trace.memory), peak_inflight_bytes=trace.peak_inflight_bytes, loss=trace.loss,
            optimizer_s=opt_s, compute_s=trace.compute_s, wait_s=trace.wait_s, forward_s=trace.mean_compute("F"),
            backward_s=trace.mean_compute("B"), stash_bytes=max(trace.stash_bytes) if trace.stash_bytes else 0)
        iterations.append(record)
        log("iteration", rank=cfg.rank, iteration=it, seconds=trace.end - trace.start, loss=trace.loss)
        if it == 0:
            spread = _compute_spread(record)
            geo, schedule = _after_warmup(cfg, executor, record, spread, budget, schedule)
    if cfg.dump_gradients:
        torch.save({n: p.grad for n, p in stage.named_parameters()}, Path(cfg.out_dir, f"grads-rank-{cfg.rank}.pt"))
    reference.append(_reference(cfg, [stage], [cfg.rank], cfg.world, shape))
    transport.barrier()                  # every rank is done sending before any closes its queue pairs
    if hasattr(transport, "close"):
        transport.close()
    return RankTrace(config=cfg, schedule=cfg.schedule, rank=cfg.rank, iterations=iterations,
                     actions=[str(a) for a in schedule[cfg.rank]], geopipe_sizing=geo,
                     activation_bytes=executor.act_bytes, transport=transport.name, reference_compute_s=reference,
                     budget_bytes=executor.budget_bytes, compute_spread=spread, transport_detail=detail)


def _transport(cfg: WorkerConfig, message_bytes: int) -> tuple[Any, dict[str, Any]]:
    """gloo over TCP, or RDMA queue pairs to the neighbouring ranks sized from the path between them."""
    from workloads.transport import GlooTransport, RdmaTransport

    if cfg.transport != "rdma":
        return GlooTransport(), {}
    from workloads.rdma.endpoint import LinkParams

    peers = {}
    for peer in (cfg.rank - 1, cfg.rank + 1):
        if 0 <= peer < cfg.world:
            boundary = min(peer, cfg.rank)
            peers[peer] = LinkParams.for_path(2 * cfg.link_delay_s[boundary], cfg.link_rate_bps[boundary],
                                              cfg.rdma_mtu[boundary], message_bytes, cfg.rdma_slots)
    transport = RdmaTransport(cfg.rdma_device, cfg.rdma_gid_index, cfg.rank, peers, timeout_s=cfg.timeout_s)
    detail = {"device": cfg.rdma_device, "pool_bytes": transport.pool_bytes(),
              "peers": {str(r): {"qps": p.qps, "rdma_mtu": p.rdma_mtu, "timeout_exp": p.timeout_exp,
                                 "slots": p.slots, "slot_bytes": p.slot_bytes} for r, p in peers.items()}}
    log("transport", rank=cfg.rank, transport=transport.name, **detail)
    return transport, detail


def _compute_spread(record: IterationRecord) -> list[float]:
    """[fast quantile, median, mean] of the iteration's per-micro-batch F+B seconds."""
    import statistics

    from workloads.sizing import FAST_QUANTILE, quantile

    per_mb: dict[int, float] = {}
    for span in record.spans:
        if span.kind in ("F", "B"):
            per_mb[span.mb] = per_mb.get(span.mb, 0.0) + span.seconds
    values = list(per_mb.values())
    return [quantile(values, FAST_QUANTILE), statistics.median(values), statistics.mean(values)]


def _after_warmup(cfg: WorkerConfig, executor: Any, record: IterationRecord, spread: list[float], budget: Any,
                  schedule: Any) -> tuple[Any, Any]:
    """Every rank shares what its warm-up measured; a relative budget becomes bytes per stage; geopipe is
    sized for the whole pipeline from the measurements (the same plan on every rank) and dry-run."""
    import torch.distributed as dist

    from workloads import schedule as S
    from workloads.sizing import size_geopipe

    measured: list[Any] = [None] * cfg.world
    dist.all_gather_object(measured, {"forward_s": record.forward_s or 0.0, "backward_s": record.backward_s or 0.0,
                                      "stash_bytes": record.stash_bytes or 0,
                                      "fast_ratio": spread[0] / spread[2] if spread and spread[2] else 1.0})
    stash = [m["stash_bytes"] for m in measured]
    budgets = (budget.per_stage(cfg.world, cfg.microbatches, stash, executor.act_bytes) if budget is not None
               else None)
    if budgets is not None:
        executor.budget_bytes = budgets[cfg.rank]
    if cfg.schedule != "geopipe":
        return None, schedule
    geo = size_geopipe(cfg.world, cfg.microbatches, link_delay_s=cfg.link_delay_s,
                       link_bytes_per_s=[r / 8 for r in cfg.link_rate_bps], activation_bytes=executor.act_bytes,
                       forward_s=[m["forward_s"] for m in measured], backward_s=[m["backward_s"] for m in measured],
                       stash_bytes=stash, budget_bytes=budgets, fast_ratio=[m["fast_ratio"] for m in measured])
    schedule = S.build("geopipe", cfg.world, cfg.microbatches, geo)
    refuse_deadlock(schedule, cfg, [m["forward_s"] + m["backward_s"] for m in measured], executor.act_bytes)
    return geo, schedule


def _reference(cfg: WorkerConfig, chunks: list[Any], indices: list[int], total: int, shape: tuple[int, ...]) -> float:
    """This rank's uncontended compute (workloads/reference.py), all ranks at once after a barrier."""
    import torch.distributed as dist

    from workloads.model import loss_fn
    from workloads.reference import reference_compute_s

    data = _data(cfg, _model_cfg(cfg))
    x, y = data.next()
    dist.barrier()
    return reference_compute_s(chunks, [i == 0 for i in indices], [i == total - 1 for i in indices], cfg.microbatches,
                               shape, list(x.chunk(cfg.microbatches)), list(y.chunk(cfg.microbatches)), loss_fn)


def _model_cfg(cfg: WorkerConfig) -> Any:
    from workloads.model import GPTConfig

    return GPTConfig(**cfg.model)


def refuse_deadlock(schedule: Any, cfg: WorkerConfig, compute_s: list[float], activation_bytes: int) -> None:
    """Dry-run the schedule on the measured times before running it: one the simulator shows deadlocking
    (gloo's receiver-driven sends) fails at once with why, instead of hanging until the run's time-out."""
    from workloads.simulate import Costs, Deadlock, simulate

    half = [c / 2 for c in compute_s]
    try:
        simulate(schedule, Costs(half, half, cfg.link_delay_s, [r / 8 for r in cfg.link_rate_bps], activation_bytes,
                                 0, 0.0, None))
    except Deadlock as exc:
        raise RuntimeError(f"the {cfg.schedule} schedule sized for {cfg.world} stages would deadlock ({exc}); "
                           "run fewer stages (--stages) or another schedule") from None


def run_torch_reference(cfg: WorkerConfig, model_cfg: Any) -> RankTrace:
    """PyTorch's own torch.distributed.pipelining schedule on the same model, timed the same way. The
    multi-stage ones (interleaved, ZBV, DualPipeV) split the model into 2 x world chunks."""
    import torch
    from torch.distributed.pipelining import PipelineStage
    from torch.distributed.pipelining import schedules as torch_schedules

    from workloads.model import build_stages, loss_fn
    from workloads.transport import GlooTransport

    total = cfg.world * chunks_per_rank(cfg.schedule)
    indices = virtual_stages(cfg.schedule, cfg.rank, cfg.world)
    modules = build_stages(model_cfg, total, cfg.split if total == cfg.world else None)   # chunks: balanced
    chunks = [modules[i] for i in indices]
    optimizer = torch.optim.AdamW([p for c in chunks for p in c.parameters()], lr=cfg.lr)
    stages = [PipelineStage(c, i, total, torch.device("cpu")) for c, i in zip(chunks, indices, strict=True)]
    kind = getattr(torch_schedules, TORCH_SCHEDULES[cfg.schedule][0])
    schedule = kind(stages[0] if len(stages) == 1 else stages, cfg.microbatches, loss_fn=loss_fn)
    transport = GlooTransport()
    shape = (cfg.microbatch_size, model_cfg.block_size, model_cfg.n_embd)
    data = _data(cfg, model_cfg)
    iterations, reference = [], []
    for it in range(cfg.iterations + 1):
        x, y = data.next()
        if it == 1:
            reference.append(_reference(cfg, chunks, indices, total, shape))
        optimizer.zero_grad(set_to_none=True)
        transport.barrier()
        start = time.monotonic()
        losses: list[Any] = []
        args = (x,) if 0 in indices else ()
        kwargs = {"target": y, "losses": losses} if total - 1 in indices else {}
        schedule.step(*args, **kwargs)
        end = time.monotonic()
        optimizer.step()
        loss = float(sum(v.item() for v in losses) / len(losses)) if losses else None
        iterations.append(IterationRecord(iteration=it, warmup=it == 0, start=start, end=end, loss=loss))
        log("iteration", rank=cfg.rank, iteration=it, seconds=end - start, loss=loss)
    reference.append(_reference(cfg, chunks, indices, total, shape))
    return RankTrace(config=cfg, schedule=cfg.schedule, rank=cfg.rank, iterations=iterations,
                     transport=transport.name, reference_compute_s=reference)


def _thin(points: list[tuple[float, int]], keep: int = 400) -> list[tuple[float, int]]:
    if len(points) <= keep:
        return points
    step = len(points) / keep
    return [points[int(i * step)] for i in range(keep)] + [points[-1]]


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
