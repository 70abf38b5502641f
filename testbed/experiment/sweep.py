"""`testbed experiment` / `make demo-real`: the GeoPipe experiment end to end, real arithmetic by default.

Bring the default topology up and verify it; sweep the cross-DC distance (the link's one-way delay at
5 us/km, both directions) running each schedule under the headline memory budget; repeat the focus distance
with every schedule in turn, PyTorch's strongest included, for the spread; sweep the memory budget at the
focus distance (the HBM trade-off); a bandwidth-bound link rate; optionally the micro-batch count; tear
down; write results/<id>/ with summary.json, CSV, topology, plan, environment, per-run traces, plots and a
report, each figure next to the analytical model's prediction.
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import hashlib
import json
import os
import platform
import shutil
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from testbed.backends.base import Backend, BackendError
from testbed.check.links import ONE_WAY_FLOOR_S, delay_tolerance
from testbed.check.verify import verify_testbed
from testbed.deploy import lifecycle
from testbed.deploy.linkset import set_link
from testbed.experiment import plots, report
from testbed.experiment.model import (
    MODELLED,
    StageTimes,
    bubble_vs_reference,
    predict,
    stage_times,
)
from testbed.experiment.records import POINT_COLUMNS, ExperimentRecord, ExperimentSpec, ModelPrediction, Point
from testbed.plan.model import LinkDirection
from testbed.probe.latency import round_trip
from testbed.rdma.support import rxe_in_namespaces
from testbed.run.dilation import plan_dilation
from testbed.run.runner import LinkSweep, RunOptions, SweepPoint, restored_link, run_schedules, stage_links
from testbed.topology import load_topology
from testbed.topology.model import FIBRE_DELAY_S_PER_KM
from testbed.util.interrupts import cleanup, raise_if_pending
from testbed.util.paths import REPO_ROOT, resolve_topology
from workloads.layouts import TORCH_SCHEDULES
from workloads.records import RDMA, TCP, TRANSPORTS, RankTrace

BUDGETED = ("1f1b", "1f1b-prefetch", "geopipe")
"""Schedules that run under the experiment's memory budget (gpipe cannot fit a 1F1B-relative one; PyTorch's
schedules are not instrumented for memory): the others run without one, and the report says so."""


def applied_budget(schedule: str, budget: str | None) -> str | None:
    return budget if schedule in BUDGETED else None


@dataclass(frozen=True, slots=True)
class Setting:
    """One planned run: which sweep, the link, the micro-batches, the schedule, the repetition, the budget."""

    sweep: str
    km: float
    rate_bps: float
    microbatches: int
    schedule: str
    repetition: int = 0
    budget: str | None = None
    """In-flight budget (bytes or 1f1b+N) for the schedules in BUDGETED."""
    transport: str = "tcp"

    @property
    def applied_budget(self) -> str | None:
        return applied_budget(self.schedule, self.budget)

    @property
    def label(self) -> str:
        budget = f"-b{self.applied_budget}" if self.applied_budget else ""
        over = "" if self.transport == TCP.key else f"-{self.transport}"
        return (f"{self.sweep}-{self.km:g}km-{self.rate_bps / 1e6:g}mbit-m{self.microbatches}-{self.schedule}"
                f"-r{self.repetition}{budget}{over}")

    @property
    def group(self) -> tuple[str, float, float, int, int, str, str | None]:
        """Settings that differ only in their schedule run together, interleaved in one launch; the distance
        sweep's distances too (the link is set to each between iterations)."""
        km = -1.0 if self.sweep == "distance" else self.km
        return (self.sweep, km, self.rate_bps, self.microbatches, self.repetition, self.transport, self.budget)

    @property
    def group_label(self) -> str:
        budget = f"-b{self.budget}" if self.budget else ""
        over = "" if self.transport == TCP.key else f"-{self.transport}"
        where = "" if self.sweep == "distance" else f"-{self.km:g}km"
        return (f"{self.sweep}{where}-{self.rate_bps / 1e6:g}mbit-m{self.microbatches}-r{self.repetition}"
                f"{budget}{over}")


