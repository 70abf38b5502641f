"""Compute as time in the executor (workloads/stagecompute.py's Timed), threads over LocalTransport: every F and B
span lasts exactly the table's time on a virtual device timeline (a span starts at the previous deadline or when
its input arrived); the iteration is what the discrete-event model predicts for the same schedule and table; a
late wake-up does not push the later spans (absolute deadlines, not a chain of sleeps); the memory budget counts
the table's bytes; messages carry the table's wire bytes; no arithmetic runs and there is no loss."""

from __future__ import annotations

import statistics
import threading
import time
import types

import pytest
import torch

import workloads.stagecompute as stagecompute
from testbed.topology.profile import find_profile, load_profile
from workloads import schedule as S
from workloads.compute import CostTable, PhaseCost, StageCost
from workloads.executor import IterationTrace, StageExecutor, tag_of
from workloads.memory import BudgetExceeded
from workloads.simulate import Costs, simulate
from workloads.stagecompute import Timed
from workloads.transport import LocalHub, LocalTransport

STAGES, M = 4, 8
SHRINK = 0.5
"""The profile's 4-stage times at its whole-job-MFU variant (8 layers: ~39 ms F, ~78 ms B) halved to ~20 ms F,
~40 ms B: an iteration of ~0.7 s, long beside the executor's own hops between threads (~0.1-1 ms each on a busy 2-core host)."""
EXACT = 1e-9


def _shrunk(table: CostTable, k: float) -> CostTable:
    stages = [StageCost(PhaseCost.stated(s.forward.median_s * k), PhaseCost.stated(s.backward.median_s * k),
                        s.stash_bytes) for s in table.stages]
    return CostTable(table.source, table.description, stages, table.activation_bytes, table.microbatch_size,
                     list(table.rate_scale), table.hbm_bytes, table.resident_bytes, table.tokens_per_microbatch)


def _profile_table() -> CostTable:
    return _shrunk(load_profile(find_profile("gpt-7b-h100"), "whole-job-mfu").table(STAGES, [400.0, 4000.0, 400.0]), SHRINK)


def _hand_table(f: list[float], b: list[float]) -> CostTable:
    return CostTable("host", "by hand", [StageCost(PhaseCost.stated(x), PhaseCost.stated(y), 1000)
                                         for x, y in zip(f, b, strict=True)],
                     activation_bytes=400, microbatch_size=1, rate_scale=[1.0] * (len(f) - 1))


class _Arrival:
    """A LocalTransport receive that can say whether its message is already there (as gloo's work does with
    `is_completed`): the executor then knows a receive complete before its wait constrains nothing."""

    def __init__(self, pending) -> None:
        self.pending = pending

    def is_completed(self) -> bool:
        return not self.pending.box.empty()

    def wait(self) -> None:
        self.pending.wait()


class _Recording(LocalTransport):
    """LocalTransport that notes every message's size, (src, dst, tag) -> bytes, and whose receives say when
    they are complete."""

    def __init__(self, hub: LocalHub, rank: int, sent: dict[tuple[int, int, int], int]) -> None:
        super().__init__(hub, rank)
        self.sent = sent

    def isend(self, tensor: torch.Tensor, dst: int, tag: int):
        self.sent[(self.rank, dst, tag)] = tensor.numel() * tensor.element_size()
        return super().isend(tensor, dst, tag)

    def irecv(self, tensor: torch.Tensor, src: int, tag: int):
        return _Arrival(super().irecv(tensor, src, tag))


