"""The multi-host cycle: preflight -> provision -> shape -> verify -> run -> collect -> teardown, over SSH.

Each step runs on every machine in parallel, prints one line per machine, and stops the cycle at the first
machine that fails (its name and error); `teardown` then still runs on every machine that answered. Steps are
idempotent: provisioning skips what is present, shaping replaces what this testbed installed, teardown removes
exactly that (the agent's state file on each machine names it).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import statistics
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from testbed.check.checks import Check
from testbed.check.links import delay_tolerance
from testbed.plan.builder import build_plan
from testbed.remote.hostshape import HostShape, path_of, plan_shapes
from testbed.remote.inventory import Inventory, Machine
from testbed.remote.ssh import RemoteError, Session
from testbed.run import metrics
from testbed.run.placement import PlacementError, place_stages
from testbed.run.runner import (
    MAX_REPEATS,
    RunError,
    RunOptions,
    check_budget,
    compute_drift,
    keep_attempt,
    link_timing,
    measure,
    write_run,
)
from testbed.run.summary import LinkRecord, RunSummary, ScheduleSummary, StageLink, StagePlacement
from testbed.shaping.delayline import STATS_INTERVAL_S
from testbed.util import units
from testbed.util.hostload import STEAL_BOUND, HostLoad, steal_fraction
from testbed.util.interrupts import cleanup, raise_if_pending
from testbed.util.paths import REPO_ROOT
from workloads.records import RankTrace, WorkerConfig

T = TypeVar("T")
GOODPUT_FRACTION = 0.90
"""Verify across real machines: a direction carries at least this share of its TCP goodput (the one-box check
asks 0.96; a Python sender on a shared 2-core box and a real network's own losses leave less headroom)."""
GOODPUT_CEILING = 1.02
"""...and at most this share: more than the rate allows means the direction is not shaped (the one-box check's
ceiling too)."""
THROUGHPUT_S = 3.0
THROUGHPUT_RUNS = 5
"""At most this many runs per direction; the first that reaches GOODPUT_FRACTION ends them. On the 3-machine lab
(one 2-core box, three delay daemons) 34 of 36 single 3 s runs reached 93.9-99.9 %, two fell to 59 % and 87 %
(host stalls); a direction shaped too slow fails every run."""
RTT_ROUNDS = 3


class CycleError(RuntimeError):
    """A step failed on one or more machines (each named)."""


@dataclass(slots=True)
class HostFacts:
    """What preflight and provisioning found on one machine (results/<run>/hosts/<name>.json)."""

    name: str
    dc: str
    login: str
    uid: int = -1
    kernel: str = ""
    home: str = ""
    python: str = ""
    torch: str | None = None
    clock_offset_s: float = 0.0
    """Its clock minus the controller's, from one `date` round trip (± clock_uncertainty_s)."""
    clock_uncertainty_s: float = 0.0
    env: dict[str, Any] = field(default_factory=dict)
    """The agent's `env` (shaper the kernel allows, rxe, CPUs, boot id, package path)."""
    project: str = ""
    shaper: str | None = None


@dataclass
class Cycle:
    """One inventory's machines, their SSH sessions and what has been set up on them."""

    inventory: Inventory
    testbed: str
    results_root: Path
    log: Callable[[str], None] = print
    sessions: dict[str, Session] = field(default_factory=dict)
    facts: dict[str, HostFacts] = field(default_factory=dict)
    step_s: dict[str, float] = field(default_factory=dict)
    shapes: dict[str, HostShape] = field(default_factory=dict)
    checks: list[Check] = field(default_factory=list)
    tree_id: str = ""
    collect_s: float = 0.0
    """Time spent fetching traces and logs during `run` (reported as the collect step)."""

    # -- plumbing --------------------------------------------------------------------------------------
    def _each(self, step: str, work: Callable[[Machine], str], machines: Iterable[Machine] | None = None,
              stop: bool = True) -> list[RemoteError]:
        """`work` on every machine in parallel; one line per machine; the failures raised together (or returned)."""
        machines = list(self.inventory.machines if machines is None else machines)
        start = time.monotonic()
        failures: list[RemoteError] = []
        with ThreadPoolExecutor(max_workers=max(1, len(machines))) as pool:
            futures = {m.name: pool.submit(self._guard, work, m) for m in machines}
            for name, future in futures.items():
                error, detail = future.result()
                if error:
                    failures.append(error)
                    self.log(f"  {step:<9} {name}: FAILED {str(error).removeprefix(name + ': ')}")
                else:
                    self.log(f"  {step:<9} {name}: {detail}")
        self.step_s[step] = self.step_s.get(step, 0.0) + time.monotonic() - start
        if failures and stop:
            raise CycleError(f"{step} failed on {', '.join(e.machine for e in failures)}:\n"
                             + "\n".join(f"  {e}" for e in failures))
        return failures

    @staticmethod
    def _guard(work: Callable[[Machine], str], machine: Machine) -> tuple[RemoteError | None, str]:
        try:
            return None, work(machine)
        except RemoteError as exc:
            return exc, ""
        except Exception as exc:  # noqa: BLE001 - any failure is this machine's, named
            return RemoteError(machine.name, f"{type(exc).__name__}: {exc}"), ""

    def _agent(self, m: Machine, *args: str, root: bool = False, timeout_s: float = 120) -> dict[str, Any]:
        facts = self.facts[m.name]
        return self.sessions[m.name].json(["env", f"PYTHONPATH={facts.project}", facts.python, "-m",
                                           "testbed.remote.agent", *args], root=root, timeout_s=timeout_s)

    def _workdir(self, m: Machine) -> str:
        home = self.facts[m.name].home
        return home + m.workdir[1:] if m.workdir.startswith("~") else m.workdir

    def close(self) -> None:
        for session in self.sessions.values():
            session.close()
        self.sessions.clear()

    # -- preflight -------------------------------------------------------------------------------------
    def preflight(self) -> None:
        """SSH (host keys checked), root or sudo, kernel, Python and torch, the clock's offset."""
        self.log(f"preflight: {len(self.inventory.machines)} machines of {self.inventory.topology.name}")

        def check(m: Machine) -> str:
            if m.name not in self.sessions:
                self.sessions[m.name] = Session(m, self.inventory.known_hosts)
            session = self.sessions[m.name]
            facts = self.facts.setdefault(m.name, HostFacts(m.name, m.dc, m.login))
            facts.uid = int(session.run(["id", "-u"]).stdout.strip())
            if facts.uid != 0 and session.run(["sudo", "-n", "true"], check=False).code != 0:
                raise RemoteError(m.name, f"{m.user} is not root and has no passwordless sudo: shaping needs root")
            facts.kernel = session.run(["uname", "-r"]).stdout.strip()
            facts.home = session.run(["printenv", "HOME"]).stdout.strip()
            facts.clock_offset_s, facts.clock_uncertainty_s = _clock_offset(session)
            facts.python = m.python or "python3"
            probe = session.run([facts.python, "-c", "import sys, json\ntry:\n import torch; v = torch.__version__\n"
                                 "except ImportError:\n v = None\nprint(json.dumps([sys.version.split()[0], v]))"],
                                check=False)
            if probe.code != 0:
                raise RemoteError(m.name, f"{facts.python} does not run: {probe.stderr.strip()[-300:]} "
                                  "(inventory key python, or install python3)")
            version, facts.torch = json.loads(probe.stdout.strip().splitlines()[-1])
            return (f"{'root' if facts.uid == 0 else 'sudo'}, kernel {facts.kernel}, python {version}, "
                    f"torch {facts.torch or 'missing (provision installs it)'}, clock "
                    f"{facts.clock_offset_s * 1e3:+.1f} ms ± {facts.clock_uncertainty_s * 1e3:.1f} ms")

        self._each("preflight", check)

    # -- provision -------------------------------------------------------------------------------------
    def _archive(self) -> Path:
        """The project as it is in the working tree (tracked and new files that git does not ignore)."""
        files = subprocess.run(["git", "-C", str(REPO_ROOT), "ls-files", "-z", "--cached", "--others",
                                "--exclude-standard"], capture_output=True, check=True).stdout.split(b"\0")
        commit = subprocess.run(["git", "-C", str(REPO_ROOT), "rev-parse", "--short=12", "HEAD"], capture_output=True,
                                text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(REPO_ROOT), "status", "--porcelain"], capture_output=True,
                               text=True, check=True).stdout.strip()
        digest = hashlib.sha256()
        names = sorted(f.decode() for f in files if f and (REPO_ROOT / f.decode()).is_file())
        for name in names:
            digest.update(name.encode() + b"\0" + (REPO_ROOT / name).read_bytes())
        self.tree_id = commit + (f"-dirty-{digest.hexdigest()[:8]}" if dirty else "")
        archive = Path(tempfile.gettempdir()) / f"geo-testbed-{self.tree_id}.tar"
        if not archive.exists():
            tmp = archive.with_suffix(f".{os.getpid()}.tmp")
            with tarfile.open(tmp, "w") as tar:
                for name in names:
                    tar.add(REPO_ROOT / name, arcname=name, recursive=False)
            os.replace(tmp, archive)
        return archive

    def provision(self) -> None:
        """The project at this working tree's state in <workdir>/<tree id>, a venv where the inventory names no
        python, then the agent's `env` (the doctor: shaper this kernel allows, rxe)."""
        archive = self._archive()

        def install(m: Machine) -> str:
            session, facts = self.sessions[m.name], self.facts[m.name]
            target = f"{self._workdir(m)}/{self.tree_id}"
            present = session.run(["test", "-f", f"{target}/.complete"], check=False).code == 0
            if not present:
                session.run(["mkdir", "-p", target])
                session.put(archive, f"{target}.tar")
                session.run(["tar", "-xf", f"{target}.tar", "-C", target])
                session.run(["rm", "-f", f"{target}.tar"])
                session.run(["touch", f"{target}/.complete"])
            facts.project = target
            if not m.python:
                venv = f"{self._workdir(m)}/venv"
                if session.run(["test", "-x", f"{venv}/bin/python"], check=False).code != 0:
                    session.run(["python3", "-m", "venv", "--system-site-packages", venv], timeout_s=300)
                    session.run([f"{venv}/bin/pip", "install", "-q", f"{target}[train]"], timeout_s=1800)
                facts.python = f"{venv}/bin/python"
            missing = session.run(["env", f"PYTHONPATH={target}", facts.python, "-c",
                                   "import torch, yaml, pyroute2, fabric"], check=False)
            if missing.code != 0:
                raise RemoteError(m.name, f"{facts.python} lacks a dependency: {missing.stderr.strip()[-200:]}; "
                                  "install torch, PyYAML, pyroute2 and fabric there (or drop key python to get a venv)")
            facts.env = self._agent(m, "env", root=True)
            facts.shaper = facts.env["shaper"]
            return (f"{'present' if present else 'copied'} {self.tree_id}, {facts.python}, shaper "
                    f"{facts.shaper}, rxe {'yes' if facts.env['rxe'] else 'no'}, {facts.env['cpus']} CPUs")

        self._each("provision", install)

    # -- shape -----------------------------------------------------------------------------------------
    def shape(self) -> None:
        """Measure each pair's unshaped round trip (taken off the holds), then install every machine's shape."""
        shapes = plan_shapes(self.inventory, self.testbed)
        firsts = self._first_per_dc()

        def unshape(m: Machine) -> str:       # shaped again (`up` twice): measure the network, not the last shape
            removed = self._agent(m, "unshape", self.testbed, m.name, root=True)["removed"]
            return f"removed this testbed's earlier shaping ({len(removed)} item(s))" if removed else "not shaped yet"

        self._each("shape", unshape)

        def base(m: Machine) -> str:
            subtract = {}
            for dc, peer in firsts.items():
                if dc != m.dc:
                    sample = self._agent(m, "rtt", peer.data_address, "--count", "10", root=True)
                    if sample["lost"] or not sample["values_s"]:
                        raise RemoteError(m.name, f"no answer from {peer.name} ({peer.data_address}) over {m.nic}: "
                                          "the data network does not connect them (inventory keys nic, data_address)")
                    subtract[dc] = statistics.median(sample["values_s"]) / 2
            shape = shapes[m.name]
            self.shapes[m.name] = HostShape(shape.testbed, shape.host, shape.nic, shape.egress, shape.ingress, subtract)
            return "unshaped one-way " + ", ".join(f"{dc} {units.format_time(s)}" for dc, s in subtract.items())

        self._each("shape", base)

        def install(m: Machine) -> str:
            session, facts = self.sessions[m.name], self.facts[m.name]
            spec = Path(tempfile.mkdtemp()) / f"{m.name}.shape.json"
            spec.write_text(json.dumps(self.shapes[m.name].to_json()))
            remote = f"{self._workdir(m)}/{self.testbed}.{m.name}.shape.json"
            session.put(spec, remote)
            shutil.rmtree(spec.parent)
            installed = self._agent(m, "shape", remote, root=True)
            facts.shaper = installed["mode"]
            peers = ", ".join(f"{p.dc} {units.format_time(p.delay_s)} {units.format_rate(p.rate_bps)}"
                              for p in self.shapes[m.name].egress)
            return f"{installed['mode']} on {m.nic}: towards {peers}"

        self._each("shape", install)

    def attach(self) -> None:
        """The shaping an earlier `up` installed, for a run without shaping again: every shaped machine is asked
        for its counters (a machine not shaped for this testbed fails the step, naming it)."""
        self.shapes = plan_shapes(self.inventory, self.testbed)
        self._each("run", lambda m: f"shaped ({self._agent(m, 'counters', self.testbed, m.name, root=True)})",
                   [m for m in self.inventory.machines if m.name in self.shapes])

    def _first_per_dc(self) -> dict[str, Machine]:
        firsts: dict[str, Machine] = {}
        for m in self.inventory.machines:
            firsts.setdefault(m.dc, m)
        return firsts

    # -- verify ----------------------------------------------------------------------------------------
    def verify(self) -> list[Check]:
        """Per DC pair the round trip, per direction the TCP goodput, between each DC's first machines."""
        start = time.monotonic()
        plan = build_plan(self.inventory.topology, self.testbed)
        firsts = list(self._first_per_dc().values())
        checks = []
        for i, a in enumerate(firsts):
            for b in firsts[i + 1:]:
                checks.append(self._rtt_check(plan, a, b))
                checks.append(self._throughput_check(plan, a, b))
                checks.append(self._throughput_check(plan, b, a))
        self.checks = checks
        self.step_s["verify"] = time.monotonic() - start
        for c in checks:
            self.log(f"  verify    {c.kind:<10} {c.subject}: {c.measured} (expected {c.expected}) "
                     f"{'pass' if c.ok else 'FAIL'}")
        return checks

    def _rtt_check(self, plan: Any, a: Machine, b: Machine) -> Check:
        want = path_of(plan, a.dc, b.dc)[0] + path_of(plan, b.dc, a.dc)[0]
        base = 2 * self.shapes[a.name].subtract_s.get(b.dc, 0.0) if a.name in self.shapes else 0.0
        for _ in range(RTT_ROUNDS):
            sample = self._agent(a, "rtt", b.data_address, "--count", "10", root=True)
            values = sorted(sample["values_s"])
            got = statistics.median(values) if values else float("nan")
            iqr = statistics.quantiles(values, n=4)[2] - statistics.quantiles(values, n=4)[0] if len(values) >= 4 else 0
            tol = delay_tolerance(want, 0.2e-3, iqr)
            ok = not sample["lost"] and abs(got - want) <= tol
            if ok:
                break
        return Check("rtt", f"{a.dc} <-> {b.dc} ({a.name} -> {b.name})", f"{units.format_time(want)} ± "
                     f"{units.format_time(tol)}", f"{units.format_time(got)} median of 10 (network's own "
                     f"{units.format_time(base)} taken off the holds)" + (f", {sample['lost']} lost" if sample["lost"]
                                                                         else ""), ok,
                     key=dc_pair(a.dc, b.dc), value=got)

    def _throughput_check(self, plan: Any, src: Machine, dst: Machine) -> Check:
        _, rate, _ = path_of(plan, src.dc, dst.dc)
        mtu = plan.directions[0].mtu
        expected = rate * (mtu - 52) / (mtu + 14)
        runs: list[float] = []
        for _ in range(THROUGHPUT_RUNS):
            port = int(self._agent(dst, "freeport", dst.data_address)["port"])
            channel = self.sessions[dst.name].start(["env", f"PYTHONPATH={self.facts[dst.name].project}",
                                                     self.facts[dst.name].python, "-m", "testbed.remote.agent", "sink",
                                                     dst.data_address, str(port)], pty=False)
            try:
                _read_line(channel, dst.name, 20)          # {"listening": port}
                self._agent(src, "source", dst.data_address, str(port), str(THROUGHPUT_S))
                runs.append(json.loads(_read_line(channel, dst.name, 30))["bps"])
            finally:
                channel.close()
            if runs[-1] >= GOODPUT_FRACTION * expected:
                break
        best = max(runs)
        return Check("throughput", f"{src.dc} -> {dst.dc} ({src.name} -> {dst.name})",
                     f"{GOODPUT_FRACTION:.0%}-{GOODPUT_CEILING:.0%} of {units.format_rate(expected)} (TCP at MTU {mtu} "
                     f"over {units.format_rate(rate)})", f"{units.format_rate(best)} ({best / expected:.1%} of expected)"
                     + (f", best of {len(runs)} runs of {THROUGHPUT_S:g} s (" + ", ".join(f"{r / expected:.0%}" for r in runs)
                        + ")" if len(runs) > 1 else ""),
                     GOODPUT_FRACTION * expected <= best <= GOODPUT_CEILING * expected)

    # -- run and collect ---------------------------------------------------------------------------------
    def run(self, options: RunOptions, run_id: str | None = None) -> tuple[Path, RunSummary]:
        """Every schedule of `options` in turn, one worker per machine chosen by the placement; results collected
        into results/<run-id>/ with the single-machine contract."""
        chosen = stage_machines(self.inventory, options)
        plan = build_plan(self.inventory.topology, self.testbed)
        links = []
        for a, b in zip(chosen, chosen[1:], strict=False):
            delay, rate, _ = path_of(plan, a.dc, b.dc) if a.dc != b.dc else (0.0, plan.fabric_rate_bps(a.dc), 0)
            links.append(StageLink(delay, rate))
        run_id = run_id or time.strftime("%Y%m%d-%H%M%S") + "-remote-" + "-".join(options.schedules)
        run_dir = self.results_root / run_id
        run_dir.mkdir(parents=True, exist_ok=True)
        tokens = options.microbatches * options.microbatch_size * int(options.model.get("block_size", 64))
        drops_before = self._drops()
        summaries, traces = [], {}
        start = time.monotonic()
        for schedule in options.schedules:
            self.log(f"  run       {schedule}: {len(chosen)} stages on {', '.join(m.name for m in chosen)}")
            best: tuple[list[RankTrace], ScheduleSummary, Path] | None = None
            for attempt in range(MAX_REPEATS + 1):          # a disturbed run is measured again, as on one machine
                raise_if_pending()
                where = run_dir if attempt == 0 else run_dir / f"repeat{attempt}"
                ranks, measured = self._measure(schedule, options, chosen, links, plan, tokens, where, run_id)
                measured.repeated = attempt
                if best is None or measured.host_load.lost_fraction < best[1].host_load.lost_fraction:
                    best = (ranks, measured, where)
                if not measured.host_load.disturbed:
                    break
                self.log(f"            host disturbed ({'; '.join(measured.host_load.reasons)})"
                         + ("; measuring again" if attempt < MAX_REPEATS else "; kept, marked disturbed"))
            ranks, measured, kept = best
            measured.repeated = attempt
            keep_attempt(run_dir / schedule, kept / schedule)
            check_budget(schedule, measured)
            traces[schedule] = ranks
            summaries.append(measured)
        self.step_s["run"] = time.monotonic() - start - self.collect_s    # stopping workers included, fetching not
        self.step_s.pop("stop", None)
        metrics.pool_references(summaries)
        drops_after = self._drops()
        summary = self._summary(run_id, plan, chosen, links, summaries, options, drops_before, drops_after)
        start = time.monotonic()
        write_run(run_dir, summary, traces, plan, self.log)
        (run_dir / "hosts").mkdir(exist_ok=True)
        for name, facts in self.facts.items():
            (run_dir / "hosts" / f"{name}.json").write_text(json.dumps(asdict(facts), indent=1))
        (run_dir / "verify.json").write_text(json.dumps([asdict(c) for c in self.checks], indent=1))
        (run_dir / "cycle.json").write_text(json.dumps({"step_s": self.step_s, "tree": self.tree_id}, indent=1))
        self.step_s["collect"] = self.collect_s + time.monotonic() - start
        return run_dir, summary

    def _measure(self, schedule: str, options: RunOptions, chosen: list[Machine], links: list[StageLink], plan: Any,
                 tokens: int, where: Path, run_id: str) -> tuple[list[RankTrace], ScheduleSummary]:
        """One schedule run once on the machines, with its host load and link timing."""
        loads_before, holds_before, began = self._loads(chosen), self._holds(plan), time.monotonic()
        ranks = self._run_schedule(schedule, options, chosen, links, where / schedule, run_id)
        time.sleep(STATS_INTERVAL_S)           # the daemons' statistics cover the run's last packets
        measured = measure(schedule, ranks, tokens, links)
        measured.link_timing = link_timing(plan, holds_before, self._holds(plan), {})   # no calibration absorbed
        if measured.breakdown is not None:      # its CPU ledger adds every rank's threads to rank 0's machine:
            measured.breakdown.cpu = []         # right on one box, wrong across several
        measured.host_load = self._host_load(chosen, loads_before, time.monotonic() - began)
        measured.host_load.compute_drift = compute_drift([measured])
        return ranks, measured

    def _run_schedule(self, schedule: str, options: RunOptions, chosen: list[Machine], links: list[StageLink],
                      out_dir: Path, run_id: str) -> list[RankTrace]:
        master = chosen[0]
        port = int(self._agent(master, "freeport", master.data_address)["port"])
        remote_dirs = {m.name: f"{self._workdir(m)}/runs/{run_id}/{schedule}" for m in chosen}
        channels = []
        try:
            for rank, m in enumerate(chosen):
                session, facts = self.sessions[m.name], self.facts[m.name]
                folder = remote_dirs[m.name]
                config = WorkerConfig(
                    rank=rank, world=len(chosen), master_addr=master.data_address, master_port=port, schedules=[schedule],
                    microbatches=options.microbatches, microbatch_size=options.microbatch_size,
                    iterations=options.iterations, model=options.model, split=options.split,
                    link_delay_s=[lk.delay_s for lk in links], link_rate_bps=[lk.rate_bps for lk in links],
                    memory_budget=options.memory_budget, lr=options.lr, seed=options.seed, out_dir=folder,
                    cpu=rank % int(facts.env.get("cpus") or 1), timeout_s=max(60.0, options.hang_timeout_s),
                    dump_gradients=options.dump_gradients)
                local = out_dir / f"worker-{rank}.json"
                local.parent.mkdir(parents=True, exist_ok=True)
                local.write_text(json.dumps(config.to_json(), indent=1))
                session.run(["mkdir", "-p", folder])
                session.put(local, f"{folder}/worker-{rank}.json")
                channels.append(session.start(
                    ["env", f"PYTHONPATH={facts.project}", "OMP_NUM_THREADS=1", f"GLOO_SOCKET_IFNAME={m.nic}",
                     facts.python, "-m", "testbed.remote.agent", "worker", f"{folder}/worker-{rank}.json",
                     f"{folder}/worker-{rank}.log", f"{folder}/worker-{rank}.pid"]))
            self._supervise(chosen, channels, remote_dirs, options.hang_timeout_s)
        finally:
            with cleanup():
                self._stop_workers(chosen, channels, remote_dirs)
        fetch = time.monotonic()
        ranks = []
        for rank, m in enumerate(chosen):
            self.sessions[m.name].get(f"{remote_dirs[m.name]}/{schedule}/rank-{rank}.json", out_dir / f"rank-{rank}.json")
            self.sessions[m.name].get(f"{remote_dirs[m.name]}/worker-{rank}.log", out_dir / f"worker-{rank}.log")
            ranks.append(RankTrace.from_json(json.loads((out_dir / f"rank-{rank}.json").read_text())))
        self.collect_s += time.monotonic() - fetch
        return ranks

    def _stop_workers(self, chosen: list[Machine], channels: list[Any], remote_dirs: dict[str, str]) -> None:
        """Close the workers' channels (their pty hangs up) and stop any still running by its pid file."""
        for channel in channels:
            channel.close()
        self._each("stop", lambda m: _stopped(self._agent(m, "kill", f"{remote_dirs[m.name]}/worker-"
                                                            f"{chosen.index(m)}.pid")), chosen, stop=False)

    def _supervise(self, chosen: list[Machine], channels: list[Any], remote_dirs: dict[str, str],
                   hang_timeout_s: float) -> None:
        buffers = [b"" for _ in channels]
        last = time.monotonic()
        while True:
            raise_if_pending()
            for rank, channel in enumerate(channels):
                while channel.recv_ready():
                    buffers[rank] += channel.recv(65536)
                    *lines, buffers[rank] = buffers[rank].split(b"\n")
                    for line in lines:
                        last = time.monotonic()
                        self._progress(line, rank, len(channels))
                if channel.exit_status_ready() and not channel.recv_ready():
                    code = channel.recv_exit_status()
                    if code != 0:
                        m = chosen[rank]
                        tail = self.sessions[m.name].run(["tail", "-c", "1500", f"{remote_dirs[m.name]}/worker-{rank}.log"],
                                                         check=False).stdout
                        raise RemoteError(m.name, f"worker {rank} exited with {code}; the run was stopped. End of "
                                          f"its log:\n{tail.strip()}")
            if all(c.exit_status_ready() and c.recv_exit_status() == 0 for c in channels):
                return
            if time.monotonic() - last > hang_timeout_s:
                raise RunError(f"no progress for {hang_timeout_s:.0f} s; the run was stopped")
            time.sleep(0.05)

    def _progress(self, line: bytes, rank: int, world: int) -> None:
        try:
            event = json.loads(line.strip() or b"{}")
        except json.JSONDecodeError:
            return
        if event.get("event") == "iteration" and rank == world - 1:
            loss = event.get("loss")
            self.log(f"            iteration {event['iteration']}: {event['seconds']:.3f} s"
                     + (f", loss {loss:.3f}" if loss is not None else ""))

    def _loads(self, machines: list[Machine]) -> dict[str, dict[str, Any]]:
        return {m.name: self._agent(m, "load") for m in machines}

    def _host_load(self, machines: list[Machine], before: dict[str, dict[str, Any]], wall_s: float) -> HostLoad:
        """Per machine, steal over the run from /proc/stat (other processes cannot be told from the workers on a
        remote machine: foreign_fraction is not measured there and stays 0). The worst machine's figures."""
        after = self._loads(machines)
        steal, queue, reasons = 0.0, [], []
        for m in machines:
            part = steal_fraction(before[m.name]["cpu"], after[m.name]["cpu"])
            steal = max(steal, part)
            queue.append(after[m.name]["procs_running"])
            if part > STEAL_BOUND:
                reasons.append(f"{m.name}: CPU steal {part:.1%} > {STEAL_BOUND:.0%}")
        return HostLoad(wall_s=wall_s, steal_fraction=steal, foreign_fraction=0.0,
                        run_queue_mean=sum(queue) / len(queue), run_queue_max=max(queue), daemon_cpu_fraction=None,
                        disturbed=bool(reasons), reasons=reasons, foreign_measured=False)

    def _drops(self) -> dict[tuple[str, str], int]:
        """Per (src DC, dst DC): drops so far on the senders' egress leaves and the receivers' delay line."""
        return self._counters()[0]

    def _holds(self, plan: Any) -> dict[str, tuple[int, float]]:
        """Per direction label: packets the receivers' delay lines released so far and their summed release
        error (seconds), over every machine of the destination DC (what runner.link_timing takes)."""
        totals = self._counters()[1]
        return {d.label: totals[(d.src_dc, d.dst_dc)] for d in plan.directions if (d.src_dc, d.dst_dc) in totals}

    def _counters(self) -> tuple[dict[tuple[str, str], int], dict[tuple[str, str], tuple[int, float]]]:
        drops: dict[tuple[str, str], int] = {}
        holds: dict[tuple[str, str], tuple[int, float]] = {}
        for m in self.inventory.machines:
            if m.name not in self.shapes:
                continue
            counts = self._agent(m, "counters", self.testbed, m.name, root=True)
            for dc, n in counts["egress"].items():
                drops[(m.dc, dc)] = drops.get((m.dc, dc), 0) + max(0, n)
            for dc, n in counts["ingress"].items():
                drops[(dc, m.dc)] = drops.get((dc, m.dc), 0) + max(0, n)
            for dc, (released, error_s) in counts.get("holds", {}).items():
                was = holds.get((dc, m.dc), (0, 0.0))
                holds[(dc, m.dc)] = (was[0] + int(released), was[1] + float(error_s))
        return drops, holds

    def _summary(self, run_id: str, plan: Any, chosen: list[Machine], links: list[StageLink], summaries: list[Any],
                 options: RunOptions, drops_before: dict[tuple[str, str], int],
                 drops_after: dict[tuple[str, str], int]) -> RunSummary:
        rtt = {c.key: c for c in self.checks if c.kind == "rtt"}
        records = []
        for d in plan.directions:
            check = rtt.get(dc_pair(d.src_dc, d.dst_dc))
            key = (d.src_dc, d.dst_dc)
            records.append(LinkRecord(
                link=d.link, src_dc=d.src_dc, dst_dc=d.dst_dc, configured_delay_s=d.delay_s, configured_rate_bps=d.rate_bps,
                measured_one_way=f"round trip {check.measured}" if check else None,   # one way: not across machines
                delay_ok=check.ok if check else None,
                drops_during_run=drops_after[key] - drops_before.get(key, 0) if key in drops_after else None,
                lossless=d.lossless))
        boots: dict[str, list[str]] = {}
        for m in chosen:
            boots.setdefault(self.facts[m.name].env.get("boot_id", m.name), []).append(m.name)
        daemons = sum(1 for m in chosen if self.facts[m.name].shaper == "delayline")
        cpus = min(int(self.facts[m.name].env.get("cpus") or 1) for m in chosen)
        busiest = max(len(names) for names in boots.values())
        oversubscribed = busiest + (daemons if busiest > 1 else min(1, daemons)) > cpus
        shapers = sorted({self.facts[m.name].shaper or "none" for m in chosen})
        calibration = {f"{dc} -> {self.inventory.machine(name).dc}": s for name, shape in self.shapes.items()
                       for dc, s in shape.subtract_s.items()}
        return RunSummary(
            run_id=run_id, topology=plan.topology, testbed=self.testbed,
            stages=[StagePlacement(i, m.name, m.dc) for i, m in enumerate(chosen)], stage_links=links,
            links=records, lossless_ok=all(not lk.lossless or not lk.drops_during_run for lk in records),
            shaper="+".join(shapers), backend="remote-ssh", switch=None, shaper_calibration_s=calibration,
            transport="gloo-tcp", transport_reason=("--transport auto took tcp: 'testbed remote' carries TCP only"
                                                    if options.transport == "auto" else "asked for"),
            kernel=", ".join(sorted({self.facts[m.name].kernel for m in chosen})), cpus=cpus,
            oversubscribed=oversubscribed, workers=len(chosen), delay_daemons=daemons,
            options=asdict(options), schedules=summaries, daemon_restarts=0)

    # -- teardown --------------------------------------------------------------------------------------
    def teardown(self) -> list[RemoteError]:
        """On every machine that answers: stop this testbed's workers, remove its shaping and run folders."""
        self.log("teardown")

        def clean(m: Machine) -> str:
            if m.name not in self.sessions:
                return "not reached: nothing was set up there"
            facts = self.facts.get(m.name)
            if facts is None or not facts.project:
                return "nothing set up"
            removed = self._agent(m, "unshape", self.testbed, m.name, root=True)["removed"]
            workdir = self._workdir(m)
            self.sessions[m.name].run(["rm", "-rf", "--", f"{workdir}/runs", f"{workdir}/{self.testbed}.{m.name}.shape.json"])
            return f"removed {len(removed)} item(s)" + (f": {', '.join(removed)}" if removed else "")

        failures = self._each("teardown", clean, stop=False)
        return failures


