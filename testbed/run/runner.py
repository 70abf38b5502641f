"""`testbed run`: launch one pipeline worker per host namespace, supervise them, collect and summarise.

A worker that exits non-zero, or a run that makes no progress for `hang_timeout_s`, fails the whole run
within seconds: every worker is stopped (SIGTERM, then SIGKILL), and the error names the worker and shows
the end of its log. Workers are recorded in the testbed's state, so `testbed down` stops them too.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import selectors
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from testbed.backends import nsfs
from testbed.backends.base import Backend
from testbed.backends.cgroups import WorkerCap
from testbed.check.links import check_delays, daemons_cpu, delay_tolerance
from testbed.deploy.linkset import set_link
from testbed.errors import TestbedError
from testbed.plan.builder import HOST_IFNAME, reshape
from testbed.plan.model import LinkDirection, Node, Plan
from testbed.run import events as run_events
from testbed.run import metrics
from testbed.run.attempts import Attempt, attempt_folder, best_attempt
from testbed.run.background import read_traffic, require_iperf3, shared_traffic
from testbed.run.breakdown import breakdown
from testbed.run.compute import run_table
from testbed.run.dilation import (
    DEFAULT_DILATION,
    OFF,
    Dilation,
    dilated_links,
    plan_dilation,
    restore_links,
    undilate,
    worker_caps,
)
from testbed.run.edges import edge_during
from testbed.run.placement import place_stages
from testbed.run.summary import LinkRecord, LinkTiming, RunSummary, ScheduleSummary, StageLink, StagePlacement
from testbed.run.transport import TransportChoice
from testbed.run.transport import choose as choose_transport
from testbed.run.userschedules import measured_memory, prepare, user_names
from testbed.shaping.base import Shaper
from testbed.shaping.registry import daemon_roles, shaper_for
from testbed.state.records import ProcessRecord
from testbed.topology import TopologyError
from testbed.topology.profile import parse_compute, resolve_profile
from testbed.util import procs, units
from testbed.util.hostload import LoadMonitor
from testbed.util.interrupts import cleanup, raise_if_pending
from testbed.util.paths import REPO_ROOT
from workloads.commthreads import DEFAULT_COMM_PRIORITY
from workloads.compute import PROFILE, REAL, ComputeError, ComputeMode, CostTable
from workloads.hostcpu import WatchGroup
from workloads.layouts import TORCH_SCHEDULES, chunks_per_rank
from workloads.memory import MemoryBudget
from workloads.records import RDMA, TCP, GPTConfig, LinkSetting, RankTrace, WorkerConfig
from workloads.schedule import SCHEDULES, USER_SCHEDULES_ENV, registered

ALL_SCHEDULES = (*SCHEDULES, *TORCH_SCHEDULES)
"""Ours (schedules as data) and PyTorch's own, run on the same model and timed the same way."""
class RunError(TestbedError, RuntimeError):
    """The run failed; the message names the worker and quotes its log."""


@dataclass(frozen=True, slots=True)
class SweepPoint:
    """One setting of the swept link (both directions) that a run interleaves with the others."""

    label: str
    """Its name, and the folder of its schedules' traces: `1000km`."""
    delay_s: float
    rate_bps: float
    schedules: list[str] = field(default_factory=list)
    """The schedules run at this setting (empty: all of the run's)."""


@dataclass(frozen=True, slots=True)
class LinkSweep:
    """The link between two DCs set to each point in turn while the run's workers wait between iterations:
    every schedule at every point in one launch, so a distance sweep shares the host's drift as the
    schedules of one launch do. The link is put back as it was afterwards."""

    a: str
    b: str
    points: list[SweepPoint]

    def __post_init__(self) -> None:
        labels = [p.label for p in self.points]
        if not self.points or len(set(labels)) != len(labels):
            raise RunError(f"a link sweep needs points with distinct labels, got {labels}")


