"""`testbed experiment` / `make demo`: the GeoPipe experiment end to end.

Bring the default topology up and verify it; sweep the cross-DC distance (the link's one-way delay at
5 us/km, both directions) running each schedule; repeat the focus distance for the spread; sweep the
memory budget at the focus distance (the HBM trade-off); optionally the link rate and the micro-batch
count; tear down; write results/<id>/ with summary.json, CSV, topology, plan, environment, per-run traces,
plots and a report, each figure next to the analytical model's prediction.
"""

from __future__ import annotations

import contextlib
import csv
import json
import os
import platform
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

from testbed.backends.base import Backend, BackendError
from testbed.check.verify import verify_testbed
from testbed.deploy import lifecycle
from testbed.deploy.linkset import set_link
from testbed.experiment import plots, report
from testbed.experiment.model import StageTimes, fit_message_overhead, predict, stage_times
from testbed.experiment.records import ExperimentRecord, ExperimentSpec, ModelPrediction, Point
from testbed.plan.model import LinkDirection
from testbed.probe.latency import round_trip
from testbed.run.runner import RunOptions, pipeline_hosts, run_schedules, stage_links
from testbed.topology.model import FIBRE_DELAY_S_PER_KM
from testbed.util.paths import resolve_topology
from workloads.records import RankTrace


