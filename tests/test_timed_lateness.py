"""Compute as time's spans tell the truth (workloads/stagecompute.py's Timed, workloads/executor.py): a span keeps
its planned interval and records when it really woke and ended; after one late wake-up the spans whose deadlines
passed meanwhile end late too and say so; a message posted after a late span leaves after the span's actual end,
the lateness in the span and not in the message's lag; a failed timer-slack setting is said once."""

from __future__ import annotations

import ctypes
import errno
import threading
import time

import pytest
import torch
from test_timed_executor import _Arrival

import workloads.stagecompute as stagecompute
from workloads import schedule as S
from workloads.compute import CostTable, PhaseCost, StageCost
from workloads.executor import StageExecutor, tag_of
from workloads.stagecompute import MAX_WAKE_EARLY_S, Timed
from workloads.transport import LocalHub, LocalTransport

EXACT = 1e-9
SLACK = MAX_WAKE_EARLY_S + 0.1e-3
"""What a span may wake before its planned overshoot: it learns to wake early by at most MAX_WAKE_EARLY_S."""


def _table(f: float, b: float, stages: int = 2) -> CostTable:
    return CostTable("host", "by hand", [StageCost(PhaseCost.stated(f), PhaseCost.stated(b), 1000)] * stages,
                     activation_bytes=400, microbatch_size=1, rate_scale=[1.0] * (stages - 1))


class _LateOnce(Timed):
    """A device whose `late_span`-th span (from 1) oversleeps by `over` seconds (a late wake-up)."""

    def __init__(self, table: CostTable, stage: int, stages: int, late_span: int, over: float) -> None:
        super().__init__(table, stage, stages)
        self.late_span, self.over, self.spans = late_span, over, 0

    def forward(self, *args):
        self.spans += 1
        return super().forward(*args)

    def backward(self, *args):
        self.spans += 1
        return super().backward(*args)

    def _sleep(self, seconds: float) -> None:
        time.sleep(seconds + (self.over if self.spans == self.late_span else 0.0))


def test_a_late_wake_up_is_recorded_at_its_actual_end_and_the_spans_it_made_late_say_so() -> None:
    """Spans of 2 ms back to back; the third one's sleep ends 9 ms late. Its plan stays (start, end 2 ms apart,
    contiguous); its actual end is 9 ms after its deadline. The next four spans' deadlines (2, 4, 6, 8 ms after
    it) passed while it slept: each ends at once, late by about 7, 5, 3 and 1 ms, and records that."""
    over, f = 0.009, 0.002
    device = _LateOnce(_table(f, 2 * f), 0, 2, late_span=3, over=over)
    device.start_iteration(time.monotonic())
    spans = [device.forward(mb, None, None, None, None)[2] for mb in range(8)]
    for before, s in zip(spans, spans[1:], strict=False):
        assert s.start == before.end                                         # the plan: back to back
    for s in spans:
        assert abs((s.end - s.start) - f) < EXACT
        assert s.late_s == s.actual_end - s.end and s.late_s >= 0
        assert s.start <= s.woke <= s.actual_end
    late = spans[2]
    assert late.actual_end >= late.end + over - SLACK
    assert late.woke >= late.end + over - SLACK                             # it woke late, not spun late
    for k in range(3, 7):                    # their deadlines passed while span 2 slept: not on time
        assert spans[k].late_s >= over - (k - 2) * f - SLACK, (k, spans[k])
        assert spans[k].actual_end >= late.actual_end


class _Posting(LocalTransport):
    """LocalTransport that notes when each message was posted, (src, tag) -> monotonic seconds."""

    def __init__(self, hub: LocalHub, rank: int, posted: dict[tuple[int, int], float]) -> None:
        super().__init__(hub, rank)
        self.posted = posted

    def isend(self, tensor: torch.Tensor, dst: int, tag: int):
        self.posted[(self.rank, tag)] = time.monotonic()
        return super().isend(tensor, dst, tag)

    def irecv(self, tensor: torch.Tensor, src: int, tag: int):
        return _Arrival(super().irecv(tensor, src, tag))


def test_a_message_after_a_late_span_leaves_late_and_the_lateness_is_the_spans() -> None:
    """1F1B on 2 stages (F 4 ms, B 8 ms), a warm-up iteration first (a thread's first tensors are slow); in the
    second, stage 0's F1 wakes 30 ms late. Its message leaves after F1's actual end, which the trace shows 30 ms
    after the plan; the message's lag counts from that actual end, so it is the executor's own time, not the
    lateness (from the planned end it would be 30 ms). Stage 0's next span, B0, whose gradient was there long
    before, ends at once after F1, late, and says so."""
    over, m = 0.030, 4
    table = _table(0.004, 0.008)
    hub, sched, posted = LocalHub(2), S.build("1f1b", 2, m), {}
    traces: list = [None, None]

    def rank(r: int) -> None:
        device = _LateOnce(table, 0, 2, late_span=2 * m + 2, over=over) if r == 0 else Timed(table, 1, 2)
        executor = StageExecutor(device, r, 2, _Posting(hub, r, posted), m)
        for _ in range(2):
            hub.barrier_.wait()
            traces[r] = executor.run(sched[r], None, None)

    threads = [threading.Thread(target=rank, args=(r,), daemon=True) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    assert all(traces), "a rank did not finish"
    timed = [s for s in traces[0].spans if s.kind in ("F", "B")]
    f1 = next(s for s in timed if (s.kind, s.mb) == ("F", 1))
    assert abs((f1.end - f1.start) - 0.004) < EXACT                         # its plan stays
    assert f1.actual_end >= f1.end + over - SLACK                            # the trace shows it late
    assert posted[(0, tag_of("F", 1))] >= f1.actual_end                      # its message left after that
    sends = [tag_of("F", mb) for mb in range(m)]                             # stage 0 sends F0..F3, in order
    assert traces[0].send_lag_s[sends.index(tag_of("F", 1))] < 0.005         # the lag is the executor's, not the lateness
    after = timed[timed.index(f1) + 1]
    assert (after.kind, after.mb) == ("B", 0)
    assert after.actual_end >= f1.actual_end and after.late_s >= 0.005, after   # not recorded on time
    assert all(s.late_s == s.actual_end - s.end for s in timed)


def test_a_failed_timer_slack_is_said_once_per_process(monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """prctl refuses (EPERM): the worker's stderr says so once, however many devices are made; a prctl that
    works says nothing."""
    def refusing(*_args) -> int:
        ctypes.set_errno(errno.EPERM)
        return -1

    monkeypatch.setattr(stagecompute, "_slack_warned", False)
    monkeypatch.setattr(stagecompute, "_prctl", lambda: refusing)
    Timed(_table(0.001, 0.002), 0, 2)
    assert stagecompute.set_timer_slack_ns(1) is False
    err = capsys.readouterr().err
    assert err.count("PR_SET_TIMERSLACK") == 1 and "Operation not permitted" in err, err
    monkeypatch.setattr(stagecompute, "_slack_warned", False)
    monkeypatch.setattr(stagecompute, "_prctl", lambda: lambda *_a: 0)
    assert stagecompute.set_timer_slack_ns(1) is True
    assert capsys.readouterr().err == ""


def test_a_missing_prctl_is_said_too(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    def missing():
        raise AttributeError("undefined symbol: prctl")

    monkeypatch.setattr(stagecompute, "_slack_warned", False)
    monkeypatch.setattr(stagecompute, "_prctl", missing)
    assert stagecompute.set_timer_slack_ns(1) is False
    assert "undefined symbol: prctl" in capsys.readouterr().err
