"""Pipeline schedules as data: one list of actions per rank (cf. torch.distributed.pipelining's `_Action`).

Actions (microbatch `i`):
  RF i  post the receive of i's activation from the previous stage (non-blocking)
  F  i  forward of i (waits for RF i's data on stages > 0)
  SF i  send i's output activation to the next stage (non-blocking)
  RB i  post the receive of i's output gradient from the next stage (non-blocking)
  B  i  backward of i (waits for RB i's data on stages < last)
  SB i  send i's input gradient to the previous stage (non-blocking)
Text form: `RF3 F3 SF3 ...`, one line per rank (golden files in tests/golden/).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from workloads.errors import TestbedError
from workloads.memory import activation_lookahead, pipeline_warmup


class Op(StrEnum):
    RECV_F = "RF"
    FORWARD = "F"
    SEND_F = "SF"
    RECV_B = "RB"
    BACKWARD = "B"
    SEND_B = "SB"


@dataclass(frozen=True, slots=True)
class Action:
    op: Op
    mb: int

    def __str__(self) -> str:
        return f"{self.op.value}{self.mb}"

    @classmethod
    def parse(cls, text: str) -> Action:
        m = re.fullmatch(r"(RF|SF|RB|SB|F|B)(\d+)", text)
        if not m:
            raise ValueError(f"not an action: {text!r} (write e.g. F3, RB0)")
        return cls(Op(m.group(1)), int(m.group(2)))


Schedule = list[list[Action]]
"""One action list per rank (rank = stage)."""

SCHEDULES = ("gpipe", "1f1b", "1f1b-prefetch", "geopipe")
def _fwd(stage: int, stages: int, mb: int, recv: bool = True) -> list[Action]:
    acts = [Action(Op.RECV_F, mb)] if stage > 0 and recv else []
    acts.append(Action(Op.FORWARD, mb))
    if stage < stages - 1:
        acts.append(Action(Op.SEND_F, mb))
    return acts


def _bwd(stage: int, stages: int, mb: int, recv: bool = True) -> list[Action]:
    acts = [Action(Op.RECV_B, mb)] if stage < stages - 1 and recv else []
    acts.append(Action(Op.BACKWARD, mb))
    if stage > 0:
        acts.append(Action(Op.SEND_B, mb))
    return acts


def gpipe(stages: int, microbatches: int) -> Schedule:
    """All forwards, then all backwards; receives posted just before use."""
    return [[a for mb in range(microbatches) for a in _fwd(s, stages, mb)]
            + [a for mb in range(microbatches) for a in _bwd(s, stages, mb)] for s in range(stages)]


def one_f_one_b(stages: int, microbatches: int) -> Schedule:
    """1F1B as PyTorch's Schedule1F1B runs it: p-1-s warm-up forwards, then alternate; receives just in time."""
    result = []
    for s in range(stages):
        warmup = min(stages - 1 - s, microbatches)
        acts: list[Action] = []
        for mb in range(warmup):
            acts += _fwd(s, stages, mb)
        for i in range(microbatches - warmup):
            acts += _fwd(s, stages, warmup + i)
            acts += _bwd(s, stages, i)
        for mb in range(microbatches - warmup, microbatches):
            acts += _bwd(s, stages, mb)
        result.append(acts)
    return result


@dataclass(frozen=True, slots=True)
class GeoPipeSizing:
    """How GeoPipe sized each stage: extra in-flight micro-batches and receive look-ahead, and what bound them."""

    extra_inflight: tuple[int, ...]
    recv_lookahead: tuple[int, ...]
    wanted_extra: tuple[int, ...]
    """Extra micro-batches that would hide every link after the stage (at the fast compute quantile)."""
    bound: tuple[str, ...]
    """Per stage: 'hidden', 'memory budget', 'micro-batches', 'next stage' (kept within one of the stage
    before it, else the pipeline deadlocks), or 'no link'."""
    cover_s: tuple[float, ...] = ()
    """Per stage: the time its micro-batch's data spends on the links after it (there and back)."""
    slack: tuple[int, ...] = ()
    """Of `wanted_extra`, the micro-batches owed to the compute's spread (the plan over the measured
    distribution less the plan at the mean times)."""
    budget_bytes: tuple[int, ...] = ()
    """Per stage: the memory budget it was sized under (empty: none)."""
    footprint_bytes: tuple[int, ...] = ()
    """Per stage: the in-flight bytes this sizing holds at its peak (the memory model's figure)."""
    why: tuple[str, ...] = ()
    """Per stage, in words: why this many (what one fewer would cost in expected step time)."""

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> GeoPipeSizing:
        return cls(**{key: tuple(value) for key, value in data.items()})

    @classmethod
    def prefetch(cls, stages: int, microbatches: int) -> GeoPipeSizing:
        """No extra micro-batches: 1F1B's order and stashes, every receive posted as early as geopipe posts it."""
        look = tuple(activation_lookahead(s, stages, microbatches, 0) for s in range(stages))
        return cls((0,) * stages, look, (0,) * stages, ("prefetch",) * stages)


