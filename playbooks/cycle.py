"""The multi-host cycle: preflight -> provision -> shape -> verify -> run -> collect -> teardown, over SSH.

Each step runs on every machine in parallel, prints one line per machine, and stops the cycle at the first
machine that fails (its name and error); `teardown` then still runs on every machine that answered. Steps are
idempotent: provisioning skips what is present, shaping replaces what this testbed installed, teardown removes
exactly that (the agent's state file on each machine names it). This module keeps the order of the steps; the
steps live in testbed/remote/ (fleet, shapes, verify, workers, readings, summary) and the run's post-processing
is the single machine's own (testbed/run/runner.py: measure, link_timing, compute_slowdown, host_drift,
check_budget, keep_attempt, write_run).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from testbed.check.checks import Check
from testbed.plan.builder import build_plan
from testbed.remote import readings
from testbed.remote.fleet import CycleError, Fleet, HostFacts
from testbed.remote.hostshape import HostShape
from testbed.remote.inventory import Inventory, Machine
from testbed.remote.rdma import check_transport, choose_transport, verify_rdma
from testbed.remote.shapes import attach, shape_machines
from testbed.remote.summary import remote_summary
from testbed.remote.verify import verify_pairs
from testbed.remote.workers import run_schedule
from testbed.run import metrics
from testbed.run.attempts import Attempt, attempt_folder, best_attempt
from testbed.run.compute import run_table
from testbed.run.placement import place_stages
from testbed.run.runner import (
    RunError,
    RunOptions,
    check_budget,
    compute_slowdown,
    host_drift,
    keep_attempt,
    link_timing,
    measure,
    stage_links,
    write_run,
)
from testbed.run.summary import RunSummary, ScheduleSummary, StageLink
from testbed.run.transport import TransportChoice
from testbed.shaping.delayline import STATS_INTERVAL_S
from testbed.topology import TopologyError
from testbed.util.interrupts import cleanup
from workloads.compute import ComputeError, CostTable
from workloads.records import TCP, RankTrace

__all__ = ["Cycle", "CycleError", "HostFacts", "full_cycle", "stage_machines"]

REMOTE_HOLD_FLOOR_S = 0.2e-3
"""A remote delay line's run lateness beyond its baseline (readings.baseline_lateness, measured just before the
run) is judged against max(3 % of the delay, 0.2 ms), not one machine's 0.1 ms: its holds do not absorb the
baseline (the network's own latency is taken off, the daemon's is not), and the SSH lab runs 3 daemons, 3
workers and their sshd on one 2-core box. There a 3-4 ms direction ran +22..+111 us late on average; on a CI
machine twice slower, +223..+482 us before the baseline was taken off."""


@dataclass
class Cycle(Fleet):
    """One inventory's machines under one testbed name, what has been set up on them, and the cycle's steps."""

    results_root: Path = field(default=Path("results"))
    shapes: dict[str, HostShape] = field(default_factory=dict, kw_only=True)
    checks: list[Check] = field(default_factory=list, kw_only=True)
    collect_s: float = field(default=0.0, kw_only=True)
    """Time spent fetching traces and logs during `run` (reported as the collect step)."""
    transport: TransportChoice = field(default_factory=lambda: TransportChoice(TCP.key, "default"), kw_only=True)
    """The run's transport (testbed/remote/rdma.py: the single machine's rule, rxe devices given)."""

    def shape(self) -> None:
        """Measure each pair's unshaped round trip (taken off the holds), then install every machine's shape."""
        self.shapes = shape_machines(self)

    def attach(self) -> None:
        """The shaping an earlier `up` left (for `testbed remote run`)."""
        self.shapes = attach(self)

    def verify(self) -> list[Check]:
        """Per DC pair the round trip, per direction the TCP goodput, between each DC's first machines."""
        start = time.monotonic()
        self.checks = verify_pairs(self, build_plan(self.inventory.topology, self.testbed), self.shapes)
        self.step_s["verify"] = time.monotonic() - start
        self._log_checks(self.checks)
        return self.checks

    def _verify_rdma(self, plan: Any, chosen: list[Machine]) -> None:
        """RDMA round trip and goodput per stage boundary between DCs; a failed check stops the run."""
        start = time.monotonic()
        checks = verify_rdma(self, plan, chosen, self.transport.devices, self.transport.path_rdma_mtu)
        self.step_s["rdma-verify"] = self.step_s.get("rdma-verify", 0.0) + time.monotonic() - start
        self._log_checks(checks)
        self.checks += checks
        if failed := [c for c in checks if not c.ok]:
            raise RunError("RDMA verify failed: " + "; ".join(f"{c.kind} {c.subject}: {c.measured} (expected "
                                                              f"{c.expected})" for c in failed))

    def _log_checks(self, checks: list[Check]) -> None:
        for c in checks:
            self.log(f"  verify    {c.kind:<10} {c.subject}: {c.measured} (expected {c.expected}) "
                     f"{'pass' if c.ok else 'FAIL'}")

    def run(self, options: RunOptions, run_id: str | None = None) -> tuple[Path, RunSummary]:
        """Every schedule of `options` in turn, one worker per machine chosen by the placement, a disturbed run
        measured again as on one machine; results collected into results/<run-id>/ with the single-machine
        contract."""
        chosen = stage_machines(self.inventory, options)
        plan = build_plan(self.inventory.topology, self.testbed)
        links = stage_links(plan, chosen)
        try:
            table = run_table(options.compute, links, plan.topology)
        except (ComputeError, TopologyError) as exc:
            raise RunError(f"--compute {options.compute.text}: {exc}") from None
        run_id = run_id or time.strftime("%Y%m%d-%H%M%S") + "-remote-" + "-".join(options.schedules)
        run_dir = self.results_root / run_id
        run_dir.mkdir(parents=True, exist_ok=True)
        self.transport = choose_transport(self, plan, options.transport, chosen, options.schedules)
        self.log(f"  run       transport {self.transport.name}: {self.transport.reason}")
        self.checks = [c for c in self.checks if not c.kind.startswith("rdma-")]   # this run's transport only
        if self.transport.devices:
            self._verify_rdma(plan, chosen)
        drops_before = readings.counters(self, set(self.shapes))[0]
        baseline = readings.baseline_lateness(self, plan, set(self.shapes))
        summaries, traces = [], {}
        start = time.monotonic()
        for schedule in options.schedules:
            self.log(f"  run       {schedule}: {len(chosen)} stages on {', '.join(m.name for m in chosen)}")
            best, repeats = best_attempt(
                lambda attempt, schedule=schedule: self._measure(schedule, options, chosen, links, plan,
                                                                 attempt_folder(run_dir, attempt), run_id, baseline,
                                                                 table),
                self.log, cpu_matters=not options.compute.timed)
            ranks, measured = best.value
            measured.repeated = repeats
            keep_attempt(run_dir / schedule, best.where / schedule)
            check_budget(schedule, measured)
            traces[schedule] = ranks
            summaries.append(measured)
        self.step_s["run"] = time.monotonic() - start - self.collect_s    # stopping workers included, fetching not
        self.step_s.pop("stop", None)
        metrics.pool_references(summaries)
        drops_after = readings.counters(self, set(self.shapes))[0]
        summary = remote_summary(self, run_id, plan, chosen, links, summaries, options, self.checks, self.shapes,
                                 drops_before, drops_after, self.transport, traces)
        start = time.monotonic()
        write_run(run_dir, summary, traces, plan, self.log)
        (run_dir / "hosts").mkdir(exist_ok=True)
        for name, facts in self.facts.items():
            (run_dir / "hosts" / f"{name}.json").write_text(json.dumps(asdict(facts), indent=1))
        (run_dir / "verify.json").write_text(json.dumps([asdict(c) for c in self.checks], indent=1))
        self.step_s["collect"] = self.collect_s + time.monotonic() - start
        self.write_timings(run_dir)
        return run_dir, summary

    def _measure(self, schedule: str, options: RunOptions, chosen: list[Machine], links: list[StageLink], plan: Any,
                 where: Path, run_id: str, baseline: dict[str, float], table: CostTable | None = None
                 ) -> Attempt[tuple[list[RankTrace], ScheduleSummary]]:
        """One schedule run once on the machines, with its host load and its link timing beyond `baseline`."""
        tokens = options.microbatches * options.microbatch_size * options.model.block_size
        shaped = set(self.shapes)
        before, holds_before, began = readings.loads(self, chosen), readings.counters(self, shaped)[1], time.monotonic()
        ranks, fetch_s = run_schedule(self, schedule, options, chosen, links, where / schedule, run_id, self.transport,
                                      table)
        self.collect_s += fetch_s
        time.sleep(STATS_INTERVAL_S)           # the daemons' statistics cover the run's last packets
        measured = measure(schedule, ranks, tokens, links, self.transport.kind.receiver_driven)
        measured.link_timing = link_timing(plan, readings.holds_by_label(plan, holds_before),
                                           readings.holds_by_label(plan, readings.counters(self, shaped)[1]),
                                           baseline, floor_s=REMOTE_HOLD_FLOOR_S)
        if measured.breakdown is not None:      # its CPU ledger adds every rank's threads to rank 0's machine:
            measured.breakdown.cpu = []         # right on one box, wrong across several
        measured.host_load = readings.host_load(self, chosen, before, time.monotonic() - began)
        measured.host_load.compute_slowdown = compute_slowdown([measured])
        measured.host_load.judge_drift(host_drift(ranks))
        return Attempt((ranks, measured), measured.host_load, measured.link_timing, where, measured.late_spans())

    def write_timings(self, run_dir: Path) -> None:
        """cycle.json: seconds per step so far and the tree that ran (written again after teardown)."""
        (run_dir / "cycle.json").write_text(json.dumps({"step_s": self.step_s, "tree": self.tree_id}, indent=1))


