"""Sender-driven RDMA messaging between ranks over RC queue pairs (pyverbs), without torch.

Every rank owns, per peer, a pool of receive slots registered for remote write. A message is cut into
chunks of at most one slot; each chunk is one RDMA WRITE WITH IMMEDIATE (a 32-byte header and the payload,
two SGEs, the payload registered in place: zero copy on the sender) into a free slot of the receiver, the
immediate naming the slot. The receiver copies a slot out once the matching receive is posted and hands
the slot back with a zero-length WRITE WITH IMMEDIATE (a credit), so a sender never overruns the pool and a
send completes as soon as the data is in the peer's memory, whether or not the peer has posted the receive
(unlike gloo's TCP, whose sends wait for the receiver). Chunks go round robin over several QPs per peer
when one QP's window (rxe: 128 unacknowledged packets) cannot fill the link.

A progress thread polls the completion queue; messages between two ranks are matched by (tag, sequence).
"""

from __future__ import annotations

import ctypes
import itertools
import math
import random
import struct
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from workloads.errors import TestbedError

HEADER = struct.Struct("<IiIIIIQ")
"""magic, tag, sequence, chunk index, chunk count, chunk bytes, message bytes."""
MAGIC = 0x7B3A_0001
CREDIT_BIT = 1 << 31
RXE_WINDOW_PACKETS = 128
"""rdma_rxe's limit of unacknowledged packets per RC QP."""
MAX_QPS = 8
WAIT_POLL_S = 50e-6
"""A waiting thread's pause between empty polls (after WAIT_SPINS bare yields)."""
WAIT_SPINS = 50
IDLE_POLL_S = 0.002
"""The progress thread's longest pause between empty polls: it only moves data while nobody waits (overlap)."""
IB_MTUS = {256: 1, 512: 2, 1024: 3, 2048: 4, 4096: 5}


class RdmaError(TestbedError, RuntimeError):
    """A verbs call or a work completion failed; the message names the peer and the status."""


@dataclass(frozen=True, slots=True)
class LinkParams:
    """How the QPs to one peer are set up, derived from the path between the two ranks."""

    qps: int
    rdma_mtu: int
    timeout_exp: int
    """ACK timeout 4.096 us x 2^t, above the path's round trip."""
    slots: int
    slot_payload: int

    @classmethod
    def for_path(cls, rtt_s: float, rate_bps: float, rdma_mtu: int, message_bytes: int, slots: int,
                 chunk_cap: int = 1 << 20) -> LinkParams:
        window_bytes = RXE_WINDOW_PACKETS * rdma_mtu
        qps = max(1, min(MAX_QPS, math.ceil(rate_bps / 8 * rtt_s / window_bytes)))
        ack_wait = max(4 * rtt_s, 0.1)          # never below 100 ms: QEMU TCG stalls a guest for tens of ms
        timeout_exp = min(31, max(14, math.ceil(math.log2(ack_wait / 4.096e-6))))
        return cls(qps=qps, rdma_mtu=rdma_mtu, timeout_exp=timeout_exp, slots=max(1, slots),
                   slot_payload=max(64, min(chunk_cap, message_bytes)))

    @property
    def slot_bytes(self) -> int:
        return HEADER.size + self.slot_payload

    @property
    def pool_bytes(self) -> int:
        return self.slots * self.slot_bytes


@dataclass(slots=True)
class Completion:
    """Handed back by `send`/`recv`; `wait` blocks until the data is at the peer (send) or here (recv)."""

    endpoint: RdmaEndpoint
    done: threading.Event = field(default_factory=threading.Event)
    error: str = ""
    finished_at: float = 0.0

    def is_completed(self) -> bool:
        """The operation has completed (as far as the completion queue has been polled)."""
        return self.done.is_set()

    def wait(self, timeout: float | None = None) -> None:
        """Polls the completion queue itself while it waits (the waiting thread has nothing else to do; a
        hand-off to the progress thread costs a wake-up, milliseconds under QEMU TCG)."""
        limit = self.endpoint.timeout_s if timeout is None else timeout
        deadline = time.monotonic() + limit
        idle = 0
        self.endpoint.waiters += 1
        try:
            while not self.done.is_set():
                if self.endpoint.poll_once():
                    idle = 0
                    continue
                idle += 1
                if time.monotonic() > deadline:
                    raise RdmaError(f"RDMA operation did not complete within {limit:g} s "
                                    f"({self.endpoint.describe()})")
                time.sleep(0 if idle < WAIT_SPINS else WAIT_POLL_S)
        finally:
            self.endpoint.waiters -= 1
        if self.error:
            raise RdmaError(self.error)

    def finish(self, error: str = "") -> None:
        self.error = self.error or error
        self.finished_at = time.monotonic()
        self.done.set()


