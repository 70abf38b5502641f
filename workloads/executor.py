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

from workloads.memory import BudgetExceeded
from workloads.records import Span
from workloads.schedule import Action, Op, posting_order
from workloads.stagecompute import Arithmetic, Interval, Stashed, Timed
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
    send_lag_s: list[float] = field(default_factory=list)
    """Per send, in order: from its F's or B's return (a timed span's actual end) to when the transport began to
    post it (the executor's and the sender thread's own time before the message can leave)."""
    recv_lag_s: list[float] = field(default_factory=list)
    """Per receive, in order: from the end of this stage's compute before it (or the iteration's start) to its
    post (the executor's own time before the receive's notice can leave)."""

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
    """Executes schedules for one pipeline stage: one handler per kind of action, the stage's F and B done by
    `compute` (the model's arithmetic, or time from a cost table: workloads/stagecompute.py)."""

    def __init__(self, compute: Arithmetic | Timed, rank: int, stages: int, transport: Transport,
                 microbatches: int) -> None:
        self.compute, self.rank, self.stages = compute, rank, stages
        self.transport, self.m = transport, microbatches
        self.clock = time.monotonic
        self.act_bytes = compute.activation_bytes
        """Bytes of one activation (or gradient) message as the memory budget counts it."""
        self.budget_bytes: int | None = None
        """In-flight bytes this stage may hold (None: no budget)."""
        self.handlers: dict[Op, Callable[[_Iteration, Action], None]] = {
            Op.RECV_F: self._recv_f, Op.RECV_B: self._recv_b, Op.FORWARD: self._forward,
            Op.SEND_F: self._send_f, Op.BACKWARD: self._backward, Op.SEND_B: self._send_b}

    @classmethod
    def arithmetic(cls, stage: torch.nn.Module, rank: int, stages: int, transport: Transport,
                   activation_shape: tuple[int, ...], microbatches: int,
                   loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> StageExecutor:
        """An executor that runs `stage`'s own forward and backward (real compute)."""
        return cls(Arithmetic(stage, rank, stages, activation_shape, microbatches, loss_fn), rank, stages, transport,
                   microbatches)

    def posting_order(self, actions: list[Action]) -> list[Action]:
        """The rank's actions as this executor posts them (workloads/schedule.py: posting_order)."""
        return posting_order(actions, self.transport.receives_before_sends)

    def run(self, actions: list[Action], inputs: list[torch.Tensor] | None,
            targets: list[torch.Tensor] | None) -> IterationTrace:
        """Run one iteration of the rank's scheduled `actions`, in posting order."""
        actions = self.posting_order(actions)
        clock = ThreadClock()           # opened on the thread that runs the actions (its schedstat is read)
        try:
            begin = clock.now()
            it = _Iteration(clock, IterationTrace(start=begin.wall), inputs, targets, last_end=begin.wall)
            self.compute.start_iteration(begin.wall)
            for i, a in enumerate(actions):
                it.action, it.following = a, actions[i + 1] if i + 1 < len(actions) else None
                if a in it.posted:                  # a send its F or B already posted
                    it.posted.discard(a)
                    continue
                self.handlers[a.op](it, a)
            t0 = clock.now()
            for work, _ in it.sends:
                work.wait()
            for (work, _), (ready, called) in zip(it.sends, it.send_times, strict=True):
                started = getattr(work, "started", None)        # a sender thread's; else the executor's call
                it.trace.send_lag_s.append((called if started is None else started) - ready)
            if it.sends:
                it.span("wait-send", -1, t0)
            end = clock.now()
        finally:
            clock.close()
        trace = it.trace
        trace.end, trace.cpu_s, trace.runq_s = end.wall, end.cpu - begin.cpu, end.runq - begin.runq
        trace.loss = sum(it.losses) / len(it.losses) if it.losses else None
        return trace

    def _account(self, it: _Iteration, delta: int) -> None:
        it.inflight += delta
        it.trace.memory.append((self.clock(), it.inflight))
        it.trace.peak_inflight_bytes = max(it.trace.peak_inflight_bytes, it.inflight)
        if self.budget_bytes is not None and it.inflight > self.budget_bytes:
            raise BudgetExceeded(f"stage {self.rank} holds {it.inflight} B in flight, over its memory budget of "
                                 f"{self.budget_bytes} B (after {it.action})")

    def _recv_f(self, it: _Iteration, a: Action) -> None:
        it.trace.recv_lag_s.append(self.clock() - it.last_end)
        buf = self.compute.buffer(self.rank - 1)
        it.recv_f[a.mb] = (buf, self.transport.irecv(buf, self.rank - 1, tag_of("F", a.mb)))
        self._account(it, self.act_bytes)

    def _recv_b(self, it: _Iteration, a: Action) -> None:
        it.trace.recv_lag_s.append(self.clock() - it.last_end)
        buf = self.compute.buffer(self.rank)
        it.recv_b[a.mb] = (buf, self.transport.irecv(buf, self.rank + 1, tag_of("B", a.mb)))
        self._account(it, self.act_bytes)

    def _forward(self, it: _Iteration, a: Action) -> None:
        received, ready = None, None
        if self.rank > 0:
            received, work = it.recv_f.pop(a.mb)
            ready = it.wait("wait-F", a.mb, work)
            self._account(it, -self.act_bytes)
        x = self.compute.input_for(a.mb, received, it.inputs)
        t0 = it.clock.now()
        kept, loss, interval = self.compute.forward(a.mb, x, it.inputs, it.targets, ready)
        t1 = it.clock.now()
        it.computed[("F", a.mb)] = it.last_end = t1.wall if interval is None else interval.actual_end
        if it.following == Action(Op.SEND_F, a.mb):       # its message leaves before the span's bookkeeping
            self._post_f(it, a.mb, kept)
            it.posted.add(it.following)
        it.span("F", a.mb, t0, interval, t1)
        it.stash[a.mb] = kept
        it.trace.stash_bytes.append(kept.bytes)
        self._account(it, kept.bytes)
        if loss is not None:
            it.losses.append(loss)

    def _send_f(self, it: _Iteration, a: Action) -> None:
        self._post_f(it, a.mb, it.stash[a.mb])

    def _post_f(self, it: _Iteration, mb: int, kept: Stashed) -> None:
        payload = self.compute.forward_payload(kept)
        it.send_times.append((it.computed[("F", mb)], self.clock()))
        it.sends.append((self.transport.isend(payload, self.rank + 1, tag_of("F", mb)), payload))

    def _backward(self, it: _Iteration, a: Action) -> None:
        kept = it.stash[a.mb]
        grad, ready = None, None
        if self.rank < self.stages - 1:
            grad, work = it.recv_b.pop(a.mb)
            ready = it.wait("wait-B", a.mb, work)
        t0 = it.clock.now()
        interval = self.compute.backward(kept, grad, ready)
        t1 = it.clock.now()
        it.computed[("B", a.mb)] = it.last_end = t1.wall if interval is None else interval.actual_end
        # the stash is free once B returns (the receives posted after it count on it)
        self._account(it, -kept.bytes - (self.act_bytes if self.rank < self.stages - 1 else 0))
        if it.following == Action(Op.SEND_B, a.mb):       # its message leaves before the span's bookkeeping
            self._post_b(it, a.mb, it.stash.pop(a.mb))
            it.posted.add(it.following)
        it.span("B", a.mb, t0, interval, t1)
        kept.bytes = 0

    def _send_b(self, it: _Iteration, a: Action) -> None:
        self._post_b(it, a.mb, it.stash.pop(a.mb))

    def _post_b(self, it: _Iteration, mb: int, kept: Stashed) -> None:
        payload = self.compute.backward_payload(kept)
        it.send_times.append((it.computed[("B", mb)], self.clock()))
        it.sends.append((self.transport.isend(payload, self.rank - 1, tag_of("B", mb)), payload))


@dataclass(slots=True)
class _Iteration:
    """One iteration's state as the handlers share it."""

    clock: ThreadClock
    trace: IterationTrace
    inputs: list[torch.Tensor] | None
    targets: list[torch.Tensor] | None
    action: Action | None = None
    following: Action | None = None
    """The action after this one: a send that follows its F or B is posted as soon as the compute returns."""
    posted: set[Action] = field(default_factory=set)
    """Sends already posted by the F or B before them (their own action then does nothing)."""
    computed: dict[tuple[str, int], float] = field(default_factory=dict)
    """When each F and B returned, by (kind, micro-batch) (with compute as time its actual end, not its deadline:
    a late span's lateness is its own, in the span, not its message's lag)."""
    last_end: float = 0.0
    """When this stage's last F or B returned (the iteration's start before the first)."""
    send_times: list[tuple[float, float]] = field(default_factory=list)
    """Per send, in order: (its compute's end, when the executor handed it to the transport)."""
    recv_f: dict[int, tuple[torch.Tensor, Work]] = field(default_factory=dict)
    recv_b: dict[int, tuple[torch.Tensor, Work]] = field(default_factory=dict)
    stash: dict[int, Stashed] = field(default_factory=dict)
    sends: list[tuple[Work, torch.Tensor]] = field(default_factory=list)
    inflight: int = 0
    losses: list[float] = field(default_factory=list)

    def span(self, kind: str, mb: int, t0: ThreadTimes, interval: Interval | None = None,
             t1: ThreadTimes | None = None) -> None:
        """Record a span from `t0` to `t1` (default: now); a timed span keeps the device's planned interval beside
        when it really woke and ended, and its lateness."""
        t1 = t1 or self.clock.now()
        cpu, runq = t1.cpu - t0.cpu, t1.runq - t0.runq
        if interval is None:
            self.trace.spans.append(Span(kind, mb, t0.wall, t1.wall, cpu, runq))
            return
        self.trace.spans.append(Span(kind, mb, interval.start, interval.end, cpu, runq, interval.late_s,
                                     interval.woke, interval.actual_end))

    def wait(self, kind: str, mb: int, work: Work) -> float | None:
        """Block on a receive, recorded as a wait span. Returns when its data arrived: None where it was there
        before the wait began (it constrains nothing), else when the wait returned."""
        t0 = self.clock.now()
        done = getattr(work, "is_completed", None)
        already = bool(done()) if callable(done) else False
        work.wait()
        self.span(kind, mb, t0)
        return None if already else self.trace.spans[-1].end
