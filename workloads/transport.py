"""Point-to-point transports behind one small interface: gloo over TCP (default), or in-process queues
(for tests). An RDMA transport would implement the same three methods."""

from __future__ import annotations

import queue
import threading
from abc import ABC, abstractmethod
from typing import Protocol

import torch


class Work(Protocol):
    def wait(self) -> None: ...


class Transport(ABC):
    name: str = ""

    @abstractmethod
    def isend(self, tensor: torch.Tensor, dst: int, tag: int) -> Work:
        """Start sending; the tensor must stay alive and unchanged until `wait()` returns."""

    @abstractmethod
    def irecv(self, tensor: torch.Tensor, src: int, tag: int) -> Work:
        """Post a receive into `tensor`; its data is there once `wait()` returns."""

    @abstractmethod
    def barrier(self) -> None:
        """Align all ranks (outside measured windows)."""


class GlooTransport(Transport):
    """torch.distributed with the gloo backend (TCP): receiver-driven sends."""

    name = "gloo-tcp"

    def isend(self, tensor: torch.Tensor, dst: int, tag: int) -> Work:
        import torch.distributed as dist

        return dist.isend(tensor, dst, tag=tag)

    def irecv(self, tensor: torch.Tensor, src: int, tag: int) -> Work:
        import torch.distributed as dist

        return dist.irecv(tensor, src, tag=tag)

    def barrier(self) -> None:
        import torch.distributed as dist

        dist.barrier()


class _Done:
    def wait(self) -> None:
        return None


class _Pending:
    def __init__(self, box: queue.Queue[torch.Tensor], into: torch.Tensor) -> None:
        self.box, self.into = box, into

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