@dataclass(kw_only=True, slots=True)
class RunOptions:
    """What `testbed run` trains and how (the same for every schedule of the run)."""

    schedules: list[str]
    microbatches: int = 8
    microbatch_size: int = 4
    iterations: int = 4
    model: GPTConfig = field(default_factory=GPTConfig)
    """The model's shape; a dict of its fields (as JSON gives it) is taken too."""
    memory_budget: MemoryBudget | None = None
    """In-flight memory per stage, enforced: bytes or relative to 1F1B; its text (`64MiB`, `1f1b+2`) is taken too."""
    unbudgeted: list[str] = field(default_factory=list)
    """Schedules of the run that run without `memory_budget` (gpipe cannot fit a 1F1B-relative one)."""
    split: list[int] | None = None
    stages: int | None = None
    """Pipeline stages (default: see `placement`)."""
    placement: str = "spread"
    """spread (default: stages spread evenly over the DCs, one per DC without --stages) or fill."""
    hang_timeout_s: float = 60.0
    lr: float = 3e-3
    seed: int = 1234
    dump_gradients: bool = False
    """Each rank writes its last iteration's gradients (grads-rank-<r>.pt) beside its trace."""
    transport: str = TCP.key
    """tcp (gloo), rdma (SoftRoCE / RDMA NIC; fails when missing) or auto (rdma where possible, says why not)."""
    rdma_slots: int = 4
    """RDMA receive slots per neighbour: how many messages a sender may push before the receiver takes them."""
    comm_priority: str = DEFAULT_COMM_PRIORITY
    """The workers' communication threads: normal, or realtime (SCHED_FIFO; workloads/commthreads.py)."""
    comm_affinity: str = "own"
    """The workers' communication threads: on the worker's own core, or on any core (workloads/commthreads.py)."""
    sender: str = "thread"
    """Who writes gloo's sends (workloads/records.py WorkerConfig.sender): thread or inline."""
    dilation: str = DEFAULT_DILATION
    """Time dilation (testbed/run/dilation.py): off, auto (k from the workers' caps) or a factor."""
    sweep: LinkSweep | None = None
    """Interleave these settings of one link with the schedules (the experiment's distance sweep)."""
    compute: ComputeMode = field(default_factory=lambda: ComputeMode(REAL))
    """real (the model's arithmetic), replay (time from a table profiled here), replay:FILE or a deployment
    profile (workloads/compute.py); its text is taken too."""
    events: list[Any] = field(default_factory=list)
    """Link changes and outages at set points of the training (testbed/run/events.py: `At`); not with `sweep`."""
    shape: tuple[int, int] | None = None
    """A deployment profile's micro-batch (sequences b, sequence length s); None: the profile's default."""
    tokens: int | None = None
    """Tokens per step (the global batch): `microbatches` is derived as tokens / tokens per micro-batch (b * s of
    the profile's shape, or microbatch_size * the model's sequence length) and recorded; None: `microbatches`."""

    def __post_init__(self) -> None:
        if isinstance(self.compute, str):
            try:
                self.compute = parse_compute(self.compute)
            except (ComputeError, TopologyError) as exc:
                raise RunError(f"--compute: {exc}") from None
        if self.compute.timed:
            torch_ones = [s for s in self.schedules if s in TORCH_SCHEDULES]
            if torch_ones:
                raise RunError(f"{torch_ones[0]} runs PyTorch's own executor, which computes for real: run it with "
                               f"--compute real, or leave it out of a --compute {self.compute.text} run")
        if isinstance(self.model, dict):
            unknown = sorted(set(self.model) - {f.name for f in fields(GPTConfig)})
            if unknown:
                raise RunError(f"model: unknown field {unknown[0]!r}; known: {', '.join(f.name for f in fields(GPTConfig))}")
            try:
                self.model = GPTConfig(**self.model)
            except ValueError as exc:
                raise RunError(f"model: {exc} (--width, --heads, --layers, --seq-len)") from None
        bad = [s for s in self.schedules if s not in ALL_SCHEDULES and s not in registered()]
        if bad or not self.schedules:
            raise RunError(f"unknown schedule {bad[0] if bad else '(none)'!r}; choose from: "
                           f"{', '.join((*ALL_SCHEDULES, *registered()))}")
        if isinstance(self.memory_budget, str | int):
            try:
                self.memory_budget = MemoryBudget.parse(self.memory_budget, units.parse_size)
            except ValueError as exc:
                raise RunError(f"--memory-budget: {exc}") from None
        if self.comm_priority not in ("normal", "realtime"):
            raise RunError(f"--comm-priority {self.comm_priority!r}: use normal or realtime")
        if self.comm_affinity not in ("own", "any"):
            raise RunError(f"comm_affinity {self.comm_affinity!r}: use own or any")
        if self.sender not in ("thread", "inline"):
            raise RunError(f"sender {self.sender!r}: use thread or inline")
        if self.microbatches < 1 or self.microbatch_size < 1 or self.iterations < 1:
            raise RunError("--microbatches, --microbatch-size and --iterations must be at least 1")
        self._derive_microbatches()

    def tokens_per_microbatch(self) -> int:
        """b * s of the profile's micro-batch (its `shape`), or microbatch_size * the model's sequence length."""
        if self.compute.kind == PROFILE:
            b, s = resolve_profile(self.compute.source).shape(*(self.shape or (None, None)))
            return b * s
        return self.microbatch_size * self.model.block_size

    def _derive_microbatches(self) -> None:
        if self.shape is not None:
            if self.compute.kind != PROFILE:
                raise RunError(f"shape {self.shape}: a micro-batch shape (b, s) is a deployment profile's; give "
                               "--compute PROFILE, or --microbatch-size and --seq-len for the real model")
            self.shape = (int(self.shape[0]), int(self.shape[1]))
        if self.tokens is None:
            return
        per = self.tokens_per_microbatch()
        if self.tokens < per or self.tokens % per:
            raise RunError(f"--tokens {self.tokens}: not a whole number of micro-batches of {per} tokens; give a "
                           f"multiple of {per} (e.g. {per * 64})")
        self.microbatches = self.tokens // per

    def to_json(self) -> dict[str, Any]:
        """As a run's summary records them (the budget and the compute as their text)."""
        return {**asdict(self), "memory_budget": None if self.memory_budget is None else self.memory_budget.text,
                "compute": self.compute.text}

    def check_stages(self, count: int) -> None:
        """The model must fill `count` stages (PyTorch's multi-stage schedules: twice as many chunks); checked
        before anything is brought up."""
        if self.compute.timed and (self.compute.kind == PROFILE or self.compute.source):
            return                      # the table's stages are checked against the run's (testbed/run/compute.py)
        layers = self.model.n_layer
        for name in self.schedules:
            chunks = count * chunks_per_rank(name)
            if layers < chunks and (self.split is None or chunks > count):    # two-chunk schedules split evenly
                raise RunError(f"{layers} layers cannot fill {chunks} stages ({name} on {count} hosts"
                               + (f", {chunks_per_rank(name)} chunks each" if chunks > count else "")
                               + f"): use --layers {chunks} or more, or fewer --stages")

    def hosts(self, plan: Plan) -> list[Node]:
        """The hosts that run stage 0, 1, ... (see testbed.run.placement)."""
        chosen = place_stages([(h.name, h.dc) for h in plan.hosts], self.stages, self.placement)
        return [plan.hosts[i] for i in chosen]


