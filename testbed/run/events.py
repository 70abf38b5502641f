"""Events during a run: a link change or outage at a set point of the training (`At(iteration=3, offset_s=0.2,
action=LinkDown("dc-a", "dc-b", for_s=0.2))`), applied by the runner while it supervises the workers.

When: the workers report each iteration's end on stdout; rank 0's report of the iteration that precedes the
target on every rank (the workers run their schedules interleaved, A B in odd iterations and B A in even ones,
after one warm-up iteration of each: workloads/worker.py) is the target's start, and the action is applied
`offset_s` later. (Rank 0 ends an iteration last, and every rank starts the next one at a barrier it reaches then;
before the first timed iteration the workers' reference compute runs too, so an offset into iteration 1 counts
from the warm-up's end.) In a dilated run every offset and duration is k times longer, as the run itself is.

What:
- `LinkDown(a, b, for_s)`: both directions of the link stop carrying: their HTB class is set to `pause_rate_bps`,
  so packets queue in the rate limiter's queue (sized to hold every sender's TCP window: lossless links do not
  drop) and leave, in order, when the rate is put back `for_s` later. The delay line and netem are not touched.
- `LinkChange(a, b, delay_s=..., rate_bps=..., for_s=...)`: new values through `set_link` (the code of
  `testbed link set`), put back `for_s` later, or at the end of the run.
Every change is undone when the run ends, however it ends (also on a signal). Each event is recorded: when it
was applied and undone, in the run's trace time (seconds from the first iteration's start, undilated), in
summary.json (`events`) and in trace.json (a span on an `events` track and an instant marker).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from testbed.backends.base import Backend
from testbed.deploy.linkset import set_link
from testbed.errors import TestbedError
from testbed.plan.builder import ETH_OVERHEAD
from testbed.plan.model import LinkDirection
from testbed.shaping import htb
from testbed.util.interrupts import cleanup

PAUSE_RATE_BPS = 1000.0
"""The floor of a down link's rate (`pause_rate_bps`): HTB's buffer (burst over rate) stays within its 32-bit tick
counts."""


def pause_rate_bps(mtu: int, for_s: float) -> float:
    """The rate of a link that is down for `for_s`: one frame of the link's MTU per outage. HTB charges a packet
    after sending it, at the class's rate then, and a changed class keeps its tokens: the first packet dequeued
    after the pause begins still leaves, and its cost is what the restored link owes. At 1000 bit/s a 9000-byte
    frame left a 72 s deficit that stalled the run after a 200 ms outage; at this rate the cost ends with the
    outage, and at most about one frame (and HTB's burst) leaves during it."""
    return max(PAUSE_RATE_BPS, (mtu + ETH_OVERHEAD) * 8 / for_s)


class EventError(TestbedError, ValueError):
    """An event that cannot be applied to this run; the message says why and what would work."""


@dataclass(frozen=True, slots=True)
class LinkDown:
    """Both directions of the a<->b link carry nothing for `for_s` seconds; their packets are held, not dropped."""

    a: str
    b: str
    for_s: float
    kind: str = "link_down"

    def describe(self) -> str:
        return f"link {self.a} <-> {self.b} down for {self.for_s * 1e3:g} ms"


@dataclass(frozen=True, slots=True)
class LinkChange:
    """New delay and/or rate on both directions of the a<->b link (as `testbed link set` sets them), put back
    after `for_s` seconds (None: at the end of the run)."""

    a: str
    b: str
    delay_s: float | None = None
    rate_bps: float | None = None
    for_s: float | None = None
    kind: str = "link_change"
    edge_rate_bps: float | None = None
    """The receiving OTN edges' DC-side port rate (the paper's congestion test: a spine port cut mid-run)."""

    def describe(self) -> str:
        what = [f"delay {self.delay_s * 1e3:g} ms" if self.delay_s is not None else "",
                f"rate {self.rate_bps / 1e6:g} Mbit/s" if self.rate_bps is not None else "",
                f"edge rate {self.edge_rate_bps / 1e6:g} Mbit/s" if self.edge_rate_bps is not None else ""]
        return (f"link {self.a} <-> {self.b} set to {', '.join(w for w in what if w)}"
                + (f" for {self.for_s * 1e3:g} ms" if self.for_s is not None else " until the run ends"))


Action = LinkDown | LinkChange


@dataclass(frozen=True, slots=True)
class At:
    """Apply `action` `offset_s` seconds into timed iteration `iteration` (1 = the first after the warm-up) of
    `schedule` (None: of the run's first schedule to run that iteration)."""

    iteration: int
    action: Action
    offset_s: float = 0.0
    schedule: str | None = None

    def describe(self) -> str:
        return (f"iteration {self.iteration}" + (f" of {self.schedule}" if self.schedule else "")
                + f" + {self.offset_s * 1e3:g} ms: {self.action.describe()}")


@dataclass(slots=True)
class EventRecord:
    """What happened to one event during the run (times in monotonic seconds until `to_json` places them)."""

    at: At
    applied_at: float | None = None
    restored_at: float | None = None
    note: str = ""

    @property
    def restored(self) -> bool:
        return self.applied_at is not None and self.restored_at is not None

    def to_json(self, origin: float, factor: float = 1.0) -> dict[str, Any]:
        """Times as seconds from `origin` (the trace's first iteration start, undilated)."""

        def rel(t: float | None) -> float | None:
            return None if t is None else round(t / factor - origin, 6)

        action = self.at.action
        return {"iteration": self.at.iteration, "offset_s": self.at.offset_s, "schedule": self.at.schedule,
                "kind": action.kind, "link": f"{action.a} <-> {action.b}", "action": action.describe(),
                "applied": self.applied_at is not None, "start_s": rel(self.applied_at),
                "end_s": rel(self.restored_at), "restored": self.restored, "note": self.note,
                "values": {k: getattr(action, k) for k in ("for_s", "delay_s", "rate_bps", "edge_rate_bps")
                           if hasattr(action, k)}}


def iteration_order(schedules: list[str], iterations: int) -> list[tuple[str, int]]:
    """(schedule, iteration) in the order every worker runs them: one warm-up (0) of each, then the timed ones
    with the schedules in order on odd iterations and reversed on even ones (workloads/worker.py `_abba`)."""
    order = [(s, 0) for s in schedules]
    for it in range(1, iterations + 1):
        order += [(s, it) for s in (schedules if it % 2 else list(reversed(schedules)))]
    return order


def trigger_of(at: At, schedules: list[str], iterations: int) -> tuple[str, int]:
    """The (schedule, iteration) whose end on rank 0 starts the event's iteration."""
    order = iteration_order(schedules, iterations)
    index = next(i for i, (s, it) in enumerate(order) if it == at.iteration and at.schedule in (None, s))
    return order[index - 1]


def _link_directions(backend: Backend, a: str, b: str) -> list[LinkDirection]:
    return [d for d in backend.state.plan.directions if {d.src_dc, d.dst_dc} == {a, b}]


def validate(events: list[At], backend: Backend, schedules: list[str], iterations: int, hang_timeout_s: float) -> None:
    """Refuse, before anything runs, events this run cannot apply."""
    for at in events:
        if not isinstance(at, At) or not isinstance(at.action, LinkDown | LinkChange):
            raise EventError(f"an event is At(iteration=..., offset_s=..., action=link_down(...) or link_set(...)), "
                             f"got {at!r}")
        if not 1 <= at.iteration <= iterations:
            raise EventError(f"{at.describe()}: the run's timed iterations are 1..{iterations} (0 is the warm-up)")
        if at.schedule is not None and at.schedule not in schedules:
            raise EventError(f"{at.describe()}: {at.schedule!r} is not one of the run's schedules ({', '.join(schedules)})")
        if not math.isfinite(at.offset_s) or at.offset_s < 0:
            raise EventError(f"{at.describe()}: offset_s must be >= 0")
        action = at.action
        if not _link_directions(backend, action.a, action.b):
            links = ", ".join(sorted({f"{d.src_dc} <-> {d.dst_dc}" for d in backend.state.plan.directions
                                      if d.src_dc < d.dst_dc}))
            raise EventError(f"{at.describe()}: no OTN link between {action.a!r} and {action.b!r}; links: {links}")
        if backend.state.shaper_name == "none":
            raise EventError(f"{at.describe()}: the testbed runs without a shaper (--shaper none); links cannot change")
        for_s = action.for_s
        if for_s is not None and (not math.isfinite(for_s) or for_s <= 0):
            raise EventError(f"{at.describe()}: for_s must be > 0")
        if isinstance(action, LinkDown) and for_s >= hang_timeout_s:
            raise EventError(f"{at.describe()}: an outage of {for_s:g} s reaches the run's hang timeout "
                             f"({hang_timeout_s:g} s), which would stop the run; raise hang_timeout_s or shorten it")
        if isinstance(action, LinkChange) and action.delay_s is None and action.rate_bps is None \
                and action.edge_rate_bps is None:
            raise EventError(f"{at.describe()}: give a delay, a rate and/or an edge rate")


@dataclass(slots=True)
class _Pending:
    record: EventRecord
    due: float
    undo: Callable[[], None] | None = None


@dataclass(slots=True)
class EventPlayer:
    """Applies a run's events as the workers' reports come in (`observe`), at their time (`tick`, `wait_s`), and
    undoes every change at the end (`close`); one per launch of the workers."""

    backend: Backend
    events: list[At]
    schedules: list[str]
    iterations: int
    factor: float = 1.0
    """The run's time dilation: offsets and durations are k times longer in a dilated run."""
    log: Callable[[str], None] = print
    clock: Callable[[], float] = time.monotonic
    records: list[EventRecord] = field(default_factory=list)
    _waiting: dict[tuple[str, int], list[EventRecord]] = field(default_factory=dict)
    _due: list[_Pending] = field(default_factory=list)
    _undo: list[_Pending] = field(default_factory=list)

    def __post_init__(self) -> None:
        for at in self.events:
            record = EventRecord(at)
            self.records.append(record)
            self._waiting.setdefault(trigger_of(at, self.schedules, self.iterations), []).append(record)

    def observe(self, event: dict[str, Any]) -> None:
        """A worker's report: rank 0's end of the iteration before an event's arms it."""
        if event.get("event") != "iteration" or event.get("rank") != 0:
            return
        key = (str(event.get("schedule", self.schedules[0])), int(event["iteration"]))
        now = self.clock()
        for record in self._waiting.pop(key, []):
            self._due.append(_Pending(record, now + record.at.offset_s * self.factor))

    def wait_s(self) -> float:
        """Seconds until the next thing to do (inf: nothing armed)."""
        times = [p.due for p in (*self._due, *self._undo)]
        return max(0.0, min(times) - self.clock()) if times else math.inf

    def tick(self) -> None:
        """Apply what is due, and undo what has lasted its time."""
        now = self.clock()
        for pending in [p for p in self._undo if p.due <= now]:
            self._undo.remove(pending)
            self._restore(pending)
        for pending in [p for p in self._due if p.due <= now]:
            self._due.remove(pending)
            self._apply(pending.record)

    def close(self) -> None:
        """Undo every change still in force (also when the run failed or was interrupted)."""
        with cleanup():
            for pending in list(self._undo):
                self._undo.remove(pending)
                self._restore(pending, note="restored when the run ended")
        for pending in self._due:
            pending.record.note = "not applied: the run ended first"
        for records in self._waiting.values():
            for record in records:
                record.note = "not applied: the run ended before its iteration"
        self._due.clear()
        self._waiting.clear()

    def in_force(self) -> str:
        """The events applied so far, in words (for an error that ends the run)."""
        return "; ".join(f"{r.at.describe()} ({'applied and undone' if r.restored else 'in force when the run stopped'})"
                         for r in self.records if r.applied_at is not None)

    def _apply(self, record: EventRecord) -> None:
        action = record.at.action
        with cleanup():                   # a change happens whole, or not at all, whatever signal arrives
            if isinstance(action, LinkDown):
                directions = _link_directions(self.backend, action.a, action.b)
                for d in directions:
                    self._rate(d, pause_rate_bps(d.mtu, action.for_s * self.factor))
                undo = self._resume(action)
            else:
                before = _link_directions(self.backend, action.a, action.b)
                set_link(self.backend, action.a, action.b,
                         delay_s=None if action.delay_s is None else action.delay_s * self.factor,
                         rate_bps=None if action.rate_bps is None else action.rate_bps / self.factor,
                         edge_rate_bps=None if action.edge_rate_bps is None else action.edge_rate_bps / self.factor)
                undo = self._put_back(before)
            record.applied_at = self.clock()
        self._undo.append(_Pending(record, record.applied_at + action.for_s * self.factor if action.for_s else math.inf,
                                   undo))
        self.log(f"  event: {record.at.describe()}: applied")

    def _restore(self, pending: _Pending, note: str = "") -> None:
        with cleanup():
            if pending.undo is not None:
                pending.undo()
            pending.record.restored_at = self.clock()
        pending.record.note = note
        self.log(f"  event: {pending.record.at.action.describe()}: undone" + (f" ({note})" if note else ""))

    def _resume(self, action: LinkDown) -> Callable[[], None]:
        def undo() -> None:
            for d in _link_directions(self.backend, action.a, action.b):
                self._rate(d, d.rate_bps)           # the plan's rate now (k times lower in a dilated run)
        return undo

    def _put_back(self, before: list[LinkDirection]) -> Callable[[], None]:
        def undo() -> None:
            for d in before:
                set_link(self.backend, d.src_dc, d.dst_dc, from_dc=d.src_dc, delay_s=d.delay_s, rate_bps=d.rate_bps,
                         edge_rate_bps=d.edge.drain_rate_bps if d.edge else None)
        return undo

    def _rate(self, d: LinkDirection, rate_bps: float) -> None:
        with self.backend.netlink(d.src_node) as ipr:
            htb.change_rate(ipr, d.src_ifname, rate_bps)


@contextmanager
def playing(player: EventPlayer | None) -> Iterator[None]:
    """The player's changes undone when the block ends; an error that ends the run names the events in force."""
    if player is None:
        yield
        return
    try:
        yield
    except Exception as exc:
        context = player.in_force()
        if context and exc.args and isinstance(exc.args[0], str):
            exc.args = (f"{exc.args[0]}\nevents applied during the run: {context}", *exc.args[1:])
        raise
    finally:
        player.close()


def write_records(run_dir: Path, records: list[EventRecord], origin: float, factor: float = 1.0) -> list[dict[str, Any]]:
    """The events into the run's summary.json (`events`) and trace.json (an `events` track: a span per change,
    an instant marker where it began); returns them as recorded."""
    rows = [r.to_json(origin, factor) for r in records]
    summary_path, trace_path = run_dir / "summary.json", run_dir / "trace.json"
    if summary_path.exists():
        doc = json.loads(summary_path.read_text())
        doc["events"] = rows
        summary_path.write_text(json.dumps(doc, indent=1))
    if trace_path.exists():
        trace = json.loads(trace_path.read_text())
        events = trace.setdefault("traceEvents", [])
        pid = 1 + max((e.get("pid", 0) for e in events), default=0)
        events.append({"ph": "M", "name": "process_name", "pid": pid, "args": {"name": "events"}})
        events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": 0, "args": {"name": "links"}})
        for row in rows:
            if row["start_s"] is None:
                continue
            end = row["end_s"] if row["end_s"] is not None else row["start_s"]
            events.append({"ph": "X", "name": row["action"], "cat": "event", "pid": pid, "tid": 0,
                           "ts": row["start_s"] * 1e6, "dur": max(0.0, end - row["start_s"]) * 1e6, "args": row})
            events.append({"ph": "i", "s": "g", "name": f"{row['kind']} {row['link']}", "cat": "event", "pid": pid,
                           "tid": 0, "ts": row["start_s"] * 1e6})
        trace_path.write_text(json.dumps(trace))
    return rows
