"""Run one rank's action list for one iteration, timing every compute span and every wait.

Memory (workloads/memory.py defines it): per pending micro-batch, the storages autograd saved for its
backward (saved-tensor hooks; parameters excluded) plus the stage's input and output kept for it, each
storage once; plus every posted receive buffer (activations and gradients) not yet consumed. Its peak is
recorded, and a stage that goes over its budget stops the run with both figures.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from workloads.memory import BudgetExceeded
from workloads.records import Span
from workloads.schedule import Action, Op
from workloads.transport import Transport, Work


def tag_of(direction: str, mb: int) -> int:
    return 2 * mb + (0 if direction == "F" else 1)


@dataclass(slots=True)
class IterationTrace:
    start: float
    end: float = 0.0
    spans: list[Span] = field(default_factory=list)
    memory: list[tuple[float, int]] = field(default_factory=list)
    """(time, in-flight activation bytes) after each change."""
    peak_inflight_bytes: int = 0
    loss: float | None = None
    stash_bytes: list[int] = field(default_factory=list)

    @property
    def compute_s(self) -> float:
        return sum(s.end - s.start for s in self.spans if s.kind in ("F", "B"))

    @property
    def wait_s(self) -> float:
        return sum(s.end - s.start for s in self.spans if s.kind.startswith("wait"))

    def mean_compute(self, kind: str) -> float:
        spans = [s.end - s.start for s in self.spans if s.kind == kind]
        return sum(spans) / len(spans) if spans else 0.0


class StageExecutor:
    """Executes schedules for one pipeline stage."""

    def __init__(self, stage: nn.Module, rank: int, stages: int, transport: Transport,
                 activation_shape: tuple[int, ...], microbatches: int,
                 loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.stage, self.rank, self.stages = stage, rank, stages
        self.transport, self.shape, self.m = transport, activation_shape, microbatches
        self.loss_fn, self.clock = loss_fn, clock
        self.act_bytes = int(torch.Size(activation_shape).numel()) * 4
        self.budget_bytes: int | None = None
        """In-flight bytes this stage may hold (None: no budget)."""
        self.param_storages = {p.untyped_storage().data_ptr() for p in stage.parameters()}

    def run(self, actions: list[Action], inputs: list[torch.Tensor] | None,
            targets: list[torch.Tensor] | None) -> IterationTrace:
        trace = IterationTrace(start=self.clock())
        recv_f: dict[int, tuple[torch.Tensor, Work]] = {}
        recv_b: dict[int, tuple[torch.Tensor, Work]] = {}
        stash: dict[int, tuple[torch.Tensor, torch.Tensor, int]] = {}   # mb -> (input, output-or-loss, bytes)
        sends: list[tuple[Work, torch.Tensor]] = []
        inflight = 0
        losses = []

        def account(delta: int) -> None:
            nonlocal inflight
            inflight += delta
            trace.memory.append((self.clock(), inflight))
            trace.peak_inflight_bytes = max(trace.peak_inflight_bytes, inflight)
            if self.budget_bytes is not None and inflight > self.budget_bytes:
                raise BudgetExceeded(f"stage {self.rank} holds {inflight} B in flight, over its memory budget of "
                                     f"{self.budget_bytes} B (after {a})")

        for a in actions:
            if a.op is Op.RECV_F:
                buf = torch.empty(self.shape)
                recv_f[a.mb] = (buf, self.transport.irecv(buf, self.rank - 1, tag_of("F", a.mb)))
                account(self.act_bytes)
            elif a.op is Op.RECV_B:
                buf = torch.empty(self.shape)
                recv_b[a.mb] = (buf, self.transport.irecv(buf, self.rank + 1, tag_of("B", a.mb)))
                account(self.act_bytes)
            elif a.op is Op.FORWARD:
                if self.rank > 0:
                    buf, work = recv_f.pop(a.mb)
                    t0 = self.clock()
                    work.wait()
                    trace.spans.append(Span("wait-F", a.mb, t0, self.clock()))
                    x = buf.requires_grad_()
                    account(-self.act_bytes)
                else:
                    assert inputs is not None
                    x = inputs[a.mb]
                outside = {t.untyped_storage().data_ptr() for t in (
                    inputs[a.mb] if self.rank == 0 and inputs else None,
                    targets[a.mb] if self.rank == self.stages - 1 and targets else None) if t is not None}
                saved = _SavedBytes(self.param_storages | outside)   # weights and the data batch are not in flight
                t0 = self.clock()
                with torch.autograd.graph.saved_tensors_hooks(saved.pack, saved.unpack):
                    out = self.stage(x)
                    if self.rank == self.stages - 1:
                        assert targets is not None
                        out = self.loss_fn(out, targets[a.mb]) / self.m
                trace.spans.append(Span("F", a.mb, t0, self.clock()))
                saved.pack(x)           # a received input is kept for the backward (its gradient goes back)
                saved.pack(out)         # and the output whose graph the backward runs, even if not saved
                stash[a.mb] = (x, out, saved.total)
                trace.stash_bytes.append(saved.total)
                account(saved.total)
                if self.rank == self.stages - 1:
                    losses.append(out.item() * self.m)
            elif a.op is Op.SEND_F:
                payload = stash[a.mb][1].detach().contiguous()
                sends.append((self.transport.isend(payload, self.rank + 1, tag_of("F", a.mb)), payload))
            elif a.op is Op.BACKWARD:
                x, out, held = stash.pop(a.mb)
                if self.rank < self.stages - 1:
                    grad, work = recv_b.pop(a.mb)
                    t0 = self.clock()
                    work.wait()
                    trace.spans.append(Span("wait-B", a.mb, t0, self.clock()))
                    t0 = self.clock()
                    torch.autograd.backward(out, grad)
                else:
                    t0 = self.clock()
                    out.backward()
                trace.spans.append(Span("B", a.mb, t0, self.clock()))
                account(-held - (self.act_bytes if self.rank < self.stages - 1 else 0))
                stash[a.mb] = (x, out, 0)
            elif a.op is Op.SEND_B:
                x = stash.pop(a.mb)[0]
                payload = x.grad.contiguous()
                sends.append((self.transport.isend(payload, self.rank - 1, tag_of("B", a.mb)), payload))
        t0 = self.clock()
        for work, _ in sends:
            work.wait()
        if sends:
            trace.spans.append(Span("wait-send", -1, t0, self.clock()))
        trace.end = self.clock()
        trace.loss = sum(losses) / len(losses) if losses else None
        return trace


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