def stage_links(plan: Plan, hosts: list[Node]) -> list[StageLink]:
    """Configured delay and bottleneck rate between consecutive stages, along the planned DC path."""
    links = []
    for a, b in zip(hosts, hosts[1:], strict=False):
        if a.dc == b.dc:
            links.append(StageLink(0.0, plan.fabric_rate_bps(a.dc), crosses_dc=False))
            continue
        hops = plan.hops(a.dc, b.dc)
        reals = [h.real_rate_bps for h in hops]
        links.append(StageLink(sum(h.delay_s for h in hops), min(h.rate_bps for h in hops),
                               None if None in reals else min(r for r in reals if r is not None)))
    return links


def run_group(backend: Backend, schedules: list[str], options: RunOptions, hosts: list[Node], out_dir: Path,
              progress: Callable[[dict[str, Any]], None] | None = None,
              monitor: LoadMonitor | None = None, transport: TransportChoice | None = None,
              dilation: Dilation = OFF, table: CostTable | None = None, *,
              player: run_events.EventPlayer | None = None, shipped: Path | None = None) -> dict[str, list[RankTrace]]:
    """Run `schedules` (at every point of `options.sweep`) interleaved, iteration by iteration, in one launch
    of the workers on `hosts` (workloads/worker.py); per entry (`schedule`, or `label/schedule` in a sweep),
    its per-rank traces from out_dir/<entry>/ (in undilated time: a dilated run's raw traces stay beside them
    as rank-<r>.dilated.json)."""
    sweep = options.sweep
    with swept_link(backend, sweep), dilated_links(backend, dilation.factor), \
            worker_caps(backend, dilation, len(hosts)) as caps, run_events.playing(player):
        settings, switch = [], None
        if sweep is not None:
            undilated = backend.state.undilated or list(backend.state.plan.directions)
            settings = [_setting(backend, undilated, sweep, p, hosts, dilation.factor) for p in sweep.points]

            def switch(index: int) -> None:
                _apply_point(backend, sweep, sweep.points[index], dilation.factor)
            switch(0)
        slow = table.slowed(dilation.factor) if table is not None and dilation.on else table   # spans too, in time
        out_dir.mkdir(parents=True, exist_ok=True)
        with shared_traffic(backend, out_dir, dilation.factor):
            _run_workers(backend, schedules, options, hosts, out_dir, progress, monitor, transport, caps, settings,
                         switch, slow, player=player, shipped=shipped)
    traces = {}
    for entry in entries(schedules, sweep):
        folder = out_dir / entry
        raw = [RankTrace.from_json(json.loads((folder / f"rank-{rank}.json").read_text())) for rank in range(len(hosts))]
        if dilation.on:
            for rank, trace in enumerate(raw):
                (folder / f"rank-{rank}.json").rename(folder / f"rank-{rank}.dilated.json")
                (folder / f"rank-{rank}.json").write_text(json.dumps(undilate(trace, dilation.factor).to_json()))
            raw = [undilate(trace, dilation.factor) for trace in raw]
        traces[entry] = raw
    return traces


def entries(schedules: list[str], sweep: LinkSweep | None) -> list[str]:
    """What a run measures: each schedule, or in a sweep `label/schedule` for each point's schedules."""
    if sweep is None:
        return list(schedules)
    return [f"{p.label}/{s}" for p in sweep.points for s in (p.schedules or schedules)]


@contextlib.contextmanager
def swept_link(backend: Backend, sweep: LinkSweep | None) -> Iterator[None]:
    """The swept link's directions put back as they were after the sweep (whatever stopped it)."""
    if sweep is None:
        yield
        return
    with restored_link(backend, sweep.a, sweep.b):
        yield


@contextlib.contextmanager
def restored_link(backend: Backend, a: str, b: str) -> Iterator[None]:
    """The OTN link between DCs `a` and `b` put back as the plan states it after the block (whatever stopped it)."""
    before = [d for d in backend.state.plan.directions if {d.src_dc, d.dst_dc} == {a, b}]
    if not before:
        raise RunError(f"no OTN link between {a} and {b} to sweep")
    try:
        yield
    finally:
        with cleanup():
            for d in before:
                set_link(backend, d.src_dc, d.dst_dc, from_dc=d.src_dc, delay_s=d.delay_s, rate_bps=d.rate_bps)


def _apply_point(backend: Backend, sweep: LinkSweep, point: SweepPoint, factor: float) -> None:
    set_link(backend, sweep.a, sweep.b, delay_s=point.delay_s * factor, rate_bps=point.rate_bps / factor)


