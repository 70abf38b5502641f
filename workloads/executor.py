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
from workloads.threadclock import ThreadClock, ThreadTimes
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
    cpu_s: float = 0.0
    """CPU the main thread ran over the whole iteration (spans and the executor's own work between them)."""
    runq_s: float = 0.0
    """Time the main thread waited for its core over the whole iteration."""

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
                 loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> None:
        self.stage, self.rank, self.stages = stage, rank, stages
        self.transport, self.shape, self.m = transport, activation_shape, microbatches
        self.loss_fn = loss_fn
        self.clock = time.monotonic
        self.act_bytes = int(torch.Size(activation_shape).numel()) * 4
        self.budget_bytes: int | None = None
        """In-flight bytes this stage may hold (None: no budget)."""
        self.param_storages = {p.untyped_storage().data_ptr() for p in stage.parameters()}

    def run(self, actions: list[Action], inputs: list[torch.Tensor] | None,
            targets: list[torch.Tensor] | None) -> IterationTrace:
        clock = ThreadClock()           # opened on the thread that runs the actions (its schedstat is read)
        begin = clock.now()
        trace = IterationTrace(start=begin.wall)

        def span(kind: str, mb: int, t0: ThreadTimes) -> None:
            t1 = clock.now()
            trace.spans.append(Span(kind, mb, t0.wall, t1.wall, t1.cpu - t0.cpu, t1.runq - t0.runq))
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
                    t0 = clock.now()
                    work.wait()
                    span("wait-F", a.mb, t0)
                    x = buf.requires_grad_()
                    account(-self.act_bytes)
                else:
                    assert inputs is not None
                    x = inputs[a.mb]
                outside = {t.untyped_storage().data_ptr() for t in (
                    inputs[a.mb] if self.rank == 0 and inputs else None,
                    targets[a.mb] if self.rank == self.stages - 1 and targets else None) if t is not None}
                saved = _SavedBytes(self.param_storages | outside)   # weights and the data batch are not in flight
                t0 = clock.now()
                with torch.autograd.graph.saved_tensors_hooks(saved.pack, saved.unpack):
                    out = self.stage(x)
                    if self.rank == self.stages - 1:
                        assert targets is not None
                        out = self.loss_fn(out, targets[a.mb]) / self.m
                span("F", a.mb, t0)
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
                    t0 = clock.now()
                    work.wait()
                    span("wait-B", a.mb, t0)
                    t0 = clock.now()
                    torch.autograd.backward(out, grad)
                else:
                    t0 = clock.now()
                    out.backward()
                span("B", a.mb, t0)
                account(-held - (self.act_bytes if self.rank < self.stages - 1 else 0))
                stash[a.mb] = (x, out, 0)
            elif a.op is Op.SEND_B:
                x = stash.pop(a.mb)[0]
                payload = x.grad.contiguous()
                sends.append((self.transport.isend(payload, self.rank - 1, tag_of("B", a.mb)), payload))
        t0 = clock.now()
        for work, _ in sends:
            work.wait()
        if sends:
            span("wait-send", -1, t0)
        end = clock.now()
        clock.close()
        trace.end, trace.cpu_s, trace.runq_s = end.wall, end.cpu - begin.cpu, end.runq - begin.runq
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