def stage_machines(inventory: Inventory, options: RunOptions) -> list[Machine]:
    """The machines that run stage 0, 1, ... (testbed.run.placement), the model checked against them: before
    anything is set up on any machine."""
    machines = list(inventory.machines)
    chosen = [machines[i] for i in place_stages([(m.name, m.dc) for m in machines], options.stages, options.placement)]
    options.check_stages(len(chosen))
    return chosen


def full_cycle(inventory: Inventory, options: RunOptions, *, testbed: str, results_root: Path,
               log: Callable[[str], None] = print, verify_required: bool = True) -> tuple[Path, RunSummary, Cycle]:
    """preflight -> provision -> shape -> verify -> run -> collect, then teardown whatever happened."""
    stage_machines(inventory, options)
    cycle = Cycle(inventory, testbed, results_root, log=log)
    try:
        cycle.preflight()
        cycle.provision()
        # RDMA asked where a machine cannot: fail before anything is shaped
        check_transport(cycle, options.transport, stage_machines(inventory, options), options.schedules)
        cycle.shape()
        checks = cycle.verify()
        failed = [c for c in checks if not c.ok]
        if failed and verify_required:
            raise CycleError("verify failed: " + "; ".join(f"{c.kind} {c.subject}: {c.measured}" for c in failed))
        run_dir, summary = cycle.run(options)
    finally:
        start = time.monotonic()
        with cleanup():
            try:
                failures = cycle.teardown()
            finally:
                cycle.step_s["teardown"] = time.monotonic() - start
                cycle.close()
        if failures:
            log("teardown failed on " + ", ".join(f.machine for f in failures) + ": clean them with "
                f"'testbed remote down {inventory.source}'")
    cycle.write_timings(run_dir)
    return run_dir, summary, cycle