def geopipe(stages: int, microbatches: int, plan: GeoPipeSizing) -> Schedule:
    """1F1B with cross-DC-aware overlap: every receive posted ahead of need (the activation look-ahead and
    each gradient right after its activation leaves), and extra warm-up forwards on the stages before long
    links so that they compute while activations and gradients cross. With no extra micro-batches
    (`GeoPipeSizing.prefetch`) this is `1f1b-prefetch`: 1F1B's order and memory with early receives."""
    return [_geopipe_rank(s, stages, microbatches, plan) for s in range(stages)]


def _geopipe_rank(s: int, stages: int, microbatches: int, plan: GeoPipeSizing) -> list[Action]:
    warmup = min(pipeline_warmup(s, stages) + plan.extra_inflight[s], microbatches)
    ahead = min(plan.recv_lookahead[s], microbatches) if s > 0 else 0
    acts: list[Action] = [Action(Op.RECV_F, mb) for mb in range(ahead)]
    posted = ahead if s > 0 else microbatches
    order = list(range(warmup)) + [x for i in range(microbatches - warmup) for x in (warmup + i, -1 - i)]
    order += [-1 - mb for mb in range(microbatches - warmup, microbatches)]
    for item in order:                       # >= 0: forward of that micro-batch; < 0: backward of -1 - item
        if item < 0:
            acts += _bwd(s, stages, -1 - item, recv=False)
            continue
        acts += _fwd(s, stages, item, recv=False)
        if s < stages - 1:
            acts.append(Action(Op.RECV_B, item))
        if s > 0 and posted < microbatches:
            acts.append(Action(Op.RECV_F, posted))
            posted += 1
    return acts


def to_text(schedule: Schedule) -> str:
    return "\n".join(" ".join(str(a) for a in rank) for rank in schedule) + "\n"


def from_text(text: str) -> Schedule:
    return [[Action.parse(t) for t in line.split()] for line in text.strip().splitlines()]


def posting_order(actions: list[Action], receives_before_sends: bool) -> list[Action]:
    """One rank's actions in the order an executor posts them: as scheduled, or, where its transport asks for it
    (workloads/transport.py: `Transport.receives_before_sends`), with the receives that follow an F's or B's own
    send moved before that send (a receive's post never waits, and its notice then leaves ahead of the data).
    The executor runs this list and the trace records it, so the models replay what ran."""
    if not receives_before_sends:
        return list(actions)
    out: list[Action] = []
    i = 0
    while i < len(actions):
        a = actions[i]
        out.append(a)
        i += 1
        own_send = {Op.FORWARD: Op.SEND_F, Op.BACKWARD: Op.SEND_B}.get(a.op)
        if own_send is None or i >= len(actions) or actions[i] != Action(own_send, a.mb):
            continue
        send = actions[i]
        i += 1
        while i < len(actions) and actions[i].op in (Op.RECV_F, Op.RECV_B):
            out.append(actions[i])
            i += 1
        out.append(send)
    return out


class ScheduleError(TestbedError, ValueError):
    """A schedule that cannot run: names the rank, the position and what is wrong."""


def validate(schedule: Schedule, microbatches: int) -> None:
    """Every rank runs F and B of each micro-batch once, B after F, receives posted before use, and every
    send has its matching receive on the neighbour (and vice versa)."""
    stages = len(schedule)
    for s, acts in enumerate(schedule):
        seen: dict[tuple[Op, int], int] = {}
        for pos, a in enumerate(acts):
            if not 0 <= a.mb < microbatches:
                raise ScheduleError(f"rank {s} action {pos} ({a}): micro-batch out of range 0..{microbatches - 1}")
            if (a.op, a.mb) in seen:
                raise ScheduleError(f"rank {s} action {pos} ({a}): repeated (first at {seen[(a.op, a.mb)]})")
            seen[(a.op, a.mb)] = pos
        for mb in range(microbatches):
            for op in (Op.FORWARD, Op.BACKWARD):
                if (op, mb) not in seen:
                    raise ScheduleError(f"rank {s}: {op.value}{mb} missing")
            if seen[(Op.BACKWARD, mb)] < seen[(Op.FORWARD, mb)]:
                raise ScheduleError(f"rank {s}: B{mb} before F{mb}")
            needs = [(Op.RECV_F, Op.FORWARD, s > 0), (Op.RECV_B, Op.BACKWARD, s < stages - 1)]
            for recv, use, required in needs:
                if required and seen.get((recv, mb), 10**9) > seen[(use, mb)]:
                    raise ScheduleError(f"rank {s}: {use.value}{mb} needs {recv.value}{mb} posted before it")
                if not required and (recv, mb) in seen:
                    raise ScheduleError(f"rank {s}: {recv.value}{mb} has no sender")
            for send, after, required in [(Op.SEND_F, Op.FORWARD, s < stages - 1), (Op.SEND_B, Op.BACKWARD, s > 0)]:
                if required and seen.get((send, mb), -1) < seen[(after, mb)]:
                    raise ScheduleError(f"rank {s}: {send.value}{mb} missing or before {after.value}{mb}")
                if not required and (send, mb) in seen:
                    raise ScheduleError(f"rank {s}: {send.value}{mb} has no receiver")