def _setting(backend: Backend, undilated: list[LinkDirection], sweep: LinkSweep, point: SweepPoint,
             hosts: list[Node], factor: float) -> LinkSetting:
    """What the workers are told of one point: the delay and rate between their stages with the swept link at
    the point (k times slower in a dilated run, as the emulated link then is)."""
    plan = backend.state.plan
    for d in undilated:
        plan = plan.replace_direction(d)
    for d in undilated:
        if {d.src_dc, d.dst_dc} == {sweep.a, sweep.b}:
            plan = plan.replace_direction(reshape(d, delay_s=point.delay_s, rate_bps=point.rate_bps))
    links = stage_links(plan, hosts)
    return LinkSetting(point.label, [lk.delay_s * factor for lk in links], [lk.rate_bps / factor for lk in links],
                       list(point.schedules))


def point_links(backend: Backend, sweep: LinkSweep, point: SweepPoint, hosts: list[Node]) -> list[StageLink]:
    """The undilated delay and rate between the stages with the swept link at `point`."""
    setting = _setting(backend, backend.state.undilated or list(backend.state.plan.directions), sweep, point, hosts, 1.0)
    return [StageLink(d, r) for d, r in zip(setting.link_delay_s, setting.link_rate_bps, strict=True)]


def _run_workers(backend: Backend, schedules: list[str], options: RunOptions, hosts: list[Node], out_dir: Path,
                 progress: Callable[[dict[str, Any]], None] | None, monitor: LoadMonitor | None,
                 transport: TransportChoice | None, caps: list[WorkerCap], settings: list[LinkSetting] | None = None,
                 switch: Callable[[int], None] | None = None, table: CostTable | None = None, *,
                 player: run_events.EventPlayer | None = None, shipped: Path | None = None) -> None:
    links = stage_links(backend.state.plan, hosts)
    transport = transport or TransportChoice(TCP.key, "default")
    master = hosts[0].ip(HOST_IFNAME)
    port = free_port(backend, hosts[0].name, master)
    out_dir.mkdir(parents=True, exist_ok=True)
    cpus = os.cpu_count() or 1
    watch = watch_groups(backend)
    running: list[tuple[int, subprocess.Popen[bytes], Path]] = []
    try:
        for rank, host in enumerate(hosts):
            config = WorkerConfig(
                rank=rank, world=len(hosts), master_addr=master, master_port=port, schedules=list(schedules),
                microbatches=options.microbatches, microbatch_size=options.microbatch_size,
                iterations=options.iterations, model=options.model, split=options.split,
                link_delay_s=[lk.delay_s for lk in links], link_rate_bps=[lk.rate_bps for lk in links],
                memory_budget=options.memory_budget, unbudgeted=list(options.unbudgeted), lr=options.lr,
                seed=options.seed, out_dir=str(out_dir), cpu=rank % cpus,
                cgroup=str(caps[rank].procs) if caps else "", comm_cgroup=str(caps[rank].threads) if caps else "",
                comm_priority=options.comm_priority, comm_affinity=options.comm_affinity,
                sender=options.sender,
                timeout_s=max(60.0, options.hang_timeout_s),
                dump_gradients=options.dump_gradients, transport=transport.name, rdma_slots=options.rdma_slots,
                rdma_mtu=transport.path_rdma_mtu, rdma_device=transport.devices[rank].name if transport.devices else "",
                rdma_gid_index=transport.devices[rank].gid_index if transport.devices else -1, watch=watch,
                settings=list(settings or []), compute=options.compute.kind, cost_table=table)
            path = out_dir / f"worker-{rank}.json"
            path.write_text(json.dumps(config.to_json(), indent=1))
            log = out_dir / f"worker-{rank}.log"
            asks = rank == 0 and switch is not None       # rank 0 asks for each link setting on stdout, hears on stdin
            with open(log, "wb") as logf:
                proc = backend.popen(host.name, [sys.executable, "-m", "workloads.worker", str(path)],
                                     stdout=subprocess.PIPE, stderr=logf,
                                     stdin=subprocess.PIPE if asks else subprocess.DEVNULL,
                                     env={**os.environ, "PYTHONPATH": str(REPO_ROOT), "OMP_NUM_THREADS": "1",
                                          "GLOO_SOCKET_IFNAME": HOST_IFNAME,
                                          **({USER_SCHEDULES_ENV: str(shipped)} if shipped else {})},
                                     start_new_session=True)
            backend.state.processes.append(ProcessRecord.of(proc.pid, "worker", host.name))
            running.append((rank, proc, log))
        backend.state.save()

        def answer(event: dict[str, Any]) -> None:
            if player is not None:
                player.observe(event)
            if event.get("event") == "link" and event.get("rank", 0) == 0 and switch is not None:
                switch(int(event["setting"]))
                stdin = running[0][1].stdin
                assert stdin is not None
                stdin.write(b"ok\n")
                stdin.flush()
            elif progress:
                progress(event)
        sample = monitor.sample if monitor else None
        tick = sample if player is None else lambda: (player.tick(), sample and sample())
        _supervise(running, options.hang_timeout_s, answer, tick, player.wait_s if player else None)
    finally:
        with cleanup():
            alive = [p.pid for _, p, _ in running if p.poll() is None]
            procs.terminate(alive, grace_s=2.0)
            for _, p, _ in running:
                p.wait()
            pids = {p.pid for _, p, _ in running}
            backend.state.processes = [r for r in backend.state.processes if r.pid not in pids]
            backend.state.save()


