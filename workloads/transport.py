"""Point-to-point transports behind one small interface: gloo over TCP (default), RDMA over SoftRoCE or an
RDMA NIC (workloads/rdma: sender-driven writes into the receiver's slot pool), or in-process queues (tests)."""

from __future__ import annotations

import queue
import threading
import time
from abc import ABC, abstractmethod
from typing import Any, Protocol

import torch

from workloads.records import RDMA, TCP


class Work(Protocol):
    def wait(self) -> None: ...


class Transport(ABC):
    name: str = ""

    receives_before_sends: bool = False
    """Post the receives that follow an F's or B's send before the send. True where sends leave from a thread of
    their own (SenderThread): the executor's receive post and that thread's write race for the connection, and a
    notice behind a 128 KiB message waits a whole transfer. False where the executor writes the send itself
    (`--sender inline`): measured on 2 cores at 0 km (bench-yardstick, host F+B 3.5 ms), 1f1b's step was 199 ms
    with the send first and 240 ms with the receives first, the executor's thread writing each send."""

    writes_sends_in_caller: bool = True
    """Whether `isend` runs the send's path (gloo's socket write, the kernel's path through the veths) in the
    calling thread; the loaded reference counts that CPU as the messages' (workloads/reference.py)."""

    @abstractmethod
    def isend(self, tensor: torch.Tensor, dst: int, tag: int) -> Work:
        """Start sending; the tensor must stay alive and unchanged until `wait()` returns."""

    @abstractmethod
    def irecv(self, tensor: torch.Tensor, src: int, tag: int) -> Work:
        """Post a receive into `tensor`; its data is there once `wait()` returns."""

    @abstractmethod
    def barrier(self) -> None:
        """Align all ranks (outside measured windows)."""

    def close(self) -> None:  # noqa: B027 (most transports hold nothing of their own)
        """Release what the transport holds (queue pairs, registered memory); gloo's pairs go with the group."""


class GlooTransport(Transport):
    """torch.distributed with the gloo backend (TCP): receiver-driven sends."""

    name = TCP.label

    def isend(self, tensor: torch.Tensor, dst: int, tag: int) -> Work:
        import torch.distributed as dist

        return dist.isend(tensor, dst, tag=tag)

    def irecv(self, tensor: torch.Tensor, src: int, tag: int) -> Work:
        import torch.distributed as dist

        return dist.irecv(tensor, src, tag=tag)

    def barrier(self) -> None:
        import torch.distributed as dist

        dist.barrier()


class _PostedSend:
    """A send handed to the sender thread: its transport work once that thread has posted it."""

    __slots__ = ("error", "posted", "started", "work")

    def __init__(self) -> None:
        self.posted = threading.Event()
        self.work: Work | None = None
        self.error: BaseException | None = None
        self.started: float | None = None
        """When the sender thread began to post it (monotonic seconds)."""

    def wait(self) -> None:
        self.posted.wait()
        if self.error is not None:
            raise self.error
        assert self.work is not None
        self.work.wait()

    def is_completed(self) -> bool:
        if not self.posted.is_set() or self.error is not None:
            return False
        done = getattr(self.work, "is_completed", None)
        return bool(done()) if callable(done) else False


class SenderThread(Transport):
    """Another transport whose sends are posted by a thread of their own, in order, so that the caller goes on
    at once: gloo writes a message into its socket in the posting thread, and through veths the kernel then runs
    the whole path to the next queue (bridge, routing, the shaper) in that thread, 0.2-0.35 ms per 128 KiB message
    on the project's 2-core VMs. With compute as time the executor's thread posts the next receive (whose notice
    the sender waits for) and meets the next deadline meanwhile, as an accelerator's executor would while its
    NIC sends; the thread is named `tb-sender` in the CPU ledger. In real mode too (the default,
    `WorkerConfig.sender`): on 2 cores at 0 km it cut 1f1b's step 9 % and left the overlapping schedules within
    1.5 %; at 1000 km 1f1b -4.6 %, the overlapping schedules +3.0-3.6 % (`make bench-overhead COMPARE=sender`)."""

    receives_before_sends = True
    writes_sends_in_caller = False

    def __init__(self, inner: Transport) -> None:
        self.inner, self.name = inner, inner.name
        self._queue: queue.SimpleQueue[tuple[torch.Tensor, int, int, _PostedSend] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._loop, name="tb-sender", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        _name_thread(b"tb-sender")
        while (item := self._queue.get()) is not None:
            tensor, dst, tag, posted = item
            try:
                posted.started = time.monotonic()
                posted.work = self.inner.isend(tensor, dst, tag)
            except BaseException as exc:  # noqa: BLE001 (handed to whoever waits on the send)
                posted.error = exc
            finally:
                posted.posted.set()

    def isend(self, tensor: torch.Tensor, dst: int, tag: int) -> Work:
        posted = _PostedSend()
        self._queue.put((tensor, dst, tag, posted))
        return posted

    def irecv(self, tensor: torch.Tensor, src: int, tag: int) -> Work:
        return self.inner.irecv(tensor, src, tag)

    def barrier(self) -> None:
        self.inner.barrier()

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=10)
        self.inner.close()


