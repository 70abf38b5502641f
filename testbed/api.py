"""The testbed as a library: bring a topology up, look at it, change its links, train across it, sweep it, and
take the results as tables, from a script or a notebook (as Mininet's users script `Mininet(topo)`).

    from testbed import Testbed, At, link_down

    with Testbed.up("2dc-1000km") as tb:                   # torn down when the block ends, however it ends
        tb.link("dc-a", "dc-b").set(delay="5ms", rate="1gbit")
        summary = tb.run(["1f1b", "geopipe"], microbatches=8,
                         events=[At(iteration=2, offset_s=0.1, action=link_down("dc-a", "dc-b", for_s=0.2))])
        print(summary.to_frame())

Everything here is the code the command line runs (`testbed up/down/link set/verify/run/experiment`), with the
same guarantees: inside `with Testbed.up(...)` an exception, Ctrl-C (SIGINT), SIGTERM or SIGHUP removes every
namespace, daemon and worker the testbed made before it propagates (a second signal does not cut the teardown
short). Ctrl-C then surfaces as KeyboardInterrupt, SIGTERM and SIGHUP as SystemExit(128 + signal), as the
command line's exit status says. Signals are only handled in the main thread. Quantities: numbers are SI
(seconds, bits per second); strings carry their unit (`"5ms"`, `"10gbit"`, as `testbed link set` reads them).
Needs root (network namespaces), as the command line does.
"""

from __future__ import annotations

import atexit
import contextlib
import csv
import dataclasses
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from types import EllipsisType
from typing import Any

from testbed.backends.base import Backend, BackendError
from testbed.check.checks import Check, VerifyReport
from testbed.deploy import lifecycle
from testbed.errors import TestbedError
from testbed.experiment import records as _records
from testbed.experiment.congestion import CongestionSpec
from testbed.run.events import At, EventRecord, LinkChange, LinkDown
from testbed.run.runner import LinkSweep, RunError, RunOptions, SweepPoint
from testbed.run.summary import RunSummary, ScheduleSummary
from testbed.run.userschedules import UserScheduleError
from testbed.state import store as statefile
from testbed.topology.model import FIBRE_DELAY_S_PER_KM
from testbed.util import units
from testbed.util.interrupts import Interrupted, cleanup, unwinding
from workloads import schedule as _schedule
from workloads.schedule import Action, Op, Schedule, ScheduleError

__all__ = [
    "POINT_COLUMNS", "Action", "At", "BackendError", "CongestionSpec",
    "Direction", "EventRecord", "ExperimentResult", "ExperimentSpec",
    "Link", "LinkChange", "LinkControl", "LinkDown", "LinkSweep", "Node", "Op", "RunError", "RunResult", "RunSummary", "Schedule",
    "ScheduleError", "ScheduleSummary", "SweepPoint", "Testbed", "TestbedError", "UserScheduleError", "VerifyResult",
    "km", "link_down", "link_set",
    "register_schedule", "registered_schedules", "run_congestion", "run_experiment", "schedule", "unregister_schedule",
]

VerifyResult = VerifyReport
"""What `Testbed.verify` returns: `.ok`, `.checks` (each a `Check`: kind, subject, expected, measured, ok),
`.failures()`, `.render()`, `.to_json()` (the JSON of `testbed verify --json`)."""

POINT_COLUMNS = _records.POINT_COLUMNS
"""The columns of an experiment's points.csv, and of every `to_frame()` here (one row per schedule measured)."""


# --- signals: one guard for every testbed and call of this module ----------------------------------------------

class _Guard:
    """SIGINT/SIGTERM/SIGHUP become `Interrupted` (testbed.util.interrupts) while a testbed of this process is
    open or one of its calls runs; the outermost holder turns it into KeyboardInterrupt or SystemExit."""

    def __init__(self) -> None:
        self.depth = 0
        self.stack: contextlib.ExitStack | None = None

    def acquire(self) -> None:
        if self.depth == 0 and threading.current_thread() is threading.main_thread():
            self.stack = contextlib.ExitStack()
            self.stack.enter_context(unwinding())
        self.depth += 1

    def release(self) -> None:
        self.depth -= 1
        if self.depth == 0 and self.stack is not None:
            stack, self.stack = self.stack, None
            stack.close()