def watch_groups(backend: Backend) -> list[WatchGroup]:
    """The run's processes besides the workers whose CPU every iteration records (testbed/run/breakdown.py):
    the delay daemons with their supervisors, other daemons the testbed started, and this process alone."""
    by_role: dict[str, list[int]] = {}
    for record in backend.state.processes:
        if record.role != "worker" and record.alive():
            by_role.setdefault(ROLE_GROUPS.get(record.role, record.role), []).append(record.pid)
    return [*(WatchGroup(name, pids) for name, pids in sorted(by_role.items())),
            WatchGroup("runner", [os.getpid()], children=False)]


ROLE_GROUPS = {role: "delay daemons" for role in daemon_roles()}
"""How a recorded process role is named in the CPU ledger."""


def free_port(backend: Backend, node: str, address: str) -> int:
    """A TCP port free on `address` inside the node's namespace for the rendezvous: back-to-back runs must not
    wait for the previous run's store socket to leave TIME_WAIT (a fixed port failed with EADDRINUSE)."""
    with nsfs.entered(backend.netns_path(node)), socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((address, 0))
        return int(sock.getsockname()[1])


def _supervise(running: list[tuple[int, subprocess.Popen[bytes], Path]], hang_timeout_s: float,
               progress: Callable[[dict[str, Any]], None] | None, tick: Callable[[], None] | None = None,
               wait: Callable[[], float] | None = None) -> None:
    sel = selectors.DefaultSelector()
    for rank, proc, _ in running:
        assert proc.stdout is not None
        os.set_blocking(proc.stdout.fileno(), False)
        sel.register(proc.stdout, selectors.EVENT_READ, rank)
    buffers = {rank: b"" for rank, _, _ in running}
    last_progress = time.monotonic()
    try:
        while True:
            raise_if_pending()
            if tick:
                tick()
            for key, _ in sel.select(timeout=0.2 if wait is None else min(0.2, wait())):
                chunk = key.fileobj.read()  # type: ignore[union-attr]
                if chunk:
                    buffers[key.data] += chunk
                    *lines, buffers[key.data] = buffers[key.data].split(b"\n")
                    for line in lines:
                        last_progress = time.monotonic()
                        if progress and line.strip():
                            with contextlib.suppress(json.JSONDecodeError):
                                progress(json.loads(line))
                else:
                    sel.unregister(key.fileobj)
            for rank, proc, log in running:
                code = proc.poll()
                if code not in (None, 0):
                    raise RunError(f"worker {rank} exited with {code}; the run was stopped. End of {log}:\n"
                                   + _tail(log))
            if all(proc.poll() == 0 for _, proc, _ in running):
                return
            if time.monotonic() - last_progress > hang_timeout_s:
                stuck = [str(rank) for rank, proc, _ in running if proc.poll() is None]
                raise RunError(f"no progress for {hang_timeout_s:.0f} s (workers {', '.join(stuck)} still running); "
                               f"the run was stopped. End of {running[0][2]}:\n" + _tail(running[0][2]))
    finally:
        sel.close()


def _tail(path: Path, chars: int = 1500) -> str:
    try:
        return path.read_text(errors="replace")[-chars:].strip() or "(empty log)"
    except FileNotFoundError:
        return "(no log)"


def planned_drops(shaper: Shaper | None) -> dict[tuple[str, str], int]:
    """Per (link, direction): the drops so far that the plan does not allow (DirectionDrops.beyond_plan)."""
    pairs = shaper.drops_with_planned_loss() if shaper else []
    return {(d.link, d.direction): d.beyond_plan(loss) for d, loss in pairs}


