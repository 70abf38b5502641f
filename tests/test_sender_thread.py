"""Sends posted from a thread of their own (workloads/transport.py: SenderThread): the caller goes on at once
while a slow send is still being posted, messages leave in the order they were posted, a send's failure reaches
whoever waits on it, and the thread ends on close."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from workloads.transport import LocalHub, LocalTransport, SenderThread


class _Slow(LocalTransport):
    """A transport whose isend takes 50 ms in the posting thread (as gloo's socket write does, shorter)."""

    def __init__(self, hub: LocalHub, rank: int) -> None:
        super().__init__(hub, rank)
        self.posted_by: list[str] = []

    def isend(self, tensor: torch.Tensor, dst: int, tag: int):
        self.posted_by.append(threading.current_thread().name)
        time.sleep(0.05)
        return super().isend(tensor, dst, tag)


def test_the_caller_goes_on_while_a_slow_send_is_posted_and_order_is_kept() -> None:
    hub = LocalHub(2)
    inner = _Slow(hub, 0)
    sender, receiver = SenderThread(inner), LocalTransport(hub, 1)
    try:
        t0 = time.monotonic()
        works = [sender.isend(torch.full((4,), float(i)), 1, tag=7) for i in range(3)]
        assert time.monotonic() - t0 < 0.03                      # three 50 ms posts, none in this thread
        assert not works[-1].is_completed()
        for w in works:
            w.wait()
        assert time.monotonic() - t0 >= 0.15 and all(w.is_completed() for w in works)
        assert inner.posted_by == ["tb-sender"] * 3
        got = []
        for _ in range(3):
            buf = torch.empty(4)
            receiver.irecv(buf, 0, tag=7).wait()
            got.append(buf[0].item())
        assert got == [0.0, 1.0, 2.0]                            # in the order they were posted
    finally:
        sender.close()
    assert not sender._thread.is_alive()


def test_a_failing_send_raises_in_whoever_waits_on_it() -> None:
    class Broken(LocalTransport):
        def isend(self, tensor, dst, tag):
            raise ConnectionResetError("peer went away")

    sender = SenderThread(Broken(LocalHub(2), 0))
    try:
        work = sender.isend(torch.zeros(2), 1, tag=1)
        with pytest.raises(ConnectionResetError, match="peer went away"):
            work.wait()
        assert not work.is_completed()
    finally:
        sender.close()