def _run(table: CostTable, name: str = "1f1b", m: int = M, budgets: list[int | None] | None = None,
         sent: dict | None = None, iterations: int = 2) -> list[IterationTrace]:
    """Every rank's executor on its own thread, Timed compute from `table`: `iterations` iterations, each begun
    by all ranks at once (a barrier), the first a warm-up as a run's is (a thread's first tensors are slow);
    the last iteration's traces."""
    stages = len(table.stages)
    hub, sched = LocalHub(stages), S.build(name, stages, m)
    traces: list[IterationTrace | None] = [None] * stages
    errors: list[BaseException] = []

    def rank(r: int) -> None:
        try:
            ex = StageExecutor(Timed(table, r, stages), r, stages, _Recording(hub, r, {} if sent is None else sent), m)
            ex.budget_bytes = budgets[r] if budgets else None
            for _ in range(iterations):
                hub.barrier_.wait()
                traces[r] = ex.run(sched[r], None, None)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)
            hub.barrier_.abort()

    threads = [threading.Thread(target=rank, args=(r,), daemon=True) for r in range(stages)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    if errors:
        raise errors[0]
    assert all(t is not None for t in traces), "a rank did not finish"
    return traces  # type: ignore[return-value]


def _in_threads(rank, stages: int, timeout_s: float = 10) -> None:
    """`rank(r)` for every rank on a thread of its own, all started, then joined."""
    threads = [threading.Thread(target=rank, args=(r,), daemon=True) for r in range(stages)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=timeout_s)


def _iteration(traces: list[IterationTrace]) -> float:
    return max(t.end for t in traces) - min(t.start for t in traces)


def _costs(table: CostTable) -> Costs:
    n = len(table.stages) - 1
    return Costs(forward_s=[s.forward.median_s for s in table.stages],
                 backward_s=[s.backward.median_s for s in table.stages], link_delay_s=[0.0] * n,
                 link_bytes_per_s=[1e18] * n, activation_bytes=table.activation_bytes,
                 stash_bytes=table.stages[0].stash_bytes, receiver_driven=False)


@pytest.fixture(scope="module")
def table() -> CostTable:
    return _profile_table()


def _forbidden(*args, **kwargs):
    raise AssertionError("timed compute ran autograd")


@pytest.fixture(scope="module")
def one_f_one_b(table: CostTable) -> tuple[list[IterationTrace], dict]:
    """1F1B on 4 stages, 8 micro-batches, with autograd forbidden (no arithmetic may run)."""
    sent: dict = {}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch.autograd, "backward", _forbidden)
        patch.setattr(torch.Tensor, "backward", _forbidden)
        return _run(table, sent=sent), sent


def test_the_test_table_is_the_profile_shrunk(table: CostTable) -> None:
    # a layer's forward 1.9333 TFLOP at 989.4 TFLOPS x 0.40 = 4.8835 ms; 8 layers halved 19.534 ms; the LM head
    # 1.0737 TFLOP = 2.713 ms, halved 1.357 ms on the last stage; every backward twice its forward
    assert [round(s.forward.median_s * 1e3, 3) for s in table.stages] == [19.534, 19.534, 19.534, 20.891]
    assert [round(s.backward.median_s * 1e3, 3) for s in table.stages] == [39.069, 39.069, 39.069, 41.782]


def test_every_span_lasts_exactly_the_tables_time(table: CostTable, one_f_one_b) -> None:
    traces, _ = one_f_one_b
    for r, trace in enumerate(traces):
        f = [s for s in trace.spans if s.kind == "F"]
        b = [s for s in trace.spans if s.kind == "B"]
        assert sorted(s.mb for s in f) == sorted(s.mb for s in b) == list(range(M))
        for s in f:
            assert abs((s.end - s.start) - table.stages[r].forward.median_s) < EXACT, (r, s)
        for s in b:
            assert abs((s.end - s.start) - table.stages[r].backward.median_s) < EXACT, (r, s)
        assert all(s.late_s is not None and s.late_s >= 0 for s in f + b)
        assert trace.compute_s == pytest.approx(M * table.stages[r].fb_s, abs=1e-8)