def run_schedules(backend: Backend, options: RunOptions, results_root: Path, *,
                  run_id: str | None = None, log: Callable[[str], None] = print) -> tuple[Path, RunSummary]:
    """Every schedule of `options` on one running testbed, interleaved iteration by iteration in one launch of
    the workers (so that the host's slow and fast stretches fall on every schedule alike); writes
    results/<run-id>/ and returns it. A run the host disturbed (testbed.util.hostload) runs again, at most
    MAX_REPEATS times; the least disturbed is kept at <schedule>/ (the other set aside beside it) and the summary
    says how many ran again."""
    if restore_links(backend):
        log("restored the OTN links a dilated run left slowed down (it was stopped before it could)")
    plan = backend.state.plan
    if plan.background:
        require_iperf3()
    hosts = options.hosts(plan)
    options.check_stages(len(hosts))
    cpus = os.cpu_count() or 1
    dilation = plan_dilation(options.dilation, len(hosts), cpus, timed=options.compute.timed)
    transport = choose_transport(options.transport, plan, backend.state.rdma, hosts, options.schedules)
    log(f"transport {transport.name}: {transport.reason}")
    try:
        table = run_table(options.compute, stage_links(plan, hosts), plan.topology, options.shape)
    except (ComputeError, TopologyError) as exc:
        raise RunError(f"--compute {options.compute.text}: {exc}") from None
    shipped = _user_schedules(options, hosts, plan, table)
    if options.events:
        if options.sweep is not None:
            raise RunError("events and a link sweep cannot share a run (the sweep sets the link between iterations)")
        run_events.validate(options.events, backend, options.schedules, options.iterations, options.hang_timeout_s)
    run_id = run_id or time.strftime("%Y%m%d-%H%M%S") + f"-{'-'.join(options.schedules)}"
    run_dir = results_root / run_id
    run_dir.mkdir(parents=True, exist_ok=True)
    shipped_path = None
    if shipped:
        shipped_path = (run_dir / "user-schedules.json").resolve()
        shipped_path.write_text(json.dumps(shipped, indent=1))
        log(f"user schedules {', '.join(shipped)}: checked (no deadlock in the dry run"
            + (", within the memory budget" if options.memory_budget else "") + "); their action lists are in "
            + str(shipped_path))
    players: dict[Path, run_events.EventPlayer] = {}
    if table is not None:
        table.save(run_dir / "compute.json")
    log(describe_compute(options.compute, table))
    shaper = shaper_for(backend)
    drops_before = planned_drops(shaper)
    edges_before = shaper.edge_counters() if shaper else {}
    restarts_before = _restarts(shaper)
    delay_checks = check_delays(backend, probes=10)
    daemons = sum(1 for p in backend.state.processes if p.role in daemon_roles())
    oversubscribed = len(hosts) + daemons > cpus and not options.compute.timed   # timed spans do not stretch
    if dilation.on:
        log(f"time dilation k = {dilation.factor:.3f} ({dilation.reason}); times below are undilated")
    elif options.compute.timed and len(hosts) + daemons > cpus:
        log(f"{len(hosts)} workers + {daemons} delay daemons on {cpus} cores: compute is time, so it does not stretch; "
            "the transport's and the delay lines' share of the cores shows in the links' timing and the model's error")
    elif oversubscribed:
        log(f"WARNING: {len(hosts)} workers + {daemons} delay daemons on {cpus} cores: compute spans stretch when "
            "more run than there are cores, so bubble ratios are under-stated (recorded in summary.json)")
    tokens = options.microbatches * (table.tokens_per_microbatch if table is not None and table.tokens_per_microbatch
                                     else options.microbatch_size * options.model.block_size)
    for load in plan.background:
        log(f"background traffic, started before the workers and stopped after them: {load.describe()}")
    log(f"running {', '.join(options.schedules)}" + (" interleaved" if len(options.schedules) > 1 else "")
        + f": {len(hosts)} stages on {', '.join(h.name for h in hosts)}")

    def progress(event: dict[str, Any]) -> None:
        if event.get("event") == "iteration" and event.get("rank") == len(hosts) - 1:
            loss = event.get("loss")
            log(f"  {event.get('schedule', '')} iteration {event['iteration']}: {event['seconds']:.3f} s"
                + (" (dilated)" if dilation.on else "") + (f", loss {loss:.3f}" if loss is not None else ""))

    links_by = {entry: stage_links(plan, hosts) for entry in entries(options.schedules, options.sweep)}
    if options.sweep is not None:
        for point in options.sweep.points:
            for schedule in point.schedules or options.schedules:
                links_by[f"{point.label}/{schedule}"] = point_links(backend, options.sweep, point, hosts)
    def attempt_once(attempt: int) -> Attempt[tuple[dict[str, list[RankTrace]], dict[str, ScheduleSummary]]]:
        monitor = LoadMonitor(daemons_cpu(shaper, tuple(sorted({d.dst_node for d in plan.directions}))))
        where = attempt_folder(run_dir, attempt)
        holds_before = _hold_counters(shaper)
        extra: dict[str, Any] = {"shipped": shipped_path} if shipped_path else {}
        if options.events:
            players[where] = extra["player"] = run_events.EventPlayer(
                backend, list(options.events), options.schedules, options.iterations, dilation.factor, log)
        ranks_by = run_group(backend, options.schedules, options, hosts, where, progress, monitor, transport, dilation,
                             table, **extra)
        load = monitor.finish()
        timing = link_timing(plan, holds_before, _hold_counters(shaper),
                             backend.state.shaper.release_error_s if backend.state.shaper else {}, dilation.factor)
        measured_by = {entry: measure(entry.rsplit("/", 1)[-1], ranks, tokens, links_by[entry], transport.kind.receiver_driven)
                       for entry, ranks in ranks_by.items()}
        for entry, measured in measured_by.items():
            measured.link_setting = entry.rsplit("/", 1)[0] if "/" in entry else None
            measured.host_load, measured.link_timing = load, timing
        load.compute_slowdown = compute_slowdown(measured_by.values())
        load.judge_drift(host_drift([r for ranks in ranks_by.values() for r in ranks]))
        return Attempt((ranks_by, measured_by), load, timing, where,
                       [why for measured in measured_by.values() for why in measured.late_spans()])

    best, repeats = best_attempt(attempt_once, log, cpu_matters=not options.compute.timed)
    traces, measured_by = best.value
    if best.where != run_dir and (best.where / "compute.json").exists():
        (best.where / "compute.json").replace(run_dir / "compute.json")    # the kept launch's own profile
    summaries = []
    for entry in entries(options.schedules, options.sweep):
        measured = measured_by[entry]
        measured.repeated = repeats
        keep_attempt(run_dir / entry, best.where / entry)
        check_budget(entry, measured)
        summaries.append(measured)
    metrics.pool_references(summaries)
    drops_after = planned_drops(shaper)
    edges_after = shaper.edge_counters() if shaper else {}
    links = []
    for d in plan.directions:
        check = next((c for c in delay_checks if c.kind == "one-way" and c.key == d.label), None)
        after = drops_after.get((d.link, d.label))
        links.append(LinkRecord(
            link=d.link, src_dc=d.src_dc, dst_dc=d.dst_dc, configured_delay_s=d.delay_s, configured_rate_bps=d.rate_bps,
            measured_one_way=check.measured if check else None, delay_ok=check.ok if check else None,
            drops_during_run=None if after is None else after - drops_before.get((d.link, d.label), 0),
            lossless=d.lossless, measured_one_way_s=check.value if check else None,
            edge=edge_during(d, edges_before, edges_after)))
    summary = RunSummary(
        run_id=run_id, topology=plan.topology, testbed=plan.testbed,
        stages=[StagePlacement(i, h.name, h.dc) for i, h in enumerate(hosts)], stage_links=stage_links(plan, hosts),
        links=links, lossless_ok=all(not lk.lossless or not lk.drops_during_run for lk in links),
        shaper=backend.state.shaper_name, backend=backend.name,
        switch=backend.state.mininet.switch if backend.state.mininet else None,
        shaper_calibration_s=dict(backend.state.shaper.calibration_s) if backend.state.shaper else {},
        transport=describe_transport(transport, traces), transport_reason=transport.reason,
        transport_detail={s: [r.transport_detail for r in ranks] for s, ranks in traces.items() if transport.devices},
        kernel=platform.release(), cpus=cpus, oversubscribed=oversubscribed and not dilation.on, dilation=dilation,
        workers=len(hosts), delay_daemons=daemons, options=options.to_json(), schedules=summaries,
        daemon_restarts=_restarts(shaper) - restarts_before, **read_traffic(best.where), **compute_fields(options, traces))
    write_run(run_dir, summary, traces, plan, log)
    if best.where in players:
        origin = min(it.start for ranks in traces.values() for r in ranks for it in r.iterations)
        run_events.write_records(run_dir, players[best.where].records, origin, dilation.factor)
    return run_dir, summary


