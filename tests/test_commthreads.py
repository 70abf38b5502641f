"""The workers' communication threads (workloads/commthreads.py): found by name, moved off the worker's core or
left on it, and a bad setting refused by name."""

from __future__ import annotations

import os
import threading

import pytest

from workloads import commthreads


def _pinned_thread(cpu: int) -> tuple[int, threading.Event, threading.Thread]:
    """A live thread of this process pinned to one core, and the event that ends it."""
    ready, stop, tid = threading.Event(), threading.Event(), []

    def body() -> None:
        tid.append(threading.get_native_id())
        os.sched_setaffinity(0, {cpu})
        ready.set()
        stop.wait(10)

    t = threading.Thread(target=body)
    t.start()
    ready.wait(5)
    return tid[0], stop, t


def test_any_lets_the_comm_threads_run_on_every_core_and_own_leaves_them(monkeypatch: pytest.MonkeyPatch) -> None:
    tid, stop, t = _pinned_thread(0)
    try:
        monkeypatch.setattr(commthreads, "comm_threads", lambda: [tid])
        assert commthreads.set_comm_affinity("own") == [] and os.sched_getaffinity(tid) == {0}
        assert commthreads.set_comm_affinity("any") == [tid]
        assert os.sched_getaffinity(tid) == set(range(os.cpu_count() or 1))
        assert os.sched_getaffinity(0) != {0} or os.cpu_count() == 1      # this (main) thread untouched
    finally:
        stop.set()
        t.join()


def test_a_thread_gone_before_it_is_moved_is_skipped_and_a_bad_setting_refused(monkeypatch) -> None:
    monkeypatch.setattr(commthreads, "comm_threads", lambda: [2 ** 22 + 7])        # no such thread
    assert commthreads.set_comm_affinity("any") == []
    with pytest.raises(ValueError, match="use own or any"):
        commthreads.set_comm_affinity("both")