class Experiment:
    """The whole sweep on one testbed it brings up and tears down; `run()` returns the results folder.

    Stopped early (a failure, Ctrl-C, SIGTERM, SIGHUP), it still writes its summary, points and report for
    what it measured, marked partial with what is missing; `Experiment.resume(folder)` runs only that."""

    def __init__(self, spec: ExperimentSpec, log: Callable[[str], None] = print,
                 advance: Callable[[], None] = lambda: None) -> None:
        self.spec, self.log, self.advance = spec, log, advance
        self.id = time.strftime("%Y%m%d-%H%M%S") + "-experiment"
        self.dir = Path(spec.results) / self.id
        self.points: list[Point] = []
        self.times: StageTimes | None = None
        self._calibration_launch: Path | None = None
        """The launch the model's host costs come from (the 0 km 1f1b's); its probes judge its links' error."""
        self.overhead_s = 0.0
        self.resumed = 0
        self.seconds_before = 0.0
        self.started = time.monotonic()
        self._layout: list[tuple[bool, float]] | None = None
        first = load_topology(resolve_topology(spec.topology)).links[0]
        self.base_rate_bps = first.a_to_b.rate_bps
        """The swept link's own rate (the topology's first OTN link, a -> b): plan.directions[0]."""

    @classmethod
    def resume(cls, exp_dir: Path, log: Callable[[str], None] = print,
               advance: Callable[[], None] = lambda: None) -> Experiment:
        """The experiment recorded in `exp_dir`, to run its missing points with the same configuration.
        Refuses (naming the difference) when the topology file, the code or the machine changed."""
        record = ExperimentRecord.load(exp_dir)
        differences = environment_differences(record, exp_dir)
        if differences:
            raise BackendError(f"cannot resume {exp_dir}: " + "; ".join(differences)
                               + " (start a new experiment instead)")
        exp = cls(record.spec, log, advance)
        exp.id, exp.dir, exp.points = record.id, exp_dir, list(record.points)
        exp.times, exp.overhead_s = record.model_inputs, record.message_overhead_s
        exp.resumed = record.resumed + 1
        exp.seconds_before = float(record.environment.get("seconds", 0.0))
        return exp

    def planned(self) -> list[Setting]:
        """Every run of the experiment, in the order it runs them (0 km first: the model's inputs). At the
        focus distance every repetition runs every schedule in turn (interleaved), so a slow stretch of the
        host lands on all of them rather than on one."""
        s = self.spec
        rate, budget = self.base_rate_bps, s.memory_budget
        every = [x for x in s.headline_schedules if not (s.timed and x in TORCH_SCHEDULES)]
        out = [Setting("distance", km, rate, s.microbatches, schedule, budget=budget)
               for km in sorted(s.distances_km, key=lambda d: (d != 0, d))
               for schedule in (every if km == s.focus_km else s.schedules)]
        out += [Setting("repeat", s.focus_km, rate, s.microbatches, schedule, rep, budget=budget)
                for rep in range(1, s.repetitions) for schedule in every]
        out += [Setting("budget", s.focus_km, rate, s.microbatches, "geopipe", budget=b) for b in s.budgets
                if b != budget]                  # the headline budget is measured at the focus already
        out += [Setting("rate", s.focus_km, r * 1e6, s.microbatches, schedule, budget=budget)
                for r in s.rates_mbit for schedule in ("1f1b-prefetch", "geopipe")]
        out += [Setting("microbatches", s.focus_km, rate, m, schedule, budget=budget)
                for m in s.microbatch_counts for schedule in ("1f1b-prefetch", "geopipe")]
        if s.transports != ["tcp"]:
            out += [Setting("transport", s.focus_km, rate, s.microbatches, schedule, budget=budget, transport=t)
                    for schedule in s.schedules for t in s.transports]
        return out

    def missing(self) -> list[Setting]:
        done = {p.label for p in self.points}
        return [st for st in self.planned() if st.label not in done]

    def total_runs(self) -> int:
        return len(self.missing())

    def run(self) -> Path:
        """Bring the topology up as a testbed of the experiment's own, measure on it (`measure`), take it down."""
        s = self.spec
        self.dir.mkdir(parents=True, exist_ok=True)
        topo_path = resolve_topology(s.topology)
        if not self.resumed:
            shutil.copy(topo_path, self.dir / "topology.yaml")
        name = f"exp{int(time.time()) % 100000}"
        self.log(f"bringing up {topo_path.name} as {name} ..."
                 + (f" (resuming: {len(self.points)} points measured, {len(self.missing())} to go)" if self.resumed else ""))
        backend: Backend | None = None
        try:
            rdma = "softroce" if "rdma" in s.transports else None
            if rdma:
                rxe_in_namespaces().require()
            with lifecycle.testbed_for(str(self.dir / "topology.yaml"), name=name, backend=s.backend, switch=s.switch,
                                       rdma=rdma, log=lambda _m: None) as backend:
                self.measure(backend)
            self.log(f"testbed {name} removed")
        except BaseException as exc:
            if backend is None:                 # stopped before the testbed was up: the record says so too
                with cleanup():
                    self._write(None, stopped=str(exc) or type(exc).__name__)
            self.log(f"stopped ({exc or type(exc).__name__}); testbed {name} removed; {len(self.points)} points kept "
                     f"in {self.dir}: resume with 'testbed experiment --resume {self.dir}'")
            raise
        return self.dir

    def run_on(self, backend: Backend) -> Path:
        """The experiment on a testbed that is already up (the API's `Testbed.experiment`): the swept link is put
        back as it was afterwards, whatever stopped the sweeps; the testbed stays up."""
        self.dir.mkdir(parents=True, exist_ok=True)
        if not self.resumed:
            shutil.copy(resolve_topology(self.spec.topology), self.dir / "topology.yaml")
        swept = self._swept(backend)
        with restored_link(backend, swept.src_dc, swept.dst_dc):
            self.measure(backend)
        return self.dir

    def measure(self, backend: Backend) -> None:
        """Verify, the plan, every missing point's run and the model, then summary, report and plots; a stop
        writes what was measured (partial, resumable) before it propagates."""
        try:
            self._verify(backend)
            (self.dir / "plan.json").write_text(json.dumps(backend.state.plan.to_json(), indent=1))
            self._sweeps(backend)
        except BaseException as exc:
            with cleanup():
                self._write(backend, stopped=str(exc) or type(exc).__name__)
            raise
        self._write(backend)

    def _verify(self, backend: Backend) -> None:
        report = verify_testbed(backend, level="quick")
        bad = report.failures()
        self.log(f"verify: {len(report.checks) - len(bad)}/{len(report.checks)} checks passed")
        if bad:
            raise BackendError("the topology does not verify: " + "; ".join(f"{c.subject}: {c.measured}" for c in bad))

    @staticmethod
    def _swept(backend: Backend) -> LinkDirection:
        """The direction whose link the sweeps change (the topology's first OTN link)."""
        return backend.state.plan.directions[0]

    def _sweeps(self, backend: Backend) -> None:
        swept = self._swept(backend)
        for group in _grouped(self.missing()):
            rtts = {}
            for km, rate in dict.fromkeys((st.km, st.rate_bps) for st in group):
                set_link(backend, swept.src_dc, swept.dst_dc, delay_s=km * FIBRE_DELAY_S_PER_KM, rate_bps=rate)
                rtts[km] = self._rtt(backend)
            first = group[0]             # a sweep over distances sets each in turn itself; it starts at the first
            set_link(backend, swept.src_dc, swept.dst_dc, delay_s=first.km * FIBRE_DELAY_S_PER_KM, rate_bps=first.rate_bps)
            self._run(backend, group, rtts)

    def _rtt(self, backend: Backend) -> float:
        swept = self._swept(backend)
        sample = round_trip(backend.netns_path(swept.src_node), backend.state.plan.receiver_address(swept), count=10)
        return sample.median_s

    def _run(self, backend: Backend, group: list[Setting], rtts: dict[float, float]) -> None:
        """One launch of the workers running the group's schedules interleaved (and, for the distance sweep, its
        distances too: the link is set to each between iterations); one point per setting."""
        raise_if_pending()
        s, first = self.spec, group[0]
        kms = list(dict.fromkeys(st.km for st in group))
        schedules = list(dict.fromkeys(st.schedule for st in group))
        sweep = None
        if len(kms) > 1:
            swept = self._swept(backend)
            sweep = LinkSweep(swept.src_dc, swept.dst_dc, [
                SweepPoint(_km_label(km), km * FIBRE_DELAY_S_PER_KM, first.rate_bps,
                           [st.schedule for st in group if st.km == km]) for km in kms])
        options = RunOptions(schedules=schedules, microbatches=first.microbatches, iterations=s.iterations,
                             model=s.model, memory_budget=first.budget, transport=first.transport,
                             unbudgeted=[st.schedule for st in group if st.applied_budget is None],
                             dilation=s.dilation, sweep=sweep, compute=s.compute, stages=s.stages,
                             shape=None if s.shape is None else (s.shape[0], s.shape[1]))
        elapsed = time.monotonic() - self.started + self.seconds_before
        self.log(f"[{elapsed:5.0f} s] {first.sweep}: {', '.join(f'{km:g}' for km in kms)} km, "
                 f"{first.rate_bps / 1e6:g} Mbit/s, m={first.microbatches}, {', '.join(schedules)}"
                 + (f", budget {first.budget}" if first.budget else "")
                 + (f", repetition {first.repetition + 1}" if first.repetition else "")
                 + (f", over {first.transport}" if first.sweep == "transport" else "")
                 + (" (interleaved in one launch)" if len(group) > 1 else ""))
        run_dir, summary = run_schedules(backend, options, self.dir / "runs", run_id=first.group_label,
                                         log=lambda _m: None)
        by_entry = {(m.link_setting, m.schedule): m for m in summary.schedules}
        for setting in group:
            label = _km_label(setting.km) if sweep else None
            measured = by_entry[(label, setting.schedule)]
            where = run_dir / label if label else run_dir
            if self.times is None and setting.schedule == "1f1b" and setting.km == 0:
                self._calibration_launch = run_dir
                self._fit_model(backend, where, measured.step_time_s, setting.microbatches)
            point = Point(sweep=setting.sweep, distance_km=setting.km, delay_s=setting.km * FIBRE_DELAY_S_PER_KM,
                          rate_bps=setting.rate_bps, microbatches=setting.microbatches, schedule=setting.schedule,
                          repetition=setting.repetition, memory_budget=setting.applied_budget,
                          rtt_s=rtts.get(setting.km), measured=measured, predicted_bubble=None, predicted_step_s=None,
                          run_dir=str(where), label=setting.label, lossless_ok=summary.lossless_ok,
                          daemon_restarts=summary.daemon_restarts,
                          lost_packets=sum(lk.drops_during_run or 0 for lk in summary.links if lk.lossless),
                          transport=setting.transport,
                          links_on_plan=all(lk.delay_ok is not False for lk in summary.links))
            self._predict(backend, point)
            self.points.append(point)
            self.log(f"        {setting.schedule}" + (f" at {setting.km:g} km" if sweep else "")
                     + f": bubble {point.bubble:.3f}, step {measured.step_time_s:.3f} s"
                     + (f" (model {point.predicted_step_s:.3f} s)" if point.predicted_step_s is not None else "")
                     + (f", loss {measured.loss_last:.3f}" if measured.loss_last is not None else "")
                     + (f", repeated {measured.repeated}x (host disturbed)" if measured.repeated else ""))
            self.advance()

    def _fit_model(self, backend: Backend, run_dir: Path, step_s: float, microbatches: int) -> None:
        """Model inputs from the 0 km 1f1b run: per-stage compute as measured (every span), the executor's time
        between spans, the stash, and the transport's per-message cost from the workers' probe. Nothing is
        fitted to a step time: the 0 km step is a prediction like every other."""
        ranks = [RankTrace.from_json(json.loads(p.read_text())) for p in _rank_files(run_dir / "1f1b")]
        self.times = stage_times(ranks)
        self.overhead_s = self.times.message_cost_s
        (self.dir / "model_inputs.json").write_text(json.dumps(
            {**self.times.to_json(), "message_overhead_s": self.overhead_s}, indent=1))
        self.log(f"        model inputs from the 0 km 1f1b run: per-message cost {self.overhead_s * 1e3:.2f} ms (probed), "
                 f"{sum(len(f) for f in self.times.samples.forward_s) if self.times.samples else 0} spans")
        for p in self.points:
            self._predict(backend, p)

    def _predict(self, backend: Backend, point: Point) -> None:
        """The models at this point's setting (the swept link's delay and rate on the stage links that cross DCs,
        the fabric on the others): fed by the 0 km launch's host costs alone (independent of this point's links),
        the same blind to the network (every delay 0), and, named as such, fed by this launch's own lags and
        probe; beside them the link's own error (`link_excess`)."""
        if point.schedule not in MODELLED:
            return
        delays, rates = self._stage_links(backend, point.delay_s, point.rate_bps)
        own = self._launch_times(Path(point.run_dir))
        if own is not None:
            pred, _ = predict(point.schedule, own, point.microbatches, delays, rates, point.memory_budget,
                              transport=point.transport)
            point.predicted_bubble, point.predicted_step_s = bubble_vs_reference(pred, own), pred.iteration_s
        if self.times is not None:
            inputs = self.times if own is None else with_compute_of(self.times, own)
            point.predicted_step_from_0km_s, point.predicted_step_blind_s = (
                predict(point.schedule, inputs, point.microbatches, link_delays, rates, point.memory_budget,
                        self.overhead_s, transport=point.transport, measured_here=False)[0].iteration_s
                for link_delays in (delays, [0.0] * len(delays)))
            if own is not None:
                point.link_excess_s, bound = link_excess(own, self.times, delays)
                run_dir = Path(point.run_dir)
                if self._calibration_launch in (run_dir, run_dir.parent):     # judged within the launch only
                    point.link_excess_bound_s = bound

    def _stage_links(self, backend: Backend | None, delay_s: float, rate_bps: float) -> tuple[list[float], list[float]]:
        """Delay and rate of every stage link with the swept link at (delay_s, rate_bps): it on the links that
        cross DCs, the fabric on the others (the layout is remembered while the testbed is up)."""
        if backend is not None and self._layout is None:
            plan = backend.state.plan
            hosts = RunOptions(schedules=["1f1b"], stages=self.spec.stages).hosts(plan)
            self._layout = [(a.dc != b.dc, lk.rate_bps) for (a, b), lk in
                            zip(zip(hosts, hosts[1:], strict=False), stage_links(plan, hosts), strict=True)]
        layout = self._layout or [(True, rate_bps)]
        return [delay_s if c else 0.0 for c, _ in layout], [rate_bps if c else f for c, f in layout]

    def _launch_times(self, run_dir: Path) -> StageTimes | None:
        """Model inputs from one launch: its 1f1b's traces, else those of the first of our schedules it ran."""
        for schedule in ("1f1b", "1f1b-prefetch", "geopipe", "gpipe"):
            files = _rank_files(run_dir / schedule)
            if files:
                return stage_times([RankTrace.from_json(json.loads(p.read_text())) for p in files])
        return None

    def _dilation(self, state: object) -> str:
        """The dilation every run used, in words (k and why), or the option as given where nothing ran."""
        plan = getattr(state, "plan", None)
        if plan is None:
            return self.spec.dilation
        workers = len(RunOptions(schedules=["1f1b"], stages=self.spec.stages).hosts(plan))
        d = plan_dilation(self.spec.dilation, workers, os.cpu_count() or 1)
        return f"k = {d.factor:.3f} ({d.reason})" if d.on else f"off ({d.reason})"

    def _write(self, backend: Backend | None, stopped: str | None = None) -> None:
        """summary.json, points.csv, environment.json, plots and report of what was measured (all of it, or
        what a stopped run got to, marked partial with what is missing)."""
        state = backend.state if backend else None
        env = {"kernel": platform.release(), "python": platform.python_version(), "machine": platform.machine(),
               "hostname": platform.node(), "code": code_version(), "backend": self.spec.backend,
               "mininet": state.mininet.to_json() if state and state.mininet else None,
               "shaper": state.shaper_name if state else "none",
               "shaper_calibration_s": state.shaper.calibration_s if state and state.shaper else None,
               "transport": " + ".join(TRANSPORTS[t].label + (" (SoftRoCE)" if t == RDMA.key else "")
                                        for t in self.spec.transports), "versions": _versions(), "cpus": os.cpu_count(),
               "seconds": time.monotonic() - self.started + self.seconds_before,
               "dilation": self._dilation(state), "compute": self.spec.compute,
               "fb_per_microbatch_s": statistics.median(f + b for f, b in zip(self.times.forward_s, self.times.backward_s,
                                                                              strict=True)) if self.times else None}
        (self.dir / "environment.json").write_text(json.dumps(env, indent=1))
        predictions = []
        if self.times is not None:
            for km in self.spec.predict_km:
                for schedule in (s for s in self.spec.schedules if s in MODELLED):
                    delays, rates = self._stage_links(backend, km * FIBRE_DELAY_S_PER_KM, self.base_rate_bps)
                    pred, _ = predict(schedule, self.times, self.spec.microbatches, delays, rates,
                                      applied_budget(schedule, self.spec.memory_budget), self.overhead_s,
                                      measured_here=False)
                    predictions.append(ModelPrediction(km, schedule, bubble_vs_reference(pred, self.times),
                                                       pred.iteration_s))
        missing = [st.label for st in self.missing()]
        record = ExperimentRecord(id=self.id, spec=self.spec, environment=env, points=self.points,
                                  model_only=predictions, model_inputs=self.times, message_overhead_s=self.overhead_s,
                                  partial=bool(missing), missing=missing, stopped=stopped, resumed=self.resumed)
        record.pool_references()
        record.save(self.dir)
        with open(self.dir / "points.csv", "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(POINT_COLUMNS)
            for p in self.points:
                m = p.measured
                load = m.host_load
                writer.writerow([p.sweep, p.distance_km, p.delay_s * 1e3, p.rate_bps / 1e6, p.microbatches, p.schedule,
                                 p.repetition, p.memory_budget or "", _r(p.rtt_s, 1e3), _r(p.bubble),
                                 _r(p.bubble_own), _r(p.predicted_bubble), _r(m.step_time_s), _r(p.predicted_step_s),
                                 _r(m.tokens_per_s), _r(m.exposed_comm_s), m.peak_inflight_activation_bytes,
                                 _r(max(m.span_stretch_per_stage) if m.span_stretch_per_stage else None),
                                 _r(load.steal_fraction if load else None), m.repeated, _r(m.loss_last),
                                 _r(p.predicted_step_from_0km_s), _r(p.predicted_step_blind_s),
                                 _r(max(p.link_excess_s, key=abs) if p.link_excess_s else None, 1e3)])
        plots.render_all(self.dir)
        report.write_report(self.dir)


def with_compute_of(host: StageTimes, launch: StageTimes) -> StageTimes:
    """The model's independent inputs for one launch: the host's costs (lags, per-message cost, dispatch) from
    the calibration launch, the compute from `launch` (with compute as time its spans are its cost table,
    re-profiled per launch by plain `replay`; in real mode the spans it measured). Neither carries a link's
    delay: the link comes from the plan."""
    return dataclasses.replace(host, forward_s=launch.forward_s, backward_s=launch.backward_s,
                               samples=launch.samples, reference_s=launch.reference_s)


def link_excess(launch: StageTimes, at_0km: StageTimes, delays_s: list[float]) -> tuple[list[float] | None,
                                                                                      list[float] | None]:
    """Per stage link: what `launch`'s message-cost probe read beyond the 0 km launch's (the link's own error
    against the plan: the probe subtracts the planned delay and transfer, so a delay 10 % long in both directions
    reads +10 % of it) and the bound it is judged against: verify's one-way tolerance at that link's delay, or
    what the probe cannot resolve on this host, whichever is larger: the largest excess on a link with no delay
    (a fabric link the sweep does not touch, so its excess is the probe's own noise: 8 workers probing on 2
    cores read up to ~0.4 ms there). (None, None) where either launch has no probe."""
    mine, base = launch.probed_cost_per_link_s, at_0km.probed_cost_per_link_s
    if not mine or not base or len(mine) != len(base):
        return None, None
    excess = [m - b for m, b in zip(mine, base, strict=True)]
    noise = max((abs(e) for e, d in zip(excess, delays_s, strict=True) if d == 0), default=0.0)
    return excess, [max(delay_tolerance(d, ONE_WAY_FLOOR_S), noise) for d in delays_s]


def _km_label(km: float) -> str:
    return f"{km:g}km"


def _rank_files(folder: Path) -> list[Path]:
    """A schedule's rank traces in rank order (undilated; a dilated run's raw traces are left out)."""
    return sorted((p for p in folder.glob("rank-*.json") if not p.name.endswith(".dilated.json")),
                  key=lambda p: int(p.stem.split("-")[1]))


def _grouped(settings: list[Setting]) -> list[list[Setting]]:
    """Consecutive settings that differ only in their schedule, together (the order of `planned` is kept)."""
    groups: list[list[Setting]] = []
    for st in settings:
        if groups and groups[-1][0].group == st.group:
            groups[-1].append(st)
        else:
            groups.append([st])
    return groups


def code_version() -> str:
    """A fingerprint of the code that measures (testbed/ and workloads/ sources): resumes must match it."""
    digest = hashlib.sha1()
    for path in sorted([*(REPO_ROOT / "testbed").rglob("*.py"), *(REPO_ROOT / "workloads").rglob("*.py")]):
        digest.update(path.relative_to(REPO_ROOT).as_posix().encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


def environment_differences(record: ExperimentRecord, exp_dir: Path) -> list[str]:
    """What differs between the recorded experiment and a resume here and now (empty: it may resume)."""
    env = record.environment
    found = []
    current = resolve_topology(record.spec.topology)
    recorded = exp_dir / "topology.yaml"
    if not recorded.exists():
        found.append(f"{recorded} is missing")
    elif current.exists() and current.read_bytes() != recorded.read_bytes():
        found.append(f"the topology file {current} changed since the experiment began")
    if env.get("code") != code_version():
        found.append(f"the code differs (recorded {env.get('code')}, here {code_version()})")
    for key, now in (("hostname", platform.node()), ("kernel", platform.release()), ("machine", platform.machine()),
                     ("cpus", os.cpu_count())):
        if env.get(key) != now:
            found.append(f"the machine differs: {key} {env.get(key)!r} recorded, {now!r} here")
    if not record.partial:
        found.append("it is complete: nothing is missing")
    return found


def _r(value: float | None, scale: float = 1.0) -> str:
    return "" if value is None else f"{value * scale:.6g}"


def _versions() -> dict[str, str]:
    import importlib.metadata as md

    out = {}
    for pkg in ("torch", "pyroute2", "numpy", "matplotlib", "geo-testbed"):
        with contextlib.suppress(md.PackageNotFoundError):
            out[pkg] = md.version(pkg)
    return out