def test_spans_start_at_the_previous_deadline_or_at_their_inputs_arrival(one_f_one_b) -> None:
    """The device timeline: each span starts exactly where the previous one ended (the first at the iteration's
    start), or, where it waited for its input, when that wait returned; never overlapping."""
    traces, _ = one_f_one_b
    arrivals = 0
    for r, trace in enumerate(traces):
        free, waited = trace.start, None
        for s in trace.spans:
            if s.kind in ("wait-F", "wait-B"):
                waited = s.end
                continue
            if s.kind not in ("F", "B"):
                continue
            needs_input = (s.kind == "F" and r > 0) or (s.kind == "B" and r < STAGES - 1)
            options = [free] + ([max(free, waited)] if needs_input and waited is not None else [])
            assert any(s.start == x for x in options), (r, s, free, waited)
            assert s.start >= free
            arrivals += s.start != free
            free, waited = s.end, None
    assert arrivals > 0                   # some spans did wait for their input (the pipeline fills and drains)


def test_the_iteration_is_what_the_model_predicts(table: CostTable, one_f_one_b) -> None:
    """The measured iteration against workloads.simulate on the same schedule and table (LocalTransport: no
    delay, instant sends). Tolerance 5 %: spans 1.3x longer would be 30 % off."""
    traces, _ = one_f_one_b
    predicted = simulate(S.build("1f1b", STAGES, M), _costs(table)).iteration_s
    measured = _iteration(traces)
    assert predicted == pytest.approx((M + STAGES - 1) * table.stages[-1].fb_s, rel=0.1)   # sanity of the model
    assert predicted * (1 - 1e-6) <= measured <= predicted * 1.05, (measured, predicted)


@pytest.mark.parametrize("name", ["gpipe", "1f1b-prefetch"])
def test_other_schedules_match_the_model_too(table: CostTable, name: str) -> None:
    traces = _run(table, name)
    predicted = simulate(S.build(name, STAGES, M), _costs(table)).iteration_s
    assert predicted * (1 - 1e-6) <= _iteration(traces) <= predicted * 1.05, (_iteration(traces), predicted)


def test_messages_carry_the_tables_wire_bytes(table: CostTable, one_f_one_b) -> None:
    _, sent = one_f_one_b
    assert len(sent) == 2 * M * (STAGES - 1)
    for (src, dst, tag), nbytes in sent.items():
        link = min(src, dst)
        assert nbytes == table.wire_bytes(link), (src, dst, tag)
        assert (tag % 2 == 0) == (dst == src + 1)               # activations forward, gradients back
    assert [table.wire_bytes(link) for link in range(STAGES - 1)] == [83888, 8388, 83888]


def test_no_arithmetic_runs_and_there_is_no_loss(table: CostTable, one_f_one_b) -> None:
    """The run above had autograd forbidden and no model, inputs or targets: the last stage reports no loss."""
    traces, _ = one_f_one_b
    assert all(t.loss is None for t in traces)
    timed = Timed(table, 0, STAGES)
    assert timed.timed and timed.input_for(0, None, None) is None
    assert timed.forward_payload(None).numel() * 4 == table.wire_bytes(0)


def test_memory_is_accounted_in_the_tables_bytes(table: CostTable, one_f_one_b) -> None:
    """Per rank: the stash of each micro-batch is the table's, and the peak is the model's (stashes and posted
    receive buffers of the deployment's activation bytes)."""
    traces, _ = one_f_one_b
    predicted = simulate(S.build("1f1b", STAGES, M), _costs(table)).peak_inflight_bytes
    for r, trace in enumerate(traces):
        assert trace.stash_bytes == [table.stages[r].stash_bytes] * M
        assert trace.peak_inflight_bytes == predicted[r], r
        assert trace.memory[-1][1] == 0


def test_a_budget_below_the_tables_stash_raises(table: CostTable) -> None:
    stash = table.stages[0].stash_bytes
    ex = StageExecutor(Timed(table, 0, STAGES), 0, STAGES, LocalTransport(LocalHub(STAGES), 0), M)
    ex.budget_bytes = stash - 1
    with pytest.raises(BudgetExceeded, match=rf"stage 0 holds {stash} B in flight, over its memory budget of "
                                             rf"{stash - 1} B \(after F0\)"):
        ex.run(S.build("1f1b", STAGES, M)[0], None, None)