_GUARD = _Guard()


def _as_python(exc: Interrupted) -> BaseException:
    """A signal as Python code expects it: Ctrl-C as KeyboardInterrupt, SIGTERM/SIGHUP as SystemExit(128 + n)."""
    with contextlib.suppress(OSError):
        print(f"testbed: {exc}; everything the testbed created was removed", file=sys.stderr)
    if exc.signum == 2:
        return KeyboardInterrupt(str(exc))
    return SystemExit(exc.exit_code)


@contextlib.contextmanager
def _guarded() -> Iterator[None]:
    """Signals become `Interrupted` in the block; leaving the outermost block, a Python exception."""
    _GUARD.acquire()
    outermost, held = _GUARD.depth == 1, True
    try:
        yield
    except Interrupted as exc:
        if outermost:
            _GUARD.release()
            held = False
            raise _as_python(exc) from exc
        raise
    finally:
        if held:
            _GUARD.release()


# --- what a testbed is made of -----------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Node:
    """A host or a datacenter router: one network namespace."""

    name: str
    dc: str
    role: str
    """`host` or `router`."""
    netns: str
    addresses: tuple[str, ...]
    """Its interfaces' addresses with their prefix length (`10.0.0.2/24`)."""

    @property
    def ip(self) -> str:
        """Its first address, without the prefix length."""
        return self.addresses[0].split("/")[0] if self.addresses else ""


@dataclass(frozen=True, slots=True)
class Direction:
    """One direction of an OTN link: what is planned (set) and what was measured (by the last `verify`)."""

    src_dc: str
    dst_dc: str
    delay_s: float
    """Planned one-way delay (as set: `link(a, b).set` changes it)."""
    rate_bps: float
    """Planned rate, bits per second."""
    jitter_s: float
    loss: float
    lossless: bool
    mtu: int
    measured_delay_s: float | None = None
    """One-way delay measured by the last `Testbed.verify` (None: not measured since the testbed came up)."""
    measured_rate_bps: float | None = None
    """TCP goodput measured by the last `Testbed.verify("full")` (None: not measured)."""

    @property
    def label(self) -> str:
        return f"{self.src_dc} -> {self.dst_dc}"


@dataclass(frozen=True, slots=True)
class Link:
    """An OTN link between two DCs, with both of its directions (a -> b first)."""

    name: str
    a: str
    b: str
    directions: tuple[Direction, ...]

    @property
    def forward(self) -> Direction:
        return self.directions[0]

    @property
    def backward(self) -> Direction:
        return self.directions[-1]


def km(distance_km: float) -> float:
    """The one-way delay of `distance_km` of fibre (5 us per km), in seconds: `tb.link(a, b).set(delay=km(1000))`."""
    return float(distance_km) * FIBRE_DELAY_S_PER_KM


def _seconds(value: float | str | None, what: str) -> float | None:
    if value is None or isinstance(value, int | float):
        return None if value is None else float(value)
    try:
        return units.parse_time(value)
    except ValueError as exc:
        raise BackendError(f"{what}: {exc}") from None


def _bps(value: float | str | None, what: str) -> float | None:
    if value is None or isinstance(value, int | float):
        return None if value is None else float(value)
    try:
        return units.parse_rate(value)
    except ValueError as exc:
        raise BackendError(f"{what}: {exc}") from None


# --- events --------------------------------------------------------------------------------------------------------

def link_down(a: str, b: str, *, for_s: float | str) -> LinkDown:
    """An outage of the a<->b link (both directions) lasting `for_s`: nothing passes, nothing is dropped (the
    packets wait in the rate limiter's queue and leave in order when it ends). Use it in `At(...)`."""
    seconds = _seconds(for_s, "link_down for_s")
    assert seconds is not None
    return LinkDown(a, b, seconds)


