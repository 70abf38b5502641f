"""The loaded reference's accounting (workloads/reference.py: `between`): the work done between micro-batches is
not the compute's, the time another thread held the compute's core meanwhile is."""

from __future__ import annotations

import os
import threading
import time

import torch

from workloads.reference import reference_compute_s

MB = 4
HELD_S = 0.015


def _pass(between=None) -> float:  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    chunk = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Tanh())
    inputs = [torch.randn(8, 64) for _ in range(MB)]
    targets = [torch.randn(8, 64) for _ in range(MB)]
    return reference_compute_s([chunk], [True], [True], MB, (8, 64), inputs, targets,
                               torch.nn.functional.mse_loss, between)


def _on_one_core() -> tuple[set[int], int]:
    before = os.sched_getaffinity(0)
    core = min(before)
    os.sched_setaffinity(0, {core})
    return before, core


def test_work_between_micro_batches_is_not_the_compute() -> None:
    """A between that sleeps 15 ms per micro-batch (60 ms in all) adds almost nothing to the pass."""
    bare = min(_pass() for _ in range(3))
    slept = _pass(lambda _mb: time.sleep(HELD_S))
    assert slept - bare < 0.25 * MB * HELD_S


def test_a_core_taken_between_micro_batches_is_counted() -> None:
    """A between that wakes a thread on the compute's own core and stays runnable until it is done: that thread
    spins 15 ms a micro-batch, the scheduler shares the core between the two, and the compute thread's share of
    waiting on the run queue (about half of 60 ms; its own yielding loop is not counted) is in the pass."""
    before, core = _on_one_core()
    go, done, stop = threading.Event(), threading.Event(), threading.Event()

    def spinner() -> None:
        os.sched_setaffinity(0, {core})
        while not stop.is_set():
            if go.wait(0.1):
                go.clear()
                end = time.perf_counter() + HELD_S
                while time.perf_counter() < end:
                    pass
                done.set()

    helper = threading.Thread(target=spinner, daemon=True)
    helper.start()

    def hand_over(_mb: int) -> None:
        done.clear()
        go.set()
        while not done.is_set():       # runnable all along, as a worker woken by its sender thread is
            os.sched_yield()

    try:
        bare = min(_pass() for _ in range(3))
        held = _pass(hand_over)
    finally:
        stop.set()
        helper.join(timeout=5)
        os.sched_setaffinity(0, before)
    assert 0.25 * MB * HELD_S < held - bare < 1.2 * MB * HELD_S
