"""A stage's compute alone: the forward and backward of the same micro-batches with no communication, in
the worker's own process and pinning. It is the yardstick for a bubble that no busy host can flatter:
1 - reference / step time (a schedule whose overlap stretches its own spans gains nothing from that)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import torch
from torch import nn


def reference_compute_s(chunks: Sequence[nn.Module], firsts: Sequence[bool], lasts: Sequence[bool],
                        microbatches: int, activation_shape: tuple[int, ...],
                        inputs: list[torch.Tensor], targets: list[torch.Tensor],
                        loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> float:
    """Seconds of F+B for `microbatches` micro-batches through every chunk this rank holds (one per virtual
    stage), inputs made locally; gradients are cleared afterwards (nothing of it reaches training)."""
    gen = torch.Generator().manual_seed(0)
    received = torch.randn(activation_shape, generator=gen)
    upstream = torch.randn(activation_shape, generator=gen)
    total = 0.0
    for chunk, first, last in zip(chunks, firsts, lasts, strict=True):
        for mb in range(microbatches):
            x = inputs[mb] if first else received.clone().requires_grad_()
            t0 = time.perf_counter()
            out = chunk(x)
            if last:
                loss_fn(out, targets[mb]).backward()
            else:
                torch.autograd.backward(out, upstream)
            total += time.perf_counter() - t0
        chunk.zero_grad(set_to_none=True)
    return total