def link_set(a: str, b: str, *, delay: float | str | None = None, rate: float | str | None = None,
             for_s: float | str | None = None, edge_rate: float | str | None = None) -> LinkChange:
    """New delay, rate and/or edge rate (the receiving OTN edges' DC-side port: a spine cut) on the a<->b link (as
    `testbed link set` sets them) for `for_s` (None: until the run ends); every change is put back when the run
    ends. Use it in `At(...)`."""
    return LinkChange(a, b, _seconds(delay, "link_set delay"), _bps(rate, "link_set rate"),
                      _seconds(for_s, "link_set for_s"), edge_rate_bps=_bps(edge_rate, "link_set edge_rate"))


# --- a user's own schedules ------------------------------------------------------------------------------------------

ScheduleFn = Callable[[int, int], Any]
"""(stages, micro-batches) -> one action list per rank: lists of `Action` (or of text such as `"F3"`), one string
per rank (`"RF0 F0 SF0 ..."`), or the whole text (one line per rank)."""


def register_schedule(name: str, fn: ScheduleFn) -> str:
    """Make `fn` a schedule named `name` for this process's runs (`tb.run(schedules=[name])`), with the same
    executor, memory budget, metrics, trace and checks as the built-in ones. Before a run starts, its action lists
    are computed for the run's stages and micro-batches, validated, dry-run for deadlock and held against the
    memory budget: a schedule that fails is refused with the reason (RunError). Returns `name`."""
    _schedule.register(name, fn)
    return name


def schedule(name: str | None = None) -> Callable[[ScheduleFn], ScheduleFn]:
    """Decorator form of `register_schedule` (the function's name, `_` as `-`, unless `name` is given)."""
    def register(fn: ScheduleFn) -> ScheduleFn:
        register_schedule(name or fn.__name__.lower().replace("_", "-"), fn)
        return fn
    return register


def unregister_schedule(name: str) -> None:
    _schedule.unregister(name)


def registered_schedules() -> list[str]:
    return _schedule.registered()


def _schedule_names(schedules: Sequence[str | ScheduleFn] | str) -> list[str]:
    if isinstance(schedules, str):
        return [s.strip() for s in schedules.split(",") if s.strip()]
    names = []
    for s in schedules:
        if callable(s):
            name = getattr(s, "__name__", "user").lower().replace("_", "-")
            if name not in _schedule.registered():
                register_schedule(name, s)
            names.append(name)
        else:
            names.append(str(s))
    return names


# --- results as tables -----------------------------------------------------------------------------------------------

def _frame(rows: list[dict[str, Any]]) -> Any:
    """A pandas DataFrame where pandas is installed, else the rows themselves (a list of dicts)."""
    try:
        import pandas as pd
    except ImportError:
        return rows
    return pd.DataFrame(rows, columns=POINT_COLUMNS)


def _r(value: float | None, scale: float = 1.0) -> float | None:
    return None if value is None else value * scale