@dataclass(slots=True)
class _SendOp:
    peer: int
    tag: int
    seq: int
    addr: int
    nbytes: int
    mr: Any
    completion: Completion
    chunks: int
    next_chunk: int = 0
    acked: int = 0


@dataclass(slots=True)
class _RecvOp:
    addr: int
    nbytes: int
    completion: Completion


@dataclass(slots=True)
class _Peer:
    rank: int
    params: LinkParams
    qps: list[Any]
    psns: list[int]
    pool: Any
    """Our MR the peer writes into."""
    headers: Any
    """Our MR of send headers, one per remote slot."""
    remote_addr: int = 0
    remote_rkey: int = 0
    free_remote: deque[int] = field(default_factory=deque)
    pending: deque[_SendOp] = field(default_factory=deque)
    rr: itertools.cycle = field(default_factory=lambda: itertools.cycle([0]))
    """Round robin over the QPs (set to their count at construction)."""
    send_seq: dict[int, int] = field(default_factory=dict)
    recv_seq: dict[int, int] = field(default_factory=dict)
    arrived: dict[tuple[int, int], dict[int, int]] = field(default_factory=dict)
    """(tag, seq) -> chunk index -> our slot holding it."""
    posted: dict[tuple[int, int], _RecvOp] = field(default_factory=dict)