def dc_pair(a: str, b: str) -> str:
    """The key of a round-trip check between two DCs, whichever way it was measured."""
    return " <-> ".join(sorted((a, b)))


def _read_line(channel: Any, machine: str, timeout_s: float) -> str:
    """One line from a channel's stdout (blocking, so a reply is seen the moment it lands), or the command's
    stderr as the error."""
    buffer = b""
    channel.settimeout(timeout_s)
    while b"\n" not in buffer:
        try:
            chunk = channel.recv(4096)
        except TimeoutError:
            raise RemoteError(machine, f"agent said nothing in {timeout_s:.0f} s") from None
        if not chunk:
            err = channel.recv_stderr(4096).decode(errors="replace")
            raise RemoteError(machine, f"agent exited {channel.recv_exit_status()}: {err.strip()}")
        buffer += chunk
    return buffer.split(b"\n", 1)[0].decode()


CLOCK_SAMPLES = 8


def _clock_offset(session: Session) -> tuple[float, float]:
    """The machine's clock minus ours, NTP-style: over one channel, the sample with the shortest round trip
    (offset = remote - midpoint, uncertainty = half that round trip)."""
    channel = session.start(["python3", "-c", "import sys, time\nfor _ in sys.stdin: print(repr(time.time()), "
                             "flush=True)"], pty=False)
    best = (0.0, float("inf"))
    try:
        for _ in range(CLOCK_SAMPLES):
            before = time.time()
            channel.sendall(b"\n")
            remote = float(_read_line(channel, session.machine.name, 10))
            after = time.time()
            if (after - before) / 2 < best[1]:
                best = (remote - (before + after) / 2, (after - before) / 2)
    finally:
        channel.close()
    return best