def _user_schedules(options: RunOptions, hosts: list[Node], plan: Plan,
                    table: CostTable | None) -> dict[str, dict[str, Any]]:
    """The run's user schedules (workloads.schedule.register) computed for its stages and checked before anything
    runs (testbed/run/userschedules.py): refused with the reason when one deadlocks or breaks the budget."""
    names = user_names(options.schedules)
    if not names:
        return {}
    links = stage_links(plan, hosts)

    def memory() -> tuple[list[int], int]:
        if table is not None:
            return [st.stash_bytes for st in table.stages], table.activation_bytes
        return measured_memory(options.model, len(hosts), options.split, options.microbatch_size,
                               options.microbatches, options.seed)
    return prepare(names, len(hosts), options.microbatches, link_delay_s=[lk.delay_s for lk in links],
                   link_rate_bps=[lk.rate_bps for lk in links], budget=options.memory_budget,
                   unbudgeted=options.unbudgeted, memory=memory)


def describe_compute(mode: ComputeMode, table: CostTable | None) -> str:
    """One line on where the run's compute comes from, with the F+B per micro-batch it stands for."""
    if mode.kind == REAL:
        return "compute: real (the model's arithmetic on this CPU)"
    if table is None:
        return "compute: replay of a table profiled from the real model on this host at the start (compute.json)"
    scale = sorted({round(table.scale(s), 3) for s in range(len(table.stages) - 1)})
    return (f"compute: {mode.text}: {table.description}; F+B {table.host_fb_s * 1e3:.1f} ms per micro-batch per stage "
            f"(median stage); no arithmetic runs" + (f"; messages of {table.activation_bytes} B carried at 1:"
                                                     + "/".join(f"{x:g}" for x in scale) + " on the emulated links"
                                                     if any(x != 1 for x in scale) else ""))


def compute_fields(options: RunOptions, traces: dict[str, list[RankTrace]]) -> dict[str, Any]:
    """What a run's summary says of its compute (one machine and several alike)."""
    table = table_of(traces)
    return {"compute": options.compute.text, "compute_detail": table.description if table else "",
            "arithmetic": not options.compute.timed, "fb_per_microbatch_s": fb_per_microbatch(traces),
            "rate_scale": list(table.rate_scale) if table else []}


def table_of(traces: dict[str, list[RankTrace]]) -> CostTable | None:
    """The cost table the workers replayed (the one they profiled, for `replay`)."""
    return next((r.config.cost_table for ranks in traces.values() for r in ranks if r.config.cost_table), None)


def fb_per_microbatch(traces: dict[str, list[RankTrace]]) -> float | None:
    """F+B of one micro-batch on the median stage: the replayed table's, or the real compute's reference pass
    over its micro-batches (the first schedule with one)."""
    import statistics

    table = table_of(traces)
    if table is not None:
        return table.host_fb_s
    for ranks in traces.values():
        if all(r.reference_compute_s for r in ranks):
            return statistics.median(statistics.mean(r.reference_compute_s) / r.config.microbatches for r in ranks)
    return None