@dataclass(kw_only=True, slots=True)
class RunResult(RunSummary):
    """What `Testbed.run` returns: the run's summary (summary.json's RunSummary), where its files are, and the
    events applied during it."""

    run_dir: Path = Path()
    """results/<run-id>/: summary.json, trace.json (chrome://tracing, ui.perfetto.dev), per-rank traces."""
    events: list[dict[str, Any]] = field(default_factory=list)
    """Per event: when it was applied and undone (seconds from the first iteration's start, as in trace.json)."""

    @classmethod
    def of(cls, run_dir: Path, summary: RunSummary) -> RunResult:
        import json

        doc = json.loads((run_dir / "summary.json").read_text()) if (run_dir / "summary.json").exists() else {}
        return cls(**{f.name: getattr(summary, f.name) for f in fields(RunSummary)}, run_dir=run_dir,
                   events=list(doc.get("events", [])))

    def rows(self) -> list[dict[str, Any]]:
        """One row per schedule, with the columns of an experiment's points.csv (sweep `run`; the distance, delay
        and rate are those of the slowest stage link that crosses DCs)."""
        crossing = [lk for lk in self.stage_links if lk.crosses_dc] or list(self.stage_links)
        budget = self.options.get("memory_budget")
        unbudgeted = set(self.options.get("unbudgeted") or [])
        points = {p["label"]: p for p in (self.options.get("sweep") or {}).get("points", [])}
        out = []
        for m in self.schedules:
            load = m.host_load
            point = points.get(m.link_setting or "")
            if point is not None:               # a sweep's point: the swept link's setting
                delay, rate = float(point["delay_s"]), float(point["rate_bps"])
            else:
                delay = max((lk.delay_s for lk in crossing), default=0.0)
                rate = min((lk.rate_bps for lk in crossing), default=None)
            out.append({
                "sweep": "run" if point is None else f"run:{point['label']}", "distance_km": delay / FIBRE_DELAY_S_PER_KM,
                "delay_ms": delay * 1e3,
                "rate_mbit": _r(rate, 1e-6), "microbatches": self.options.get("microbatches"), "schedule": m.schedule,
                "repetition": 0, "memory_budget": None if m.schedule in unbudgeted else budget, "rtt_ms": None,
                "bubble_vs_reference": m.bubble_vs_reference if m.bubble_vs_reference is not None else m.bubble_ratio,
                "bubble_own_spans": m.bubble_ratio, "bubble_model": None, "step_s": m.step_time_s, "step_model_s": None,
                "tokens_per_s": m.tokens_per_s, "exposed_comm_s": m.exposed_comm_s,
                "peak_inflight_bytes": m.peak_inflight_activation_bytes,
                "span_stretch_max": max(m.span_stretch_per_stage) if m.span_stretch_per_stage else None,
                "steal_fraction": load.steal_fraction if load else None, "repeated": m.repeated,
                "loss_last": m.loss_last, "step_model_independent_s": None, "step_blind_model_s": None,
                "link_excess_max_ms": None})
        return out

    def to_frame(self) -> Any:
        """`rows()` as a pandas DataFrame where pandas is installed, else as the list of dicts."""
        return _frame(self.rows())

    def iteration_times(self, schedule: str, setting: str | None = None) -> list[float]:
        """Seconds each timed iteration of `schedule` took (at the sweep point `setting`), first to last, as the
        summary's steps count them (from the first stage's start to the last end; undilated)."""
        import json

        from testbed.run.breakdown import step_of
        from workloads.records import RankTrace

        folder = self.run_dir / (f"{setting}/{schedule}" if setting else schedule)
        ranks = sorted((RankTrace.from_json(json.loads(p.read_text())) for p in folder.glob("rank-*.json")
                        if not p.name.endswith(".dilated.json")), key=lambda r: r.rank)
        if not ranks:
            raise RunError(f"no traces of {schedule!r} in {folder}")
        timed = sorted({it.iteration for it in ranks[0].iterations if not it.warmup})
        return [step_of([next(it for it in r.iterations if it.iteration == i) for r in ranks]) for i in timed]


class ExperimentSpec(_records.ExperimentSpec):
    """What an experiment sweeps (the fields of `testbed experiment`'s options; see testbed/experiment/records.py),
    with `quick()`, the first look in a minute."""

    __slots__ = ()

    @classmethod
    def quick(cls, **overrides: Any) -> ExperimentSpec:
        """`make demo QUICK=1` / `testbed experiment --quick`: one distance (1000 km) against 0 km, two schedules
        (1f1b, geopipe), 8 micro-batches, 3 timed iterations, one repetition, no budget, rate or focus sweeps;
        the same report, plots and model as the full demo, in about 15 s on 2 cores (tests/test_api.py holds it
        under 90 s)."""
        values: dict[str, Any] = {
            "distances_km": [0.0, 1000.0], "focus_km": 1000.0, "schedules": ["1f1b", "geopipe"], "focus_schedules": [],
            "repetitions": 1, "budgets": [], "rates_mbit": [], "microbatch_counts": [], "microbatches": 8,
            "iterations": 3}
        values.update(overrides)
        return cls(**values)


