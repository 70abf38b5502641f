"""Dry-run a schedule: a discrete-event model of the pipeline that catches deadlocks and predicts timing.

Model (the same semantics the executor runs under gloo/TCP):
- F/B of stage s take `forward_s[s]` / `backward_s[s]`, or per micro-batch what `forward_mb_s` /
  `backward_mb_s` give (a draw of the measured times); sends and receive posts take no time, except a
  measured lag from a compute's end to its message's post and to a receive's post (`send_lag_s`,
  `recv_lag_s`, compute as time).
- A message over the link between stages s and s+1 (one-way delay d, rate R, `bytes`) is receiver-driven,
  as gloo's TCP pair is: it starts when both the send is issued (t_send) and the receiver's post has
  reached the sender (t_post + d; the post's notice rides the same connection back, so it leaves only after
  the messages the receiver already sends that way have left); it then occupies the link for bytes/R
  (messages in one direction queue in program order) and arrives d later. A receive posted just in time
  therefore costs an extra round trip.
  Over RDMA (`Costs.receiver_driven` False) a message starts when it is sent: it is written into a slot the
  receiver holds for it (the slot pool's limit on how far a sender runs ahead is not modelled).
Predicts per-stage compute time, iteration time, bubble ratio, exposed communication and peak in-flight
memory (stashes and posted receive buffers, as workloads.memory defines it); reports a deadlock with every
blocked rank's next action.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import deque
from dataclasses import dataclass, field

from workloads.errors import TestbedError
from workloads.schedule import Action, Op, Schedule


@dataclass(frozen=True, slots=True)
class Costs:
    """Times and sizes the model needs (seconds, bytes, bytes/s)."""

    forward_s: list[float]
    backward_s: list[float]
    link_delay_s: list[float]
    """Per link between stage s and s+1 (len = stages - 1)."""
    link_bytes_per_s: list[float]
    activation_bytes: int
    stash_bytes: int
    """Memory a stage holds per micro-batch between its F and B (in-flight activation)."""
    message_overhead_s: float = 0.0
    """Fixed cost per message beyond delay and transfer (stack, hand-shake, dispatch); fitted from a run."""
    dispatch_s: list[float] | None = None
    """Per stage: time per F or B spent neither computing nor waiting (the executor's own work between
    spans: posting, allocating, bookkeeping); it delays the pipeline but is not compute."""
    receiver_driven: bool = True
    """gloo's TCP: a send starts once the receive is posted. False: RDMA writes into the receiver's slots."""
    forward_mb_s: list[list[float]] | None = None
    """Per stage, per micro-batch: its forward's own time (a draw from the measured distribution,
    workloads/sampling.py); overrides `forward_s` where given."""
    backward_mb_s: list[list[float]] | None = None
    link_overhead_s: list[float] | None = None
    """Per link between stage s and s+1: its own cost per message (as probed); overrides `message_overhead_s`."""
    send_lag_s: list[float] | None = None
    """Per stage: from an F's or B's end to when its message begins to be posted (compute as time: the
    executor's and the sender thread's own time, which the device's timeline does not wait for)."""
    recv_lag_s: list[float] | None = None
    """Per stage: from its compute before a receive to the receive's post (compute as time)."""
    start_s: list[float] | None = None
    """Per stage: when it begins the iteration, against stage 0 (measured: a start barrier across the links lets
    the later stages out up to a link delay earlier, so their first receives' notices are already on the way);
    the step is counted from stage 0's start, as the run counts it. None: every stage at 0."""

    def overhead(self, link: int) -> float:
        return self.link_overhead_s[link] if self.link_overhead_s else self.message_overhead_s

    def forward(self, stage: int, mb: int) -> float:
        return self.forward_mb_s[stage][mb] if self.forward_mb_s else self.forward_s[stage]

    def backward(self, stage: int, mb: int) -> float:
        return self.backward_mb_s[stage][mb] if self.backward_mb_s else self.backward_s[stage]


@dataclass(slots=True)
class Prediction:
    iteration_s: float
    compute_s: list[float]
    bubble_ratio: list[float]
    exposed_comm_s: list[float]
    peak_inflight_bytes: list[int]
    end_s: list[float] = field(default_factory=list)

    @property
    def mean_bubble_ratio(self) -> float:
        return sum(self.bubble_ratio) / len(self.bubble_ratio)


class Deadlock(TestbedError, RuntimeError):
    """No rank can move: each blocked rank's next action and what it waits for."""


def simulate(schedule: Schedule, costs: Costs) -> Prediction:
    stages = len(schedule)
    clock = list(costs.start_s) if costs.start_s else [0.0] * stages
    origin = costs.start_s[0] if costs.start_s else 0.0
    pos = [0] * stages
    wait = [0.0] * stages
    compute = [0.0] * stages
    inflight = [0] * stages
    peak = [0] * stages
    posted: dict[tuple[str, int, int], float] = {}     # (dir, receiving stage, mb) -> post time
    sent: dict[tuple[str, int, int], float] = {}       # (dir, receiving stage, mb) -> send time
    arrival: dict[tuple[str, int, int], float] = {}
    notified: dict[tuple[str, int, int], float] = {}    # when a receive's post has reached its sender
    starts: dict[tuple[str, int], list[float]] = {}    # per (dir, receiving stage): transfers' starts and ends,
    ends: dict[tuple[str, int], list[float]] = {}      # both rising (one link in program order)
    link_free: dict[tuple[str, int], float] = {}
    order: dict[tuple[str, int], deque[int]] = {}      # sends per (dir, receiving stage), program order

    def link_of(direction: str, dst: int) -> int:
        return dst - 1 if direction == "F" else dst

    def resolve(direction: str, dst: int) -> None:
        queue = order.get((direction, dst), deque())
        while queue:
            mb = queue[0]
            key = (direction, dst, mb)
            if costs.receiver_driven and key not in posted:
                return
            link = link_of(direction, dst)
            d, rate = costs.link_delay_s[link], costs.link_bytes_per_s[link]
            ready = max(sent[key], notified[key]) if costs.receiver_driven else sent[key]
            start = max(ready, link_free.get((direction, dst), float("-inf")))
            link_free[(direction, dst)] = start + costs.activation_bytes / rate
            starts.setdefault((direction, dst), []).append(start)
            ends.setdefault((direction, dst), []).append(link_free[(direction, dst)])
            arrival[key] = link_free[(direction, dst)] + d + costs.overhead(link)
            queue.popleft()

    def step(s: int) -> bool:
        a: Action = schedule[s][pos[s]]
        if a.op in (Op.RECV_F, Op.RECV_B):
            direction = "F" if a.op is Op.RECV_F else "B"
            posted[(direction, s, a.mb)] = clock[s] + (costs.recv_lag_s[s] if costs.recv_lag_s else 0.0)
            # the post's notice travels back on the same connection, behind what this stage is sending there now
            back = ("B", s - 1) if direction == "F" else ("F", s + 1)
            before = bisect_right(starts.get(back, []), posted[(direction, s, a.mb)])
            ahead = ends[back][before - 1] if before else float("-inf")
            link = link_of(direction, s)
            notified[(direction, s, a.mb)] = (max(posted[(direction, s, a.mb)], ahead)
                                              + costs.link_delay_s[link] + costs.overhead(link))
            inflight[s] += costs.activation_bytes          # a posted receive buffer (workloads.memory)
            peak[s] = max(peak[s], inflight[s])
            resolve(direction, s)
        elif a.op in (Op.SEND_F, Op.SEND_B):
            direction, dst = ("F", s + 1) if a.op is Op.SEND_F else ("B", s - 1)
            sent[(direction, dst, a.mb)] = clock[s] + (costs.send_lag_s[s] if costs.send_lag_s else 0.0)
            order.setdefault((direction, dst), deque()).append(a.mb)
            resolve(direction, dst)
        else:
            forward = a.op is Op.FORWARD
            needs = (forward and s > 0) or (not forward and s < stages - 1)
            start = clock[s]
            if needs:
                key = ("F" if forward else "B", s, a.mb)
                if key not in arrival:
                    return False
                start = max(start, arrival[key])
            wait[s] += max(0.0, start - max(clock[s], origin))     # waits before stage 0's start are not the step's
            cost = costs.forward(s, a.mb) if forward else costs.backward(s, a.mb)
            clock[s] = start + cost + (costs.dispatch_s[s] if costs.dispatch_s else 0.0)
            compute[s] += cost
            if forward:
                if s > 0:
                    inflight[s] -= costs.activation_bytes
                inflight[s] += costs.stash_bytes
                peak[s] = max(peak[s], inflight[s])
            else:
                inflight[s] -= costs.stash_bytes + (costs.activation_bytes if s < stages - 1 else 0)
        pos[s] += 1
        return True

    while True:
        progressed = False
        for s in range(stages):
            while pos[s] < len(schedule[s]) and step(s):
                progressed = True
        if all(pos[s] == len(schedule[s]) for s in range(stages)):
            break
        if not progressed:
            blocked = [f"rank {s} at {schedule[s][pos[s]]} (action {pos[s]})" for s in range(stages)
                       if pos[s] < len(schedule[s])]
            raise Deadlock("deadlock: " + "; ".join(blocked))
    iteration = max(clock) - origin
    return Prediction(iteration_s=iteration, compute_s=compute,
                      bubble_ratio=[1 - c / iteration for c in compute], exposed_comm_s=wait,
                      peak_inflight_bytes=peak, end_s=[c - origin for c in clock])
