"""The host's cost table for `--compute replay`: each stage's forward and backward of the real model, timed
per micro-batch in a quiet pass (one rank at a time, so no other stage computes on the machine meanwhile; a
stage of a deployment has an accelerator to itself), with the stash autograd keeps. Every rank gets the
whole table; rank 0 writes it as compute.json beside the run's traces."""

from __future__ import annotations

import platform
import time
from pathlib import Path
from typing import Any

from workloads.compute import CostTable, profile_table
from workloads.records import WorkerConfig

PASSES = 3
"""Timed passes over the iteration's micro-batches per stage (after WARM_UP untimed micro-batches)."""
WARM_UP = 2


def profile_host(cfg: WorkerConfig, shape: tuple[int, ...]) -> CostTable:
    import torch
    import torch.distributed as dist

    from workloads.model import build_stages, loss_fn
    from workloads.runs import data_for
    from workloads.stagecompute import Arithmetic

    stage = build_stages(cfg.model, cfg.world, cfg.split)[cfg.rank]
    compute = Arithmetic(stage, cfg.rank, cfg.world, shape, cfg.microbatches, loss_fn)
    x, y = data_for(cfg).next()
    inputs, targets = list(x.chunk(cfg.microbatches)), list(y.chunk(cfg.microbatches))
    gen = torch.Generator().manual_seed(0)
    received, upstream = torch.randn(shape, generator=gen), torch.randn(shape, generator=gen)
    last = cfg.rank == cfg.world - 1
    forward: list[float] = []
    backward: list[float] = []
    stash = 0
    for turn in range(cfg.world):
        dist.barrier()
        if turn != cfg.rank:
            continue
        for i in range(WARM_UP + PASSES * cfg.microbatches):
            mb = i % cfg.microbatches
            x_in = compute.input_for(mb, None if cfg.rank == 0 else received.clone(), inputs)
            t0 = time.perf_counter()
            kept, _, _ = compute.forward(mb, x_in, inputs, targets, None)
            t1 = time.perf_counter()
            compute.backward(kept, None if last else upstream, None)
            t2 = time.perf_counter()
            if i >= WARM_UP:
                forward.append(t1 - t0)
                backward.append(t2 - t1)
                stash = max(stash, kept.bytes)
        stage.zero_grad(set_to_none=True)
    gathered: list[Any] = [None] * cfg.world
    dist.all_gather_object(gathered, (cfg.rank, forward, backward, stash))
    values = {rank: (f, b, s) for rank, f, b, s in gathered}
    table = profile_table(values, compute.activation_bytes, cfg.microbatch_size,
                          cfg.microbatch_size * cfg.model.block_size,
                          f"profiled on {platform.node()} from the real model, each stage alone "
                          f"({PASSES} x {cfg.microbatches} micro-batches)")
    if cfg.rank == 0:
        table.save(Path(cfg.out_dir, "compute.json"))
    return table