class ExperimentResult:
    """An experiment's results folder (report.md, report.html, plots, summary.json, points.csv) and its record."""

    def __init__(self, exp_dir: Path) -> None:
        self.dir = Path(exp_dir)
        self._record: _records.ExperimentRecord | None = None

    @property
    def record(self) -> _records.ExperimentRecord:
        """summary.json: the spec, the environment, every point with its measured figures and the model's."""
        if self._record is None:
            self._record = _records.ExperimentRecord.load(self.dir)
        return self._record

    @property
    def points(self) -> list[_records.Point]:
        return self.record.points

    @property
    def report(self) -> Path:
        return self.dir / "report.md"

    def summary(self) -> str:
        """The table the command line prints at the end."""
        from testbed.experiment.report import terminal_summary

        return terminal_summary(self.dir)

    def rows(self) -> list[dict[str, Any]]:
        """points.csv as dicts (numbers as numbers, empty cells as None)."""
        with open(self.dir / "points.csv", newline="") as f:
            return [{k: _number(v) for k, v in row.items()} for row in csv.DictReader(f)]

    def to_frame(self) -> Any:
        """points.csv as a pandas DataFrame where pandas is installed, else as `rows()`."""
        try:
            import pandas as pd
        except ImportError:
            return self.rows()
        return pd.read_csv(self.dir / "points.csv")


def _number(text: str | None) -> Any:
    if text is None or text == "":
        return None
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def run_experiment(spec: ExperimentSpec | _records.ExperimentSpec | None = None, *,
               log: Callable[[str], None] | None = print, **fields_: Any) -> ExperimentResult:
    """`testbed experiment`: bring the spec's topology up, verify it, sweep, tear it down, write the report;
    `ExperimentSpec` fields may be given as keywords (`run_experiment(distances_km=[0, 500], microbatches=16)`).
    Stopped early (an error, a signal), it keeps what it measured (marked partial) before the error propagates."""
    from testbed.experiment.sweep import Experiment

    spec = dataclasses.replace(spec, **fields_) if spec is not None else ExperimentSpec(**fields_)
    with _guarded():
        exp_dir = Experiment(spec, log=log or (lambda _m: None)).run()
    return ExperimentResult(exp_dir)


def run_congestion(spec: CongestionSpec | None = None, *, log: Callable[[str], None] | None = print,
                   **fields_: Any) -> Path:
    """`testbed congestion`: the paper's congestion test, one testbed per edge variant (pfc, drop, queue) with the
    topology's background traffic and the spine port cut mid-run; returns the folder with congestion.json,
    congestion.png and report.md. `CongestionSpec` fields may be given as keywords (`iterations=6`)."""
    from testbed.experiment.congestion import run_congestion as run

    spec = dataclasses.replace(spec, **fields_) if spec is not None else CongestionSpec(**fields_)
    with _guarded():
        return run(spec, log=log or (lambda _m: None))


# --- the testbed ------------------------------------------------------------------------------------------------

class LinkControl:
    """The a<->b link of a running testbed: `.set(...)` changes it as `testbed link set` does; `.info` reads it."""

    def __init__(self, tb: Testbed, a: str, b: str) -> None:
        self._tb, self.a, self.b = tb, a, b
        self.info  # noqa: B018 - an unknown link fails here, naming the links there are

    @property
    def info(self) -> Link:
        for link in self._tb.links:
            if {link.a, link.b} == {self.a, self.b}:
                return link
        names = ", ".join(f"{lk.a}<->{lk.b}" for lk in self._tb.links)
        raise BackendError(f"no OTN link between {self.a!r} and {self.b!r} in {self._tb.name}; links: {names}")

    def set(self, *, delay: float | str | None = None, rate: float | str | None = None,
            jitter: float | str | None = None, loss: float | None = None, distance_km: float | None = None,
            from_dc: str | None = None, edge_rate: float | str | None = None) -> Link:
        """New values on both directions (or only the one leaving `from_dc`): `delay` (seconds or `"5ms"`, or
        `distance_km` of fibre at 5 us/km), `rate` (bits/s or `"10gbit"`), `jitter`, `loss` (a fraction; lossless
        links refuse it), `edge_rate` (the receiving OTN edge's DC-side port, on a link with an edge: the
        congestion test's spine cut). The code of `testbed link set`; returns the link as it now is."""
        from testbed.deploy.linkset import set_link

        if distance_km is not None:
            if delay is not None:
                raise BackendError("give a delay or a distance_km, not both")
            delay = km(distance_km)
        with _guarded():
            set_link(self._tb.backend, self.a, self.b, from_dc=from_dc, delay_s=_seconds(delay, "delay"),
                     rate_bps=_bps(rate, "rate"), jitter_s=_seconds(jitter, "jitter"), loss=loss,
                     edge_rate_bps=_bps(edge_rate, "edge_rate"))
        return self.info

    def sweep(self, *, distances_km: Sequence[float] = (), delays: Sequence[float | str] = (),
              rates: Sequence[float | str] = ()) -> LinkSweep:
        """Every combination of the given distances (or delays) and rates of this link, for `Testbed.run(...,
        sweep=...)`: one launch of the workers sets the link to each point in turn between iterations (as the
        experiment's distance sweep does), every schedule at every point, and puts it back afterwards. A dimension
        left out stays at the link's value now."""
        if distances_km and delays:
            raise BackendError("give distances_km or delays, not both")
        now = self.info.forward
        times = [km(d) for d in distances_km] or [_seconds(d, "delay") for d in delays] or [now.delay_s]
        speeds = [_bps(r, "rate") for r in rates] or [now.rate_bps]
        points = [SweepPoint(f"{t / FIBRE_DELAY_S_PER_KM:g}km-{r / 1e6:g}mbit", t, r)  # type: ignore[operator]
                  for r in speeds for t in times]
        return LinkSweep(self.a, self.b, points)