def _name_thread(name: bytes) -> None:
    """The calling thread's name in /proc (PR_SET_NAME), where the CPU ledger reads it."""
    import contextlib
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).prctl(15, ctypes.c_char_p(name[:15]), 0, 0, 0)


class RdmaTransport(Transport):
    """RC queue pairs to the neighbouring ranks (workloads/rdma/endpoint.py); gloo stays for the barrier and
    the rendezvous that exchanges the QPs' connection data."""

    name = RDMA.label

    def __init__(self, device: str, gid_index: int, rank: int, peers: dict[int, Any], timeout_s: float = 120.0) -> None:
        import torch.distributed as dist

        from workloads.rdma.endpoint import RdmaEndpoint, exchange_over

        self.endpoint = RdmaEndpoint(device, gid_index, rank, peers, timeout_s=timeout_s)

        def all_gather(info: Any) -> list[Any]:
            out: list[Any] = [None] * dist.get_world_size()
            dist.all_gather_object(out, info)
            return out

        exchange_over(all_gather, self.endpoint)

    def isend(self, tensor: torch.Tensor, dst: int, tag: int) -> Work:
        tensor = _contiguous(tensor)
        work = self.endpoint.send(tensor.data_ptr(), tensor.numel() * tensor.element_size(), dst, tag)
        return _Holding(work, tensor)

    def irecv(self, tensor: torch.Tensor, src: int, tag: int) -> Work:
        if not tensor.is_contiguous():
            raise ValueError("RDMA receives need a contiguous tensor")
        return self.endpoint.recv(tensor.data_ptr(), tensor.numel() * tensor.element_size(), src, tag)

    def barrier(self) -> None:
        import torch.distributed as dist

        dist.barrier()

    def pool_bytes(self) -> int:
        """Registered receive slots this rank holds for its peers (fixed; what RDMA adds to a stage's memory)."""
        return sum(p.params.pool_bytes for p in self.endpoint.peers.values())

    def close(self) -> None:
        self.endpoint.close()


def _contiguous(tensor: torch.Tensor) -> torch.Tensor:
    return tensor if tensor.is_contiguous() else tensor.contiguous()


class _Holding:
    """Keeps the sent tensor alive until the send completed (its memory is registered and read by the NIC)."""

    def __init__(self, work: Any, tensor: torch.Tensor) -> None:
        self.work, self.tensor = work, tensor

    def wait(self) -> None:
        self.work.wait()

    def is_completed(self) -> bool:
        return bool(self.work.is_completed())


class _Done:
    def wait(self) -> None:
        return None

    def is_completed(self) -> bool:
        return True


class _Pending:
    def __init__(self, box: queue.Queue[torch.Tensor], into: torch.Tensor) -> None:
        self.box, self.into = box, into

    def is_completed(self) -> bool:
        return not self.box.empty()

    def wait(self) -> None:
        self.into.copy_(self.box.get(timeout=60))


class LocalHub:
    """Mailboxes shared by the ranks of one process (threads)."""

    def __init__(self, world: int) -> None:
        self.world = world
        self.boxes: dict[tuple[int, int, int], queue.Queue[torch.Tensor]] = {}
        self.lock = threading.Lock()
        self.barrier_ = threading.Barrier(world)

    def box(self, src: int, dst: int, tag: int) -> queue.Queue[torch.Tensor]:
        with self.lock:
            return self.boxes.setdefault((src, dst, tag), queue.Queue())


class LocalTransport(Transport):
    """In-process transport for tests: sends complete at once (a copy), receives block on a queue."""

    name = "local"

    def __init__(self, hub: LocalHub, rank: int) -> None:
        self.hub, self.rank = hub, rank

    def isend(self, tensor: torch.Tensor, dst: int, tag: int) -> Work:
        self.hub.box(self.rank, dst, tag).put(tensor.detach().clone())
        return _Done()

    def irecv(self, tensor: torch.Tensor, src: int, tag: int) -> Work:
        return _Pending(self.hub.box(src, self.rank, tag), tensor)

    def barrier(self) -> None:
        self.hub.barrier_.wait()