def _stopped(result: dict[str, Any]) -> str:
    return "worker already ended" if result["stopped"] is None else f"worker {result['stopped']} stopped"


def stage_machines(inventory: Inventory, options: RunOptions) -> list[Machine]:
    """The machines that run stage 0, 1, ... (testbed.run.placement), the model checked against them: before
    anything is set up on any machine."""
    if options.transport == "rdma":
        raise RunError("--transport rdma is not carried by 'testbed remote' yet: its workers run over TCP (gloo); "
                       "use --transport tcp or auto, or run RDMA under the stock kernel ('testbed vm')")
    machines = list(inventory.machines)
    try:
        chosen = [machines[i] for i in place_stages([(m.name, m.dc) for m in machines], options.stages,
                                                    options.placement)]
    except PlacementError as exc:
        raise RunError(str(exc)) from None
    options.check_stages(len(chosen))
    return chosen


def full_cycle(inventory: Inventory, options: RunOptions, *, testbed: str, results_root: Path,
               log: Callable[[str], None] = print, verify_required: bool = True) -> tuple[Path, RunSummary, Cycle]:
    """preflight -> provision -> shape -> verify -> run -> collect, then teardown whatever happened."""
    stage_machines(inventory, options)
    cycle = Cycle(inventory, testbed, results_root, log)
    try:
        cycle.preflight()
        cycle.provision()
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
    (run_dir / "cycle.json").write_text(json.dumps({"step_s": cycle.step_s, "tree": cycle.tree_id}, indent=1))
    return run_dir, summary, cycle