class Testbed:
    """A running testbed: its nodes and links, commands on its nodes, link changes, verification, training runs
    and experiments on it.

    `Testbed.up(topology)` brings one up and owns it: use it in a `with` block (or call `down()`), which removes
    it whatever ends the block. `Testbed.attach(name)` opens one the command line brought up (`testbed up`); it
    is left up afterwards.
    """

    def __init__(self, backend: Backend, *, owned: bool, log: Callable[[str], None] | None = print) -> None:
        self.backend = backend
        self.owned = owned
        self.log: Callable[[str], None] = log or (lambda _m: None)
        self._measured: dict[str, tuple[float | None, float | None]] = {}
        self._closed = False
        self._guarding = False

    # -- bringing up, attaching, tearing down

    @classmethod
    def up(cls, topology: str | Path, *, name: str | None = None, backend: str = "netns", shaper: str = "auto",
           switch: str = "auto", rdma: str | None = None, verify: str = "quick",
           log: Callable[[str], None] | None = print) -> Testbed:
        """Bring `topology` (a shipped name such as `2dc-1000km`, or a YAML file) up as `name` (default: the
        topology's name), with `backend` (netns, mininet), `shaper` (auto, delayline, netem, none), Mininet's
        `switch`, `rdma` (softroce), then `verify` it (`quick`, `full` or `skip`). A verification that fails twice
        removes it again and raises BackendError with the failed checks. Use the result in a `with` block."""
        from testbed.topology import load_topology
        from testbed.util.paths import resolve_topology

        if verify not in ("quick", "full", "skip"):
            raise BackendError(f"verify={verify!r}: choose quick, full or skip")
        path = resolve_topology(str(topology))
        owned = name or load_topology(path).name
        _GUARD.acquire()
        tb: Testbed | None = None
        try:
            result = lifecycle.up(path, owned, backend=backend, shaper=shaper, switch=switch, rdma=rdma)
            tb = cls(lifecycle.open_backend(owned), owned=True, log=log)
            tb._guarding = True
            tb.log(f"testbed {owned} up: {len(result.plan.nodes)} namespaces, shaper {result.shaper}, "
                   f"{result.seconds + result.shaped_seconds:.1f} s")
            atexit.register(tb._at_exit)
            if verify != "skip":
                report = tb.verify(verify)
                if not report.ok:               # a busy host can delay a probe: one more look before giving up
                    tb.log(f"verify ({verify}): {len(report.failures())} check(s) failed; verifying again")
                    report = tb.verify(verify)
                if not report.ok:
                    raise BackendError(f"testbed {owned} does not verify ({verify}): " + "; ".join(
                        f"{c.subject}: expected {c.expected}, measured {c.measured}" for c in report.failures()))
            return tb
        except BaseException as exc:
            with cleanup():
                if tb is not None:
                    tb._close()
                else:
                    _GUARD.release()
            if isinstance(exc, Interrupted) and _GUARD.depth == 0:
                raise _as_python(exc) from exc
            raise

    @classmethod
    def attach(cls, name: str | None = None, *, log: Callable[[str], None] | None = print) -> Testbed:
        """A testbed the command line brought up (`testbed up TOPOLOGY --name NAME`; no name: the only one up).
        It stays up when the `with` block ends."""
        return cls(lifecycle.open_backend(name), owned=False, log=log)

    def __enter__(self) -> Testbed:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        outermost = self._guarding and _GUARD.depth == 1
        try:
            with cleanup():             # a signal now is acknowledged, and raised once the teardown is done
                self._teardown()
        except Interrupted as late:
            self._release()
            if outermost:
                raise _as_python(late) from late
            raise
        self._release()
        if isinstance(exc, Interrupted) and outermost:
            raise _as_python(exc) from exc

    def down(self) -> None:
        """Remove the testbed now (one this object brought up); for an attached one, only let go of it."""
        try:
            with cleanup():
                self._teardown()
        finally:
            self._release()

    def _close(self) -> None:
        try:
            self._teardown()
        finally:
            self._release()

    def _teardown(self) -> None:
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(Exception):
            atexit.unregister(self._at_exit)
        if self.owned and statefile.exists(self.name):
            seconds = lifecycle.down(self.name)
            self.log(f"testbed {self.name} down in {seconds:.1f} s")

    def _release(self) -> None:
        if self._guarding:
            self._guarding = False
            _GUARD.release()

    def _at_exit(self) -> None:
        with contextlib.suppress(Exception):
            self._close()

    # -- what it is

    @property
    def name(self) -> str:
        """The testbed's name (its namespaces are tb-NAME-*; `testbed status NAME` shows it too)."""
        return self.backend.state.name

    @property
    def topology(self) -> str:
        """The name of the topology it was brought up from."""
        return self.backend.state.plan.topology

    @property
    def shaper(self) -> str:
        """The shaper that delays and rate-limits its OTN links: delayline, netem or none."""
        return self.backend.state.shaper_name

    @property
    def nodes(self) -> list[Node]:
        """Every host and router, hosts in pipeline order first."""
        plan = self.backend.state.plan
        return [Node(n.name, n.dc, n.role, n.netns, tuple(str(i.address) for i in n.interfaces if i.address is not None))
                for n in (*plan.hosts, *plan.routers)]

    @property
    def hosts(self) -> list[Node]:
        """The hosts, in the plan's order (the order runs place their stages along)."""
        return [n for n in self.nodes if n.role == "host"]

    def node(self, name: str) -> Node:
        """The node named `name`."""
        for n in self.nodes:
            if n.name == name:
                return n
        raise BackendError(f"no node {name!r} in {self.name}; nodes: {', '.join(n.name for n in self.nodes)}")

    @property
    def links(self) -> list[Link]:
        """Every OTN link with both directions: planned delay and rate (as set now) and the last measured ones."""
        by_link: dict[str, list[Any]] = {}
        for d in self.backend.state.plan.directions:
            by_link.setdefault(d.link, []).append(d)
        out = []
        for name, directions in by_link.items():
            made = tuple(Direction(d.src_dc, d.dst_dc, d.delay_s, d.rate_bps, d.jitter_s, d.loss, d.lossless, d.mtu,
                                   *self._measured.get(d.label, (None, None))) for d in directions)
            out.append(Link(name, directions[0].src_dc, directions[0].dst_dc, made))
        return out

    def link(self, a: str, b: str) -> LinkControl:
        """The a<->b link, to read (`.info`) or change (`.set(delay=..., rate=...)`)."""
        return LinkControl(self, a, b)

    # -- commands on nodes

    def exec(self, node: str, cmd: str | Sequence[str], *, timeout: float | None = None, check: bool = False,
             text: bool = True) -> subprocess.CompletedProcess[Any]:
        """Run `cmd` on `node` to completion (a string runs under `sh -c`), its output captured: `testbed exec`."""
        argv = ["sh", "-c", cmd] if isinstance(cmd, str) else list(cmd)
        with _guarded():
            return self.backend.exec(node, argv, timeout=timeout, check=check, capture_output=True, text=text)

    def popen(self, node: str, cmd: str | Sequence[str], **kwargs: Any) -> subprocess.Popen[Any]:
        """Start `cmd` on `node` (subprocess.Popen's keywords); the caller waits for it or ends it."""
        argv = ["sh", "-c", cmd] if isinstance(cmd, str) else list(cmd)
        return self.backend.popen(node, argv, **kwargs)

    # -- checks

    def verify(self, level: str = "quick") -> VerifyReport:
        """`testbed verify`: routes, reachability, shaper health, one-way delays and drops (`quick`), plus TCP
        goodput per direction (`full`). The measured delays and rates show in `links` afterwards."""
        from testbed.check.verify import verify_testbed

        if level not in ("quick", "full"):
            raise BackendError(f"verify level {level!r}: choose quick or full")
        with _guarded():
            report = verify_testbed(self.backend, level=level)
        self._remember(report.checks)
        return report

    def _remember(self, checks: list[Check]) -> None:
        for d in self.backend.state.plan.directions:
            delay, rate = self._measured.get(d.label, (None, None))
            for c in checks:
                if c.kind == "one-way" and c.key == d.label:
                    delay = c.value
                elif c.kind == "throughput" and (c.key == d.label or c.subject == f"{d.link} {d.label}") and c.value:
                    rate = c.value
            self._measured[d.label] = (delay, rate)

    # -- training

    def run(self, schedules: Sequence[str | ScheduleFn] | str = ("1f1b",), *, microbatches: int = 8,
            memory_budget: str | int | None = None, transport: str = "tcp", compute: str = "real",
            events: Sequence[At] = (), iterations: int = 4, results: str | Path = "results",
            run_id: str | None = None, log: Callable[[str], None] | None | EllipsisType = ...,
            **options: Any) -> RunResult:
        """`testbed run` on this testbed: `schedules` (names, or functions registered on the way: see
        `register_schedule`) interleaved in one launch of the workers, `microbatches` per step, in-flight
        `memory_budget` (`"1f1b+1"`, bytes, `"64MiB"`), `transport` (tcp, rdma, auto), `compute` (real, replay,
        replay:FILE or a profile such as `gpt-7b-h100`), `events` (`At(iteration=..., offset_s=..., action=...)`)
        applied while it trains; more of RunOptions' fields as keywords (microbatch_size, model, stages,
        placement, hang_timeout_s, dilation, `sweep`: see `LinkControl.sweep`). Its progress goes to `log` (default:
        the testbed's; None: silence). Returns the summary the command line writes (summary.json), with `run_dir`,
        `events`, `iteration_times()` and `to_frame()`. A run that fails raises RunError naming the worker and
        quoting its log; a user schedule that deadlocks or breaks the budget is refused before it runs."""
        from testbed.run.runner import run_schedules

        opts = RunOptions(schedules=_schedule_names(schedules), microbatches=microbatches,
                          memory_budget=memory_budget, transport=transport, compute=compute, events=list(events),
                          iterations=iterations, **options)
        with _guarded():
            run_dir, summary = run_schedules(self.backend, opts, Path(results), run_id=run_id,
                                             log=self.log if log is ... else log or (lambda _m: None))
        return RunResult.of(run_dir, summary)

    def experiment(self, spec: _records.ExperimentSpec | None = None, **fields_: Any) -> ExperimentResult:
        """The experiment's sweeps (`testbed experiment`) on this testbed rather than on one of its own: verify,
        the distance sweep and the others, the report; the swept link (the topology's first) is put back as it
        was afterwards. `ExperimentSpec` fields may be given as keywords; the spec's topology is this testbed's."""
        from testbed.experiment.sweep import Experiment

        source = self.backend.state.topology_source
        spec = dataclasses.replace(spec or ExperimentSpec(), topology=source, backend=self.backend.name, **fields_)
        with _guarded():
            exp_dir = Experiment(spec, log=self.log).run_on(self.backend)
        return ExperimentResult(exp_dir)

    def __repr__(self) -> str:
        return (f"Testbed({self.name!r}, topology={self.topology!r}, {len(self.hosts)} hosts, "
                f"{len(self.links)} links, {'owned' if self.owned else 'attached'})")