class Experiment:
    """The whole sweep on one testbed it brings up and tears down; `run()` returns the results folder."""

    def __init__(self, spec: ExperimentSpec, log: Callable[[str], None] = print,
                 advance: Callable[[], None] = lambda: None) -> None:
        self.spec, self.log, self.advance = spec, log, advance
        self.id = time.strftime("%Y%m%d-%H%M%S") + "-experiment"
        self.dir = Path(spec.results) / self.id
        self.points: list[Point] = []
        self.times: StageTimes | None = None
        self.overhead_s = 0.0
        self.started = time.monotonic()

    def total_runs(self) -> int:
        s = self.spec
        n = len(s.distances_km) * len(s.schedules) + (s.repetitions - 1) * 2 + len(s.budgets_stash)
        return n + len(s.rates_mbit) * 2 + len(s.microbatch_counts) * 2

    def run(self) -> Path:
        s = self.spec
        self.dir.mkdir(parents=True, exist_ok=True)
        topo_path = resolve_topology(s.topology)
        shutil.copy(topo_path, self.dir / "topology.yaml")
        name = f"exp{int(time.time()) % 100000}"
        self.log(f"bringing up {topo_path.name} as {name} ...")
        with lifecycle.testbed_for(str(topo_path), name=name, backend=s.backend, switch=s.switch,
                                   log=lambda _m: None) as backend:
            self._verify(backend)
            (self.dir / "plan.json").write_text(json.dumps(backend.state.plan.to_json(), indent=1))
            self._sweeps(backend)
        self.log(f"testbed {name} removed")
        self._write(backend)
        return self.dir

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
        s = self.spec
        swept = self._swept(backend)
        a, b, base_rate = swept.src_dc, swept.dst_dc, swept.rate_bps
        for km in sorted(s.distances_km, key=lambda d: (d != 0, d)):      # 0 km first: the model's inputs
            self._set(backend, a, b, km, base_rate)
            rtt = self._rtt(backend)
            for schedule in s.schedules:
                self._point(backend, "distance", km, base_rate, s.microbatches, schedule, 0, s.memory_budget, rtt)
        self._set(backend, a, b, s.focus_km, base_rate)
        rtt = self._rtt(backend)
        for rep in range(1, s.repetitions):
            for schedule in ("1f1b", "geopipe"):
                self._point(backend, "repeat", s.focus_km, base_rate, s.microbatches, schedule, rep, s.memory_budget,
                            rtt)
        stash = max(self.times.stash_bytes) if self.times else 0
        for k in s.budgets_stash:
            self._point(backend, "budget", s.focus_km, base_rate, s.microbatches, "geopipe", 0, k * stash, rtt)
        for rate in s.rates_mbit:
            self._set(backend, a, b, s.focus_km, rate * 1e6)
            rtt = self._rtt(backend)
            for schedule in ("1f1b", "geopipe"):
                self._point(backend, "rate", s.focus_km, rate * 1e6, s.microbatches, schedule, 0, s.memory_budget, rtt)
        if s.microbatch_counts:
            self._set(backend, a, b, s.focus_km, base_rate)
            for m in s.microbatch_counts:
                for schedule in ("1f1b", "geopipe"):
                    self._point(backend, "microbatches", s.focus_km, base_rate, m, schedule, 0, s.memory_budget, rtt)

    def _set(self, backend: Backend, a: str, b: str, km: float, rate_bps: float) -> None:
        set_link(backend, a, b, delay_s=km * FIBRE_DELAY_S_PER_KM, rate_bps=rate_bps)

    def _rtt(self, backend: Backend) -> float:
        swept = self._swept(backend)
        sample = round_trip(backend.netns_path(swept.src_node), backend.state.plan.receiver_address(swept), count=10)
        return sample.median_s

    def _point(self, backend: Backend, sweep: str, km: float, rate_bps: float, microbatches: int, schedule: str,
               rep: int, budget: int | None, rtt: float) -> None:
        s = self.spec
        label = f"{sweep}-{km:g}km-{rate_bps / 1e6:g}mbit-m{microbatches}-{schedule}-r{rep}" + (
            f"-b{budget}" if budget else "")
        options = RunOptions(schedules=[schedule], microbatches=microbatches, iterations=s.iterations,
                             model=s.model, memory_budget=budget)
        elapsed = time.monotonic() - self.started
        self.log(f"[{elapsed:5.0f} s] {sweep}: {km:g} km, {rate_bps / 1e6:g} Mbit/s, m={microbatches}, {schedule}"
                 + (f", budget {budget / 2**20:.1f} MiB" if budget else "") + (f", repetition {rep + 1}" if rep else ""))
        run_dir, summary = run_schedules(backend, options, self.dir / "runs", run_id=label, log=lambda _m: None)
        measured = summary.schedules[0]
        if self.times is None and schedule == "1f1b" and km == 0:
            self._fit_model(backend, run_dir, measured.step_time_s, microbatches)
        point = Point(sweep=sweep, distance_km=km, delay_s=km * FIBRE_DELAY_S_PER_KM, rate_bps=rate_bps,
                      microbatches=microbatches, schedule=schedule, repetition=rep, memory_budget=budget, rtt_s=rtt,
                      measured=measured, predicted_bubble=None, predicted_step_s=None, run_dir=str(run_dir))
        self._predict(backend, point)
        self.points.append(point)
        self.log(f"        bubble {point.bubble:.3f}"
                 + (f" (model {point.predicted_bubble:.3f})" if point.predicted_bubble is not None else "")
                 + f", step {measured.step_time_s:.3f} s, loss {measured.loss_last:.3f}")
        self.advance()

    def _fit_model(self, backend: Backend, run_dir: Path, step_s: float, microbatches: int) -> None:
        """Model inputs from the 0 km 1f1b run: per-micro-batch compute and stash per stage, and the one
        fitted parameter (per-message overhead) that makes the model reproduce that run's step time."""
        ranks = [RankTrace.from_json(json.loads(p.read_text())) for p in sorted((run_dir / "1f1b").glob("rank-*.json"))]
        self.times = stage_times(ranks)
        links = stage_links(backend.state.plan, pipeline_hosts(backend.state.plan))   # the link is at 0 km now
        self.overhead_s = fit_message_overhead("1f1b", self.times, microbatches, [0.0] * len(links),
                                               [lk.rate_bps for lk in links], step_s)
        (self.dir / "model_inputs.json").write_text(json.dumps(
            {**asdict(self.times), "message_overhead_s": self.overhead_s}, indent=1))
        self.log(f"        model fitted at 0 km: per-message overhead {self.overhead_s * 1e3:.2f} ms")
        for p in self.points:
            self._predict(backend, p)

    def _predict(self, backend: Backend, point: Point) -> None:
        """The model at this point's setting: the swept link's delay and rate on the stage links that cross
        DCs, the fabric (no delay) on the others."""
        if self.times is None:
            return
        plan = backend.state.plan
        hosts = pipeline_hosts(plan)
        crossing = [a.dc != b.dc for a, b in zip(hosts, hosts[1:], strict=False)]
        fabric = [lk.rate_bps for lk in stage_links(plan, hosts)]
        delays = [point.delay_s if c else 0.0 for c in crossing]
        rates = [point.rate_bps if c else f for c, f in zip(crossing, fabric, strict=True)]
        pred, _ = predict(point.schedule, self.times, point.microbatches, delays, rates, point.memory_budget,
                          self.overhead_s)
        point.predicted_bubble, point.predicted_step_s = pred.mean_bubble_ratio, pred.iteration_s

    def _write(self, backend: Backend) -> None:
        state = backend.state
        env = {"kernel": platform.release(), "python": platform.python_version(), "machine": platform.machine(),
               "backend": backend.name, "mininet": state.mininet.to_json() if state.mininet else None,
               "shaper": state.shaper_name, "shaper_calibration_s": state.shaper.calibration_s if state.shaper else None,
               "transport": "gloo-tcp", "versions": _versions(), "cpus": os.cpu_count(),
               "seconds": time.monotonic() - self.started}
        (self.dir / "environment.json").write_text(json.dumps(env, indent=1))
        predictions = []
        if self.times is not None:
            rate = self._swept(backend).rate_bps
            for km in self.spec.predict_km:
                for schedule in self.spec.schedules:
                    pred, _ = predict(schedule, self.times, self.spec.microbatches, [km * FIBRE_DELAY_S_PER_KM],
                                      [rate], self.spec.memory_budget, self.overhead_s)
                    predictions.append(ModelPrediction(km, schedule, pred.mean_bubble_ratio, pred.iteration_s))
        record = ExperimentRecord(id=self.id, spec=self.spec, environment=env, points=self.points,
                                  model_only=predictions, model_inputs=self.times)
        record.save(self.dir)
        with open(self.dir / "points.csv", "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["sweep", "distance_km", "delay_ms", "rate_mbit", "microbatches", "schedule", "repetition",
                             "memory_budget_bytes", "rtt_ms", "bubble_ratio", "bubble_model", "step_s", "step_model_s",
                             "tokens_per_s", "exposed_comm_s", "peak_inflight_bytes", "loss_last"])
            for p in self.points:
                m = p.measured
                writer.writerow([p.sweep, p.distance_km, p.delay_s * 1e3, p.rate_bps / 1e6, p.microbatches, p.schedule,
                                 p.repetition, p.memory_budget or "", _r(p.rtt_s, 1e3), _r(p.bubble),
                                 _r(p.predicted_bubble), _r(m.step_time_s), _r(p.predicted_step_s),
                                 _r(m.tokens_per_s), _r(m.exposed_comm_s), m.peak_inflight_activation_bytes,
                                 _r(m.loss_last)])
        plots.render_all(self.dir)
        report.write_report(self.dir)


def _r(value: float | None, scale: float = 1.0) -> str:
    return "" if value is None else f"{value * scale:.6g}"


def _versions() -> dict[str, str]:
    import importlib.metadata as md

    out = {}
    for pkg in ("torch", "pyroute2", "numpy", "matplotlib", "geo-testbed"):
        with contextlib.suppress(md.PackageNotFoundError):
            out[pkg] = md.version(pkg)
    return out