def test_a_budget_of_exactly_the_peak_runs(table: CostTable, one_f_one_b) -> None:
    traces, _ = one_f_one_b
    again = _run(table, budgets=[t.peak_inflight_bytes for t in traces])
    assert [t.peak_inflight_bytes for t in again] == [t.peak_inflight_bytes for t in traces]


def test_a_late_wake_up_does_not_push_the_later_spans(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every sleep of the timed spans oversleeps by 3 ms. On absolute deadlines that lateness does not add up
    along a rank's timeline: it shows only where a rank waits for a message while the pipeline fills and drains
    (2(S-1) hops) and at the very end, 7 x 3 ms here. A chain of relative sleeps would add 3 ms per span: 2m x
    3 ms = 96 ms on the last stage alone, which runs back to back (the stages before it have slack)."""
    m, over = 16, 0.003
    hand = _hand_table([0.004, 0.004, 0.004, 0.010], [0.008, 0.008, 0.008, 0.020])
    baseline = _iteration(_run(hand, m=m))

    def oversleep(seconds: float) -> None:
        time.sleep(seconds + over)

    monkeypatch.setattr(stagecompute, "time", types.SimpleNamespace(monotonic=time.monotonic, sleep=oversleep))
    late = _run(hand, m=m)
    growth = _iteration(late) - baseline
    relative_chain = 2 * m * over
    for r, trace in enumerate(late):
        timed = [s for s in trace.spans if s.kind in ("F", "B")]
        assert all(s.late_s >= 0 for s in timed)
        # the oversleep took effect (less the most a span learns to wake early and spin)
        assert statistics.median(s.late_s for s in timed) >= over - stagecompute.MAX_WAKE_EARLY_S - 1e-4, r
        for s in timed:
            expected = hand.stages[r].forward.median_s if s.kind == "F" else hand.stages[r].backward.median_s
            assert abs((s.end - s.start) - expected) < EXACT
    assert growth < relative_chain / 3, (growth, relative_chain)


def test_a_host_whose_sleeps_end_late_is_met_on_time_by_waking_early_and_spinning(monkeypatch) -> None:
    """Every sleep ends 100 us after its target (a slow host's wake-up, on top of this host's own): the spans
    learn it, wake that much before their deadline and spin the rest, so after the first few the lateness is
    mostly gone; the same spans with the learning off stay late by the whole oversleep and this host's own."""
    over = 100e-6

    def oversleep(seconds: float) -> None:
        time.sleep(seconds + over)

    def lateness(learning: bool) -> tuple[list[float], Timed]:
        monkeypatch.setattr(stagecompute, "MAX_WAKE_EARLY_S", 200e-6 if learning else 0.0)
        device = Timed(_hand_table([0.002, 0.002], [0.004, 0.004]), 0, 2)
        device.start_iteration(time.monotonic())
        return [device.forward(mb, None, None, None, None)[2].late_s for mb in range(40)], device

    monkeypatch.setattr(stagecompute, "time", types.SimpleNamespace(monotonic=time.monotonic, sleep=oversleep))
    unlearnt, _ = lateness(learning=False)
    late, device = lateness(learning=True)
    assert statistics.median(unlearnt[20:]) > over                     # the oversleep and this host's own
    assert statistics.median(late[:3]) > 0.5 * over                    # before it has learnt
    assert statistics.median(late[20:]) < 0.25 * statistics.median(unlearnt[20:]), (late[20:], unlearnt[20:])
    assert over < device.wake_early_s <= 200e-6


def test_a_send_leaves_as_soon_as_its_compute_returns_before_the_span_is_recorded(monkeypatch) -> None:
    """The F's or B's own message is posted before the span's bookkeeping (so the executor's own time does not
    delay it on the wire), exactly once, and the span still ends where the compute ended."""
    from workloads import executor as E

    by_thread: dict[int, list[str]] = {}          # each rank's own order of events
    span = E._Iteration.span

    def recording_span(self, kind, mb, *args, **kwargs):
        if kind in ("F", "B"):
            by_thread.setdefault(threading.get_ident(), []).append(f"{kind}{mb}")
        return span(self, kind, mb, *args, **kwargs)

    class Noting(_Recording):
        def isend(self, tensor, dst, tag):
            by_thread.setdefault(threading.get_ident(), []).append(f"send {tag}")
            return super().isend(tensor, dst, tag)

    monkeypatch.setattr(E._Iteration, "span", recording_span)
    hub = LocalHub(2)
    table = _hand_table([0.002, 0.002], [0.004, 0.004])
    traces: list = [None, None]

    def rank(r: int) -> None:
        ex = StageExecutor(Timed(table, r, 2), r, 2, Noting(hub, r, {}), 2)
        traces[r] = ex.run(S.build("1f1b", 2, 2)[r], None, None)

    _in_threads(rank, 2)
    assert len(by_thread) == 2
    for order in by_thread.values():
        sends = [o for o in order if o.startswith("send")]
        assert len(sends) == len(set(sends)) == 2                  # its 2 messages, each once
        for o in sends:                                            # each posted before its compute's span
            i = order.index(o)
            assert i + 1 < len(order) and order[i + 1][0] in "FB", order
    for r, trace in enumerate(traces):
        for sp in (s for s in trace.spans if s.kind in ("F", "B")):
            want = table.stages[r].forward.median_s if sp.kind == "F" else table.stages[r].backward.median_s
            assert abs((sp.end - sp.start) - want) < EXACT


def test_each_message_and_receive_has_its_measured_lag(one_f_one_b) -> None:
    """The model is fed each stage's lag from a compute's end to its message's post and to a receive's post: one
    per send and per receive, never negative, and small beside the ~20-40 ms spans on LocalTransport (a lag taken
    from the span's start, or a deadline on the wrong clock, would be a span long or hours off)."""
    traces, _ = one_f_one_b
    for r, trace in enumerate(traces):
        links = (r > 0) + (r < STAGES - 1)
        assert len(trace.send_lag_s) == len(trace.recv_lag_s) == links * M, (r, trace.send_lag_s, trace.recv_lag_s)
        assert min(trace.send_lag_s) >= 0 and min(trace.recv_lag_s) >= 0
        assert statistics.median(trace.send_lag_s) < 0.005 and statistics.median(trace.recv_lag_s) < 0.005


def test_the_receives_after_a_send_are_posted_before_it() -> None:
    """1F1B's last stage runs B(i), sends it and posts the receive of F(i+1): on gloo that receive's notice rides
    the connection the gradient takes, so posted after the gradient it waited a whole transfer behind it (half of
    1f1b's receives at 0 km took two transfers). Where sends leave from a thread of their own the executor posts
    it first; the schedule is otherwise run as written (every send still right after its compute, each action
    once). A transport that writes its sends itself keeps the schedule's order."""
    order: list[str] = []

    class Noting(_Recording):
        receives_before_sends = True            # as SenderThread, the transport of compute as time

        def isend(self, tensor, dst, tag):
            if self.rank == 1:
                order.append(f"send {tag}")
            return super().isend(tensor, dst, tag)

        def irecv(self, tensor, src, tag):
            if self.rank == 1:
                order.append(f"recv {tag}")
            return super().irecv(tensor, src, tag)

    hub, m = LocalHub(2), 3
    table = _hand_table([0.002, 0.002], [0.004, 0.004])

    def rank(r: int) -> None:
        StageExecutor(Timed(table, r, 2), r, 2, Noting(hub, r, {}), m).run(S.build("1f1b", 2, m)[r], None, None)

    f, b = (lambda mb: f"recv {tag_of('F', mb)}"), (lambda mb: f"send {tag_of('B', mb)}")
    _in_threads(rank, 2)
    assert order == [f(0), f(1), b(0), f(2), b(1), b(2)], order
    order.clear()
    Noting.receives_before_sends = False
    _in_threads(rank, 2)
    assert order == [f(0), b(0), f(1), b(1), f(2), b(2)], order