def build(name: str, stages: int, microbatches: int, geo: GeoPipeSizing | None = None) -> Schedule:
    """A named schedule, validated."""
    if name == "gpipe":
        schedule = gpipe(stages, microbatches)
    elif name == "1f1b":
        schedule = one_f_one_b(stages, microbatches)
    elif name == "1f1b-prefetch":
        schedule = geopipe(stages, microbatches, GeoPipeSizing.prefetch(stages, microbatches))
    elif name == "geopipe":
        if geo is None:
            raise ValueError("geopipe needs a GeoPipeSizing (see workloads.sizing.size_geopipe)")
        schedule = geopipe(stages, microbatches, geo)
    elif name in _USER or name in _shipped():
        schedule = user_schedule(name, stages, microbatches)
    else:
        raise ValueError(f"unknown schedule {name!r}; choose one of: {', '.join((*SCHEDULES, *_USER))}")
    validate(schedule, microbatches)
    return schedule


# A user's own schedules (testbed.api.register_schedule): a function (stages, micro-batches) -> one action list
# per rank, run with the same executor, budget, metrics, trace and checks as the built-in ones. The function
# lives in the user's process only: the runner computes its action lists there, checks them (testbed/run/
# userschedules.py) and hands the workers their text (`RF3 F3 SF3 ...`, one line per rank) in a JSON file named
# by USER_SCHEDULES_ENV; `build` in a worker reads them from it, so no user code is imported by the workers.

UserScheduleFn = Callable[[int, int], Any]
"""(stages, micro-batches) -> per-rank actions: a list (one per rank) of lists of `Action` or of text (`F3`), or
of one string per rank (`RF0 F0 SF0 ...`), or the whole text (one line per rank)."""

USER_SCHEDULES_ENV = "TESTBED_USER_SCHEDULES"
"""The file (JSON: name -> {stages, microbatches, text}) a worker reads its user schedules' action lists from."""

_USER: dict[str, UserScheduleFn] = {}
_NAME = re.compile(r"[a-z0-9][a-z0-9_.+-]{0,39}")


def register(name: str, fn: UserScheduleFn) -> None:
    """Make `fn` a schedule named `name` in this process (replacing one of the same name)."""
    from workloads.layouts import TORCH_SCHEDULES

    if not _NAME.fullmatch(name):
        raise ScheduleError(f"schedule name {name!r}: use lowercase letters, digits and . _ + - (at most 40)")
    if name in SCHEDULES or name in TORCH_SCHEDULES or name.startswith("torch-"):
        raise ScheduleError(f"schedule name {name!r} is a built-in schedule's; choose another")
    if not callable(fn):
        raise ScheduleError(f"schedule {name!r}: register a function (stages, microbatches) -> action lists")
    _USER[name] = fn


def unregister(name: str) -> None:
    _USER.pop(name, None)


def registered() -> list[str]:
    """The user schedules registered in this process, in registration order."""
    return list(_USER)


def normalize(result: Any, stages: int) -> Schedule:
    """A user function's result as a Schedule (see UserScheduleFn); a clear error for anything else."""
    if isinstance(result, str):
        result = result.strip().splitlines()
    try:
        ranks = list(result)
    except TypeError:
        raise ScheduleError(f"a schedule function must return one action list per rank, got {type(result).__name__}") from None
    if len(ranks) != stages:
        raise ScheduleError(f"a schedule for {stages} stages needs {stages} action lists (one per rank), got {len(ranks)}")
    schedule: Schedule = []
    for rank, acts in enumerate(ranks):
        items = acts.split() if isinstance(acts, str) else list(acts)
        out = []
        for pos, a in enumerate(items):
            if isinstance(a, Action):
                out.append(a)
                continue
            try:
                out.append(Action.parse(str(a)))
            except ValueError as exc:
                raise ScheduleError(f"rank {rank} action {pos}: {exc}") from None
        schedule.append(out)
    return schedule


def user_schedule(name: str, stages: int, microbatches: int) -> Schedule:
    """A user schedule's action lists, validated: from its function in this process, else (a worker) from the
    text the runner handed over for exactly this shape."""
    if name in _USER:
        schedule = normalize(_USER[name](stages, microbatches), stages)
    else:
        entry = _shipped()[name]
        if (entry["stages"], entry["microbatches"]) != (stages, microbatches):
            raise ScheduleError(f"schedule {name!r} was handed over for {entry['stages']} stages and "
                                f"{entry['microbatches']} micro-batches, not {stages} and {microbatches}")
        schedule = from_text(entry["text"])
    validate(schedule, microbatches)
    return schedule


def _shipped() -> dict[str, dict[str, Any]]:
    """The user schedules the runner handed to this worker (USER_SCHEDULES_ENV); none outside a run."""
    import json
    import os
    from pathlib import Path

    path = os.environ.get(USER_SCHEDULES_ENV)
    return json.loads(Path(path).read_text()) if path else {}