def check_budget(entry: str, measured: ScheduleSummary) -> None:
    """The budget checked again on what the workers reported (they stop a schedule that would exceed it; a
    peak over it here means they did not): one machine and several alike."""
    if not measured.budget_ok:
        raise RunError(f"{entry}: in-flight peak {measured.peak_inflight_activation_bytes_per_stage} B over its "
                       f"budget {measured.budget_bytes_per_stage} B (the workers should have stopped it)")


def write_run(run_dir: Path, summary: RunSummary, traces: dict[str, list[RankTrace]], plan: Plan,
              log: Callable[[str], None]) -> None:
    """A run's files (summary.json, trace.json, plan.json) and the warning when a lossless link lost packets;
    one machine and several (playbooks/cycle.py) alike."""
    (run_dir / "summary.json").write_text(json.dumps(summary.to_json(), indent=1))
    (run_dir / "trace.json").write_text(json.dumps(metrics.chrome_trace(traces)))
    (run_dir / "plan.json").write_text(json.dumps(plan.to_json(), indent=1))
    if not summary.lossless_ok:
        lost = sum(lk.drops_during_run or 0 for lk in summary.links if lk.lossless)
        log(f"WARNING: {lost} packet(s) lost on lossless links during the run"
            + (f" ({summary.daemon_restarts} delay daemon restart(s))" if summary.daemon_restarts else "")
            + ": this run is not lossless (summary.json: lossless_ok false, links[].drops_during_run)")


def describe_transport(choice: TransportChoice, traces: dict[str, list[RankTrace]]) -> str:
    """`gloo-tcp`, or `rdma-rc (SoftRoCE, QPs per link 1/2, RDMA MTU 4096)` from what the ranks set up."""
    if choice.kind is not RDMA:
        return choice.kind.label
    qps, mtus = set(), set()
    for ranks in traces.values():
        for r in ranks:
            for peer in r.transport_detail.get("peers", {}).values():
                qps.add(peer["qps"])
                mtus.add(peer["rdma_mtu"])
    return (f"{RDMA.label} (SoftRoCE, QPs per link {'/'.join(map(str, sorted(qps)))}, RDMA MTU "
            f"{'/'.join(map(str, sorted(mtus)))})")


def keep_attempt(canonical: Path, kept: Path) -> None:
    """The kept attempt's traces at <schedule>/ (what plots and the model read), the other set aside beside it."""
    if kept == canonical:
        return
    canonical.rename(canonical.with_name(canonical.name + "-set-aside"))
    kept.rename(canonical)


def measure(schedule: str, ranks: list[RankTrace], tokens_per_step: int, links: list[StageLink],
            receiver_driven: bool = True) -> ScheduleSummary:
    """One schedule's figures from its rank traces (testbed/run/metrics.py) and where its steps went
    (testbed/run/breakdown.py): what one machine and several both report."""
    measured = metrics.summarize(schedule, ranks, tokens_per_step)
    measured.breakdown = breakdown(ranks, [lk.delay_s for lk in links], [lk.rate_bps for lk in links], receiver_driven)
    return measured


def compute_slowdown(summaries: Any) -> float | None:
    """How much more CPU the compute spans ran than the run's reference passes did (CPU against CPU: not the
    sharing of cores), largest over schedules and stages: the run's own cost, since the host's drift over the
    run is measured apart (host_drift)."""
    slowdowns = [st.compute_slowdown for s in summaries if s.breakdown for st in s.breakdown.stages
                 if st.compute_slowdown is not None]
    return max(slowdowns) if slowdowns else None


def host_drift(ranks: list[RankTrace]) -> float | None:
    """The host's own change of speed during a run: each rank's reference pass after its iterations against the
    one before them (CPU time, the same pass with nothing else of the run going on), less 1, the largest in size
    over ranks; None where a rank has not both (compute as time: the table's, which cannot move)."""
    moves = [r.reference_cpu_s[-1] / r.reference_cpu_s[0] - 1 for r in ranks
             if len(r.reference_cpu_s) >= 2 and r.reference_cpu_s[0] > 0 and not r.config.timed]
    return max(moves, key=abs) if moves else None


def _hold_counters(shaper: Shaper | None) -> dict[str, tuple[int, float]]:
    return shaper.hold_counters() if shaper is not None else {}


def link_timing(plan: Plan, before: dict[str, tuple[int, float]], after: dict[str, tuple[int, float]],
                 calibrated: dict[str, float], dilation: float = 1.0, floor_s: float = 0.1e-3) -> list[LinkTiming]:
    """How far each delay-line direction's delay was off during one run: its releases' mean error over the
    run less their mean error while it was calibrated (which the hold already absorbs), in undilated time
    (`plan`: the undilated directions)."""
    out = []
    for d in plan.directions:
        if d.label not in after:
            continue
        packets = after[d.label][0] - before.get(d.label, (0, 0.0))[0]
        if packets <= 0:
            continue
        error = ((after[d.label][1] - before.get(d.label, (0, 0.0))[1]) / packets - calibrated.get(d.label, 0.0)) / dilation
        out.append(LinkTiming(direction=d.label, configured_delay_s=d.delay_s, packets=packets, mean_error_s=error,
                              tolerance_s=delay_tolerance(d.delay_s, floor_s),
                              baseline_error_s=calibrated.get(d.label, 0.0) / dilation))
    return out


def _restarts(shaper: Shaper | None) -> int:
    return sum(shaper.restarts().values()) if shaper is not None else 0
