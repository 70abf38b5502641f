"""A pipelined real-arithmetic run against the same training in one process: the whole model (the stages'
initialisation, `build_reference`), the same batches in the same order (`data_for`'s seed), the same optimizer
(AdamW at the run's lr) for as many steps; its losses per step and its last step's gradients, to compare with
the stages' dumped gradients (`--dump-gradients`) stage by stage."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from workloads.data import batches
from workloads.model import _reference_name, build_reference, layer_split, loss_fn
from workloads.records import GPTConfig


@dataclass(frozen=True, slots=True)
class OneProcess:
    """The single-process training's losses (one per step, the mean over micro-batches) and last gradients."""

    losses: list[float]
    grads: dict[str, torch.Tensor]


def train_in_one_process(model: GPTConfig, microbatches: int, microbatch_size: int, steps: int, lr: float,
                         seed: int) -> OneProcess:
    """`steps` optimizer steps of the whole model, each on one batch of `microbatches` micro-batches."""
    net = build_reference(model)
    optimizer = torch.optim.AdamW(net.parameters(), lr=lr)
    data = batches(microbatches * microbatch_size, model.block_size, seed)
    losses = []
    for _ in range(steps):
        x, y = data.next()
        optimizer.zero_grad(set_to_none=True)
        loss = sum(loss_fn(net(a), b) for a, b in zip(x.chunk(microbatches), y.chunk(microbatches), strict=True))
        loss = loss / microbatches
        loss.backward()
        losses.append(loss.item())
        optimizer.step()
    return OneProcess(losses, {n: p.grad.detach().clone() for n, p in net.named_parameters() if p.grad is not None})


def largest_gradient_gap(run_dir: Path, reference: OneProcess, model: GPTConfig, stages: int,
                         split: list[int] | None = None) -> float:
    """The largest |pipelined - one process| over every gradient element, relative to the largest gradient of
    its tensor (so a tensor of near-zero gradients cannot inflate it); the files are `grads-rank-R.pt`."""
    gap = 0.0
    for rank, (first, _last) in enumerate(layer_split(model.n_layer, stages, split)):
        grads = torch.load(run_dir / f"grads-rank-{rank}.pt")
        for name, grad in grads.items():
            want = reference.grads[_reference_name(name, first)]
            scale = float(want.abs().max()) or 1.0
            gap = max(gap, float((grad - want).abs().max()) / scale)
    return gap
