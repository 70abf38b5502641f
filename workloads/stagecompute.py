"""What a stage's F and B do inside the executor: the model's arithmetic, or a wait to a deadline.

Both give the executor the same things: a receive buffer per link, the bytes a micro-batch holds (the
memory budget counts them), what to send. `Arithmetic` runs the stage module (autograd's saved tensors are
the stash). `Timed` runs no arithmetic: a span's length comes from a cost table (workloads/compute.py) and
it ends at an absolute CLOCK_MONOTONIC deadline on a virtual device timeline: a span starts when the device is
free (the previous span's deadline) or when its input arrived, whichever is later, so the lateness of one
wake-up or the executor's own work between spans does not push every later span (a chain of relative sleeps
would add them up). Each span keeps its planned interval and when it really woke and ended: after a late
wake-up the next spans' deadlines may have passed, so they end at once, late, and say so.
"""

from __future__ import annotations

import ctypes
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from workloads.compute import CostTable

PR_SET_TIMERSLACK = 29
MAX_WAKE_EARLY_S = 200e-6
"""A timed span spins at most this long before its deadline (a host whose wake-ups are later than that is late)."""
WAKE_MARGIN_S = 20e-6
"""Wake this much earlier than the sleeps' learnt lateness (their jitter)."""


@dataclass(slots=True)
class Stashed:
    """What a stage keeps for one micro-batch between its F and B."""

    inputs: Any
    output: Any
    bytes: int


@dataclass(frozen=True, slots=True)
class Interval:
    """A compute span on the device's timeline (monotonic seconds): planned `start` and `end` (its deadline),
    when the wait for it really woke and when it really returned."""

    start: float
    end: float
    woke: float
    """When its sleep returned (where it did not sleep, the deadline being near or past: when its wait began)."""
    actual_end: float
    """When the span returned to the executor (its message can leave no earlier)."""

    @property
    def late_s(self) -> float:
        """Actual end less planned end (>= 0: the span spins until its deadline)."""
        return self.actual_end - self.end


