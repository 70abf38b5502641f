"""A stage's compute alone: the forward and backward of the same micro-batches with no communication, in
the worker's own process and pinning. It is the yardstick for a bubble that no busy host can flatter:
1 - reference / step time (a schedule whose overlap stretches its own spans gains nothing from that)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import torch
from torch import nn

from workloads.threadclock import ThreadClock


def reference_compute_s(chunks: Sequence[nn.Module], firsts: Sequence[bool], lasts: Sequence[bool],
                        microbatches: int, activation_shape: tuple[int, ...],
                        inputs: list[torch.Tensor], targets: list[torch.Tensor],
                        loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
                        between: Callable[[int], None] | None = None, between_cpu_counts: bool = False) -> float:
    """Seconds of F+B for `microbatches` micro-batches through every chunk this rank holds (one per virtual
    stage), inputs made locally; gradients are cleared afterwards (nothing of it reaches training).
    `between(mb)`, where given, runs after each micro-batch (the loaded reference posts that micro-batch's
    messages there): the time the thread waited for its core meanwhile (other threads, e.g. the sender thread it
    woke, held it: schedstat's run-queue delay) is counted, and its own CPU only where `between_cpu_counts` (a
    transport that writes each send in the posting thread: the kernel's send path runs there)."""
    clock = ThreadClock()
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
            if between is not None:             # its own work is not the compute's; the core taken from it meanwhile is
                before = clock.now()
                between(mb)
                after = clock.now()
                total += after.runq - before.runq + (after.cpu - before.cpu if between_cpu_counts else 0.0)
        chunk.zero_grad(set_to_none=True)
    clock.close()
    return total
