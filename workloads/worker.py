"""One pipeline rank, run inside one emulated host: `python -m workloads.worker CONFIG.json`.

Rendezvous over the emulated network (gloo, TCP store on rank 0), one warm-up iteration (excluded from
metrics; for geopipe it runs 1F1B and measures the per-micro-batch compute time and stash size from which
every rank derives the same GeoPipe plan), then timed iterations. Progress goes to stdout as JSON lines;
the per-rank trace is written to OUT/rank-<r>.json.
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
    from workloads.model import GPTConfig
    dist.init_process_group("gloo", init_method=f"tcp://{cfg.master_addr}:{cfg.master_port}", rank=cfg.rank,
                            world_size=cfg.world, timeout=__import__("datetime").timedelta(seconds=cfg.timeout_s))
    log("ready", rank=cfg.rank)
    model_cfg = GPTConfig(**cfg.model)
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


def run_ours(cfg: WorkerConfig, model_cfg: Any) -> RankTrace:
    import torch
    import torch.distributed as dist

    from workloads import schedule as S
    from workloads.executor import StageExecutor
    from workloads.model import build_stages, loss_fn
    from workloads.transport import GlooTransport

    stage = build_stages(model_cfg, cfg.world, cfg.split)[cfg.rank]
    optimizer = torch.optim.AdamW(stage.parameters(), lr=cfg.lr)
    transport = GlooTransport()
    shape = (cfg.microbatch_size, model_cfg.block_size, model_cfg.n_embd)
    executor = StageExecutor(stage, cfg.rank, cfg.world, transport, shape, cfg.microbatches, loss_fn)
    data = _data(cfg, model_cfg)
    first_name = "1f1b" if cfg.schedule == "geopipe" else cfg.schedule
    schedule = S.build(first_name, cfg.world, cfg.microbatches)
    geo = None
    iterations = []
    for it in range(cfg.iterations + 1):
        x, y = data.next()
        inputs = list(x.chunk(cfg.microbatches)) if cfg.rank == 0 else None
        targets = list(y.chunk(cfg.microbatches)) if cfg.rank == cfg.world - 1 else None
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
        if it == 0 and cfg.schedule == "geopipe":
            measured = [None] * cfg.world
            dist.all_gather_object(measured, {"compute_s": (record.forward_s or 0.0) + (record.backward_s or 0.0),
                                              "stash_bytes": record.stash_bytes or 0})
            act_bytes = executor.act_bytes
            geo = S.size_geopipe(cfg.world, cfg.microbatches, link_delay_s=cfg.link_delay_s,
                                 link_bytes_per_s=[r / 8 for r in cfg.link_rate_bps], activation_bytes=act_bytes,
                                 compute_s=[m["compute_s"] for m in measured],
                                 stash_bytes=[m["stash_bytes"] for m in measured], memory_budget=cfg.memory_budget)
            schedule = S.build("geopipe", cfg.world, cfg.microbatches, geo)
            refuse_deadlock(schedule, cfg, [m["compute_s"] for m in measured], act_bytes)
    return RankTrace(config=cfg, schedule=cfg.schedule, rank=cfg.rank, iterations=iterations,
                     actions=[str(a) for a in schedule[cfg.rank]], geopipe_sizing=geo,
                     activation_bytes=executor.act_bytes, transport=transport.name)


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
    """PyTorch's own torch.distributed.pipelining schedule on the same model, timed the same way."""
    import torch
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    from workloads.model import build_stages, loss_fn
    from workloads.transport import GlooTransport

    stage_module = build_stages(model_cfg, cfg.world, cfg.split)[cfg.rank]
    optimizer = torch.optim.AdamW(stage_module.parameters(), lr=cfg.lr)
    stage = PipelineStage(stage_module, cfg.rank, cfg.world, torch.device("cpu"))
    kind = Schedule1F1B if cfg.schedule == "torch-1f1b" else ScheduleGPipe
    schedule = kind(stage, cfg.microbatches, loss_fn=loss_fn)
    transport = GlooTransport()
    data = _data(cfg, model_cfg)
    iterations = []
    for it in range(cfg.iterations + 1):
        x, y = data.next()
        optimizer.zero_grad(set_to_none=True)
        transport.barrier()
        start = time.monotonic()
        losses: list[Any] = []
        if cfg.rank == 0:
            schedule.step(x)
        elif cfg.rank == cfg.world - 1:
            schedule.step(target=y, losses=losses)
        else:
            schedule.step()
        end = time.monotonic()
        optimizer.step()
        loss = float(sum(v.item() for v in losses) / len(losses)) if losses else None
        iterations.append(IterationRecord(iteration=it, warmup=it == 0, start=start, end=end, loss=loss))
        log("iteration", rank=cfg.rank, iteration=it, seconds=end - start, loss=loss)
    return RankTrace(config=cfg, schedule=cfg.schedule, rank=cfg.rank, iterations=iterations,
                     transport=transport.name)


def _thin(points: list[tuple[float, int]], keep: int = 400) -> list[tuple[float, int]]:
    if len(points) <= keep:
        return points
    step = len(points) / keep
    return [points[int(i * step)] for i in range(keep)] + [points[-1]]


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