class Arithmetic:
    """The model's own forward and backward on this CPU."""

    timed = False

    def __init__(self, stage: nn.Module, rank: int, stages: int, activation_shape: tuple[int, ...], microbatches: int,
                 loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> None:
        self.stage, self.rank, self.stages, self.shape, self.m = stage, rank, stages, activation_shape, microbatches
        self.loss_fn = loss_fn
        self.activation_bytes = int(torch.Size(activation_shape).numel()) * 4
        self.param_storages = {p.untyped_storage().data_ptr() for p in stage.parameters()}

    def buffer(self, link: int) -> torch.Tensor:
        return torch.empty(self.shape)

    def forward(self, mb: int, x: torch.Tensor, inputs: list[torch.Tensor] | None,
                targets: list[torch.Tensor] | None, ready: float | None) -> tuple[Stashed, float | None, Interval | None]:
        """(what is kept for the backward, the loss on the last stage, None: the executor times the span)."""
        last = self.rank == self.stages - 1
        outside = {t.untyped_storage().data_ptr() for t in (
            inputs[mb] if self.rank == 0 and inputs else None,
            targets[mb] if last and targets else None) if t is not None}
        saved = _SavedBytes(self.param_storages | outside)   # weights and the data batch are not in flight
        with torch.autograd.graph.saved_tensors_hooks(saved.pack, saved.unpack):
            out = self.stage(x)
            if last:
                assert targets is not None
                out = self.loss_fn(out, targets[mb]) / self.m
        saved.pack(x)           # a received input is kept for the backward (its gradient goes back)
        saved.pack(out)         # and the output whose graph the backward runs, even if not saved
        return Stashed(x, out, saved.total), (out.item() * self.m if last else None), None

    def backward(self, kept: Stashed, grad: torch.Tensor | None, ready: float | None) -> Interval | None:
        if grad is None:
            kept.output.backward()
        else:
            torch.autograd.backward(kept.output, grad)
        return None

    def forward_payload(self, kept: Stashed) -> torch.Tensor:
        return kept.output.detach().contiguous()

    def backward_payload(self, kept: Stashed) -> torch.Tensor:
        return kept.inputs.grad.contiguous()

    def input_for(self, mb: int, received: torch.Tensor | None, inputs: list[torch.Tensor] | None) -> Any:
        if received is not None:
            return received.requires_grad_()
        assert inputs is not None
        return inputs[mb]

    def start_iteration(self, at: float) -> None:
        return None


class Timed:
    """Compute as time: F and B of `stage` (a pipeline stage's index in the table) take the table's median,
    ending at absolute deadlines on the device's timeline; messages carry the table's wire bytes."""

    timed = True

    def __init__(self, table: CostTable, stage: int, stages: int) -> None:
        self.table, self.stage, self.stages = table, stage, stages
        self.cost = table.stages[stage]
        self.activation_bytes = table.activation_bytes
        self.free_at = 0.0
        self.wake_early_s = 0.0
        """How long before a deadline the sleep ends (the spin covers the rest): the sleeps' own lateness, learnt."""
        self._payload: dict[int, torch.Tensor] = {}
        set_timer_slack_ns(1)

    def wire(self, link: int) -> torch.Tensor:
        """The message over the link between stage `link` and `link + 1` (one per link, reused: only its size
        and timing matter)."""
        if link not in self._payload:
            self._payload[link] = torch.zeros(self.table.wire_bytes(link) // 4)
        return self._payload[link]

    def buffer(self, link: int) -> torch.Tensor:
        return torch.empty(self.table.wire_bytes(link) // 4)

    def start_iteration(self, at: float) -> None:
        self.free_at = at

    def _run(self, seconds: float, ready: float | None) -> Interval:
        start = self.free_at if ready is None else max(self.free_at, ready)
        deadline = start + seconds
        now = woke = time.monotonic()
        if deadline - self.wake_early_s > now:      # clock_nanosleep to a CLOCK_MONOTONIC time (CPython >= 3.11)
            self._sleep(deadline - self.wake_early_s - now)
            woke = time.monotonic()
            # the sleep's own lateness, learnt: wake that much before the deadline next time, spin the rest
            late_wake = woke - (deadline - self.wake_early_s)
            self.wake_early_s = min(MAX_WAKE_EARLY_S, max(0.0, 0.9 * self.wake_early_s + 0.1 * (late_wake + WAKE_MARGIN_S)))
        while time.monotonic() < deadline:
            pass
        self.free_at = deadline
        return Interval(start, deadline, woke, time.monotonic())

    def _sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    def forward(self, mb: int, x: Any, inputs: Any, targets: Any, ready: float | None
                ) -> tuple[Stashed, float | None, Interval | None]:
        interval = self._run(self.cost.forward.median_s, ready)
        return Stashed(None, None, self.cost.stash_bytes), None, interval

    def backward(self, kept: Stashed, grad: Any, ready: float | None) -> Interval | None:
        return self._run(self.cost.backward.median_s, ready)

    def forward_payload(self, kept: Stashed) -> torch.Tensor:
        return self.wire(self.stage)

    def backward_payload(self, kept: Stashed) -> torch.Tensor:
        return self.wire(self.stage - 1)

    def input_for(self, mb: int, received: Any, inputs: Any) -> Any:
        return None


_slack_warned = False
"""The timer slack's failure has been said (once per process)."""


def _prctl() -> Callable[..., int]:
    return ctypes.CDLL(None, use_errno=True).prctl


def set_timer_slack_ns(ns: int) -> bool:
    """Wake-ups as close to their deadline as the kernel allows (the default slack is 50 us). Where the kernel
    refuses, the process's stderr (the worker's log) says so once: its wake-ups keep the default slack."""
    global _slack_warned
    try:
        failed = _prctl()(PR_SET_TIMERSLACK, ctypes.c_ulong(ns), 0, 0, 0) != 0
        why = os.strerror(ctypes.get_errno()) if failed else ""
    except (OSError, AttributeError) as exc:
        failed, why = True, str(exc)
    if failed and not _slack_warned:
        _slack_warned = True
        print(f"warning: prctl(PR_SET_TIMERSLACK, {ns}) failed ({why}): timed spans wake with the default timer "
              "slack (~50 us later)", file=sys.stderr, flush=True)
    return not failed


class _SavedBytes:
    """Saved-tensor hooks that add up the bytes autograd keeps for one micro-batch's backward: each storage
    once, the stage's parameters never (they are not the micro-batch's)."""

    def __init__(self, exclude: set[int]) -> None:
        self.total = 0
        self.seen: set[int] = set(exclude)

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        ptr = t.untyped_storage().data_ptr()
        if ptr not in self.seen:
            self.seen.add(ptr)
            self.total += t.untyped_storage().nbytes()
        return t

    @staticmethod
    def unpack(t: torch.Tensor) -> torch.Tensor:
        return t