class RdmaEndpoint:
    """One rank's RDMA side: a device context, one CQ, and per peer its QPs and slot pools."""

    def __init__(self, device: str, gid_index: int, rank: int, peers: dict[int, LinkParams],
                 timeout_s: float = 120.0) -> None:
        import pyverbs.enums as e
        from pyverbs.cq import CQ
        from pyverbs.device import Context
        from pyverbs.mr import MR
        from pyverbs.pd import PD
        from pyverbs.qp import QP, QPAttr, QPCap, QPInitAttr

        self.e, self.device, self.gid_index, self.rank, self.timeout_s = e, device, gid_index, rank, timeout_s
        try:
            self.ctx = Context(name=device)
        except Exception as exc:
            raise RdmaError(f"cannot open RDMA device {device!r}: {exc}") from exc
        self.pd = PD(self.ctx)
        self.port = self.ctx.query_port(1)
        self.gid = self.ctx.query_gid(1, gid_index).gid
        depth = sum(2 * p.slots * p.qps + 64 for p in peers.values())
        self.cq = CQ(self.ctx, max(256, 2 * depth))
        self.sink = MR(self.pd, 64, e.IBV_ACCESS_LOCAL_WRITE)
        self.peers: dict[int, _Peer] = {}
        self.by_qpn: dict[int, tuple[_Peer, Any]] = {}
        self.wr_ops: dict[int, tuple[_SendOp | None, int, int]] = {}
        """wr_id -> (send op or None for a credit, peer rank, remote slot)."""
        self.wr_ids = itertools.count(1)
        self.lock = threading.RLock()
        self.error = ""
        remote = e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE
        for rank_, params in peers.items():
            cap = QPCap(max_send_wr=2 * params.slots + 32, max_recv_wr=2 * params.slots + 32, max_send_sge=2,
                        max_recv_sge=1)
            init = QPInitAttr(qp_type=e.IBV_QPT_RC, scq=self.cq, rcq=self.cq, cap=cap)
            attr = QPAttr(port_num=1)
            attr.qp_access_flags = remote
            qps = [QP(self.pd, init, attr) for _ in range(params.qps)]
            peer = _Peer(rank=rank_, params=params, qps=qps, psns=[random.getrandbits(24) for _ in qps],
                         pool=MR(self.pd, params.pool_bytes, remote), headers=MR(self.pd, params.slots * HEADER.size,
                                                                                 e.IBV_ACCESS_LOCAL_WRITE))
            peer.rr = itertools.cycle(range(len(qps)))
            self.peers[rank_] = peer
            for qp in qps:
                self.by_qpn[qp.qp_num] = (peer, qp)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.waiters = 0
        """Threads polling in `Completion.wait`; the progress thread stands aside meanwhile (two pollers fight
        over the GIL: measured under TCG, a 64 B ping-pong took 34 ms one way with both, 25 ms with one)."""

    # -- connection -----------------------------------------------------------------------------------------
    def local_info(self) -> dict[int, dict[str, Any]]:
        """What each peer needs to connect to us (exchanged over the workers' rendezvous)."""
        return {rank: {"qpns": [qp.qp_num for qp in p.qps], "psns": p.psns, "gid": self.gid,
                       "addr": p.pool.buf, "rkey": p.pool.rkey, "slots": p.params.slots,
                       "slot_bytes": p.params.slot_bytes, "mtu": _active_mtu(self.port.active_mtu)}
                for rank, p in self.peers.items()}

    def connect(self, remote: dict[int, dict[str, Any]]) -> None:
        """Move every QP to RTS against the peer's info (`remote[peer]` = that peer's `local_info()[us]`)."""
        from pyverbs.addr import GID, AHAttr, GlobalRoute
        from pyverbs.qp import QPAttr

        e = self.e
        for rank, peer in self.peers.items():
            info = remote[rank]
            if info["slots"] != peer.params.slots or info["slot_bytes"] != peer.params.slot_bytes:
                raise RdmaError(f"rank {self.rank} and rank {rank} disagree on the slot pool "
                                f"({peer.params.slots} x {peer.params.slot_bytes} B vs {info['slots']} x "
                                f"{info['slot_bytes']} B)")
            mtu = min(peer.params.rdma_mtu, info["mtu"], _active_mtu(self.port.active_mtu))
            gid = GID()
            gid.gid = info["gid"]
            for i, qp in enumerate(peer.qps):
                attr = QPAttr(port_num=1)
                attr.qp_access_flags = e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE
                attr.path_mtu = IB_MTUS[mtu]
                attr.dest_qp_num = info["qpns"][i]
                attr.rq_psn = info["psns"][i]
                attr.sq_psn = peer.psns[i]
                attr.max_dest_rd_atomic = 1
                attr.max_rd_atomic = 1
                attr.min_rnr_timer = 12
                attr.timeout = peer.params.timeout_exp
                attr.retry_cnt = 7
                attr.rnr_retry = 7
                attr.ah_attr = AHAttr(port_num=1, is_global=1,
                                      gr=GlobalRoute(dgid=gid, sgid_index=self.gid_index, hop_limit=64))
                qp.to_rts(attr)
                for _ in range(2 * peer.params.slots + 16):
                    self._post_recv(qp)
            peer.remote_addr, peer.remote_rkey = int(info["addr"]), int(info["rkey"])
            peer.free_remote.extend(range(info["slots"]))
        self._thread = threading.Thread(target=self._progress, name=f"rdma-progress-{self.rank}", daemon=True)
        self._thread.start()

    # -- messaging ------------------------------------------------------------------------------------------
    def send(self, addr: int, nbytes: int, peer: int, tag: int) -> Completion:
        """Send `nbytes` at `addr` (kept unchanged until the completion is done) to `peer` under `tag`."""
        from pyverbs.mr import MR

        p = self.peers[peer]
        completion = Completion(self)
        mr = MR(self.pd, max(1, nbytes), self.e.IBV_ACCESS_LOCAL_WRITE, address=addr) if nbytes else None
        with self.lock:
            seq = p.send_seq.get(tag, 0)
            p.send_seq[tag] = seq + 1
            op = _SendOp(peer, tag, seq, addr, nbytes, mr, completion,
                         chunks=max(1, math.ceil(nbytes / p.params.slot_payload)))
            p.pending.append(op)
            self._pump(p)
        return completion

    def recv(self, addr: int, nbytes: int, peer: int, tag: int) -> Completion:
        """Receive the next message from `peer` under `tag` into `nbytes` at `addr`."""
        p = self.peers[peer]
        completion = Completion(self)
        with self.lock:
            seq = p.recv_seq.get(tag, 0)
            p.recv_seq[tag] = seq + 1
            p.posted[(tag, seq)] = _RecvOp(addr, nbytes, completion)
            self._deliver(p, tag, seq)
        return completion

    def describe(self) -> str:
        with self.lock:
            return "; ".join(f"peer {r}: {len(p.free_remote)}/{p.params.slots} remote slots free, "
                             f"{len(p.pending)} sends queued, {len(p.posted)} receives posted, "
                             f"{len(p.arrived)} messages arrived" for r, p in self.peers.items())

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        for peer in self.peers.values():
            for qp in peer.qps:
                qp.close()
            peer.pool.close()
            peer.headers.close()
        self.sink.close()
        self.cq.close()
        self.pd.close()
        self.ctx.close()

    # -- internals (called with the lock held) --------------------------------------------------------------
    def _pump(self, p: _Peer) -> None:
        """Post queued chunks while the peer has free slots."""
        from pyverbs.wr import SGE, SendWR

        e = self.e
        while p.pending and p.free_remote:
            op = p.pending[0]
            slot = p.free_remote.popleft()
            chunk = op.next_chunk
            offset = chunk * p.params.slot_payload
            length = min(p.params.slot_payload, op.nbytes - offset)
            p.headers.write(HEADER.pack(MAGIC, op.tag, op.seq, chunk, op.chunks, length, op.nbytes), HEADER.size,
                            slot * HEADER.size)
            sges = [SGE(p.headers.buf + slot * HEADER.size, HEADER.size, p.headers.lkey)]
            if length > 0:
                sges.append(SGE(op.addr + offset, length, op.mr.lkey))
            wr_id = next(self.wr_ids)
            wr = SendWR(wr_id=wr_id, opcode=e.IBV_WR_RDMA_WRITE_WITH_IMM, num_sge=len(sges), sg=sges,
                        send_flags=e.IBV_SEND_SIGNALED)
            wr.imm_data = slot
            wr.set_wr_rdma(p.remote_rkey, p.remote_addr + slot * p.params.slot_bytes)
            self.wr_ops[wr_id] = (op, p.rank, slot)
            p.qps[next(p.rr)].post_send(wr)
            op.next_chunk += 1
            if op.next_chunk == op.chunks:
                p.pending.popleft()

    def _credit(self, p: _Peer, slot: int) -> None:
        from pyverbs.wr import SGE, SendWR

        e = self.e
        wr_id = next(self.wr_ids)
        empty = SGE(self.sink.buf, 0, self.sink.lkey)        # a zero-length write: only the immediate travels
        wr = SendWR(wr_id=wr_id, opcode=e.IBV_WR_RDMA_WRITE_WITH_IMM, num_sge=1, sg=[empty],
                    send_flags=e.IBV_SEND_SIGNALED)
        wr.imm_data = CREDIT_BIT | slot
        wr.set_wr_rdma(p.remote_rkey, p.remote_addr)
        self.wr_ops[wr_id] = (None, p.rank, slot)
        p.qps[next(p.rr)].post_send(wr)

    def _post_recv(self, qp: Any) -> None:
        from pyverbs.wr import SGE, RecvWR

        # WRITE WITH IMMEDIATE consumes a receive but places nothing in it: one SGE on a small sink.
        qp.post_recv(RecvWR(wr_id=0, num_sge=1, sg=[SGE(self.sink.buf, self.sink.length, self.sink.lkey)]))

    def _deliver(self, p: _Peer, tag: int, seq: int) -> None:
        """Copy a fully arrived message into its posted receive, free its slots, return the credits."""
        op = p.posted.get((tag, seq))
        chunks = p.arrived.get((tag, seq))
        if op is None or chunks is None:
            return
        first = p.pool.buf + chunks[min(chunks)] * p.params.slot_bytes
        _, _, _, _, count, _, total = HEADER.unpack(ctypes.string_at(first, HEADER.size))
        if len(chunks) < count:
            return
        del p.posted[(tag, seq)], p.arrived[(tag, seq)]
        if total != op.nbytes:
            op.completion.finish(f"rank {self.rank}: message from rank {p.rank} tag {tag} has {total} B, the "
                                 f"receive expects {op.nbytes} B")
        else:
            for index, slot in chunks.items():
                base = p.pool.buf + slot * p.params.slot_bytes
                length = HEADER.unpack(ctypes.string_at(base, HEADER.size))[5]
                ctypes.memmove(op.addr + index * p.params.slot_payload, base + HEADER.size, length)
            op.completion.finish()
        for slot in chunks.values():
            self._credit(p, slot)

    def poll_once(self) -> int:
        """Handle what the completion queue holds now; returns how many completions."""
        with self.lock:
            try:
                n, wcs = self.cq.poll(num_entries=32)
            except Exception as exc:           # pyverbs raises on a failed poll
                self._fail(f"rank {self.rank}: polling the CQ failed: {exc}")
                return 0
            for wc in wcs[:max(n, 0)]:
                self._completion(wc)
            return max(n, 0)

    def _progress(self) -> None:
        """Background progress (arrivals copied out, credits returned, queued chunks posted) while the owning
        thread computes; backs off to IDLE_POLL_S when nothing happens."""
        idle = 0
        while not self._stop.is_set():
            if not self.waiters and self.poll_once():
                idle = 0
                continue
            idle += 1
            time.sleep(min(IDLE_POLL_S, 20e-6 * idle))

    def _completion(self, wc: Any) -> None:
        e = self.e
        if wc.status != e.IBV_WC_SUCCESS:
            peer = self.by_qpn[wc.qp_num][0] if wc.qp_num in self.by_qpn else None
            self._fail(f"rank {self.rank}: RDMA to/from rank {peer.rank if peer else '?'} failed: "
                       f"{_status_text(wc.status)} (vendor error {wc.vendor_err}, opcode {wc.opcode})")
            return
        if wc.opcode == e.IBV_WC_RECV_RDMA_WITH_IMM:
            peer, qp = self.by_qpn[wc.qp_num]
            self._post_recv(qp)
            imm = wc.imm_data
            if imm & CREDIT_BIT:
                peer.free_remote.append(imm & ~CREDIT_BIT)
                self._pump(peer)
                return
            base = peer.pool.buf + imm * peer.params.slot_bytes
            magic, tag, seq, chunk, _, _, _ = HEADER.unpack(ctypes.string_at(base, HEADER.size))
            if magic != MAGIC:
                self._fail(f"rank {self.rank}: slot {imm} from rank {peer.rank} holds no message header")
                return
            peer.arrived.setdefault((tag, seq), {})[chunk] = imm
            self._deliver(peer, tag, seq)
            return
        what = self.wr_ops.pop(wc.wr_id, None)
        if what is None or what[0] is None:
            return
        op = what[0]
        op.acked += 1
        if op.acked == op.chunks:
            if op.mr is not None:
                op.mr.close()
            op.completion.finish()

    def _fail(self, message: str) -> None:
        self.error = self.error or message
        with self.lock:
            for peer in self.peers.values():
                for recv in peer.posted.values():
                    recv.completion.finish(message)
                for send in peer.pending:
                    send.completion.finish(message)
            for op, _, _ in self.wr_ops.values():
                if op is not None:
                    op.completion.finish(message)


def _active_mtu(enum_value: int) -> int:
    return {v: k for k, v in IB_MTUS.items()}.get(int(enum_value), 1024)


def _status_text(status: int) -> str:
    try:
        from pyverbs.cq import cqe_status_to_str  # type: ignore[attr-defined]

        return str(cqe_status_to_str(status))
    except Exception:
        return f"status {status}"


def exchange_over(all_gather: Callable[[dict[int, dict[str, Any]]], list[dict[int, dict[str, Any]]]],
                  endpoint: RdmaEndpoint) -> None:
    """Connect `endpoint` using a collective that returns every rank's `local_info()` by rank."""
    infos = all_gather(endpoint.local_info())
    endpoint.connect({peer: infos[peer][endpoint.rank] for peer in endpoint.peers})
