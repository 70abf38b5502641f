"""testbed: emulate datacenters and the OTN links between them, and measure pipeline training across them.

`testbed COMMAND --help` shows a command's options, their defaults and an example. The commands, from the
table `COMMANDS` at the end of this module (which also builds the parser and the root check):
"""
# This module only parses arguments and calls into the layers; the modules that own the data render it.
# A command is one row of COMMANDS: its name, what it does, its arguments, an example, whether it needs root,
# the checks of its arguments (run before the root check and before anything is touched) and its handler.

from __future__ import annotations

import argparse
import contextlib
import difflib
import json
import os
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from testbed.backends.base import BackendError
from testbed.backends.mininet_net import SWITCH_KINDS
from testbed.backends.registry import BACKENDS
from testbed.deploy import lifecycle
from testbed.errors import TestbedError
from testbed.plan import build_plan
from testbed.plan.render import render_plan
from testbed.rdma.support import ROUTES, rxe_in_namespaces
from testbed.run.dilation import DEFAULT_DILATION as DILATION
from testbed.run.dilation import plan_dilation
from testbed.run.transport import AUTO, CHOICES
from testbed.shaping.registry import CHOICES as SHAPER_CHOICES
from testbed.state import store as statefile
from testbed.topology import load_topology
from testbed.util import units
from testbed.util.interrupts import Interrupted, unwinding
from testbed.util.paths import DEFAULT_TOPOLOGY, resolve_topology
from workloads.layouts import TORCH_SCHEDULES
from workloads.records import RDMA, TRANSPORTS
from workloads.schedule import SCHEDULES

if TYPE_CHECKING:
    from playbooks.cycle import Cycle
    from testbed.run.runner import RunOptions


class UsageError(TestbedError):
    """A command's arguments cannot be used as given; the message names the option and how to write it."""


def cmd_plan(args: argparse.Namespace) -> int:
    if args.tokens is not None:
        from testbed.run.shapeplan import plan_topology_shapes, render_shape_plans

        tokens = _quantity(units.parse_count, args.tokens, "--tokens")
        shapes = plan_topology_shapes(str(resolve_topology(args.topology)), args.compute, tokens, stages=args.stages)
        print(json.dumps(shapes.to_json(), indent=1) if args.json else render_shape_plans(shapes))
        return 0
    plan = build_plan(load_topology(resolve_topology(args.topology)), args.name)
    if args.json:
        print(json.dumps(plan.to_json(), indent=1))
    else:
        print(render_plan(plan))
    return 0


def cmd_up(args: argparse.Namespace) -> int:
    result = lifecycle.up(resolve_topology(args.topology), args.name, args.backend, args.shaper, args.switch,
                          rdma=args.rdma)
    plan = result.plan
    print(f"testbed {plan.testbed} up: {len(plan.nodes)} namespaces ({len(plan.hosts)} hosts), "
          f"{len(plan.veths)} veth pairs, in {result.seconds:.2f} s ({args.backend} backend); "
          f"shaper {result.shaper} in {result.shaped_seconds:.2f} s")
    backend = lifecycle.open_backend(plan.testbed)
    mininet = backend.state.mininet
    if mininet:
        print(f"Mininet {mininet.version}: {mininet.switch} switches "
              f"{', '.join(sw.name for sw in mininet.switches)} ({mininet.switch_reason})")
    if backend.state.rdma:
        print("SoftRoCE: " + ", ".join(f"{d.node} {d.name} on {d.netdev} (GID {d.gid_index}, RDMA MTU {d.active_mtu})"
                                       for d in backend.state.rdma.devices))
    if result.shaper == "none":
        print("WARNING: --shaper none: OTN links carry NO delay and NO rate limit", file=sys.stderr)
    shaper = backend.state.shaper
    for warning in shaper.warnings if shaper else []:
        print(f"WARNING: {warning}", file=sys.stderr)
    if shaper and shaper.calibration_s:
        print("calibrated emulator path latency subtracted from each hold: "
              + ", ".join(f"{k} {v * 1e6:.0f} us" for k, v in shaper.calibration_s.items()))
    level = "skip" if args.no_verify else args.verify
    if level != "skip":
        from testbed.check.verify import verify_testbed

        report = verify_testbed(backend, level=level)
        bad = report.failures()
        print(f"verify ({level}): {len(report.checks) - len(bad)}/{len(report.checks)} checks passed")
        print(report.render(show_all=False))
        if bad:
            print(f"testbed: verification failed; the testbed stays up for inspection "
                  f"('testbed down {plan.testbed}' removes it)", file=sys.stderr)
            return 1
    print(f"next: testbed status {plan.testbed} | testbed exec {plan.hosts[0].name} -- ip addr | "
          f"testbed down {plan.testbed}")
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    names = [s.name for s in statefile.list_states()] if args.all else [lifecycle.resolve_name(args.name)]
    if args.all and not names:
        print("no testbed is up")
    for name in names:
        seconds = lifecycle.down(name)
        print(f"testbed {name} down in {seconds:.2f} s")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    from testbed.check.status import describe

    states = [s for s in statefile.list_states() if args.name in (None, s.name)]
    if args.name and not states:
        raise BackendError(f"no testbed named {args.name!r} is up")
    records = [describe(s) for s in states]
    if args.json:
        print(json.dumps([r.to_json() for r in records] if not args.name else records[0].to_json(), indent=1))
        return 0
    if not records:
        print("no testbed is up")
    for record in records:
        print(record.render())
    return 0


def cmd_exec(args: argparse.Namespace) -> int:
    backend = lifecycle.find_node(args.node, args.name)
    try:
        return backend.exec(args.node, args.command).returncode
    except FileNotFoundError:
        raise BackendError(f"command not found: {args.command[0]}") from None


def cmd_verify(args: argparse.Namespace) -> int:
    from testbed.check.verify import verify_testbed

    backend = lifecycle.open_backend(args.name)
    report = verify_testbed(backend, level="quick" if args.quick else "full")
    if args.json:
        print(json.dumps(report.to_json(), indent=1))
    else:
        print(f"verify {report.testbed} (shaper {backend.state.shaper_name})")
        print(report.render(args.all))
    if not report.ok:
        print(f"testbed: {len(report.failures())} check(s) failed", file=sys.stderr)
        return 1
    return 0


def cmd_link(args: argparse.Namespace) -> int:
    from testbed.deploy.linkset import set_link

    backend = lifecycle.open_backend(args.name)
    for new in set_link(backend, args.a, args.b, from_dc=args.from_dc, **args.values):
        print(f"{new.link} {new.label}: delay {units.format_time(new.delay_s)}, "
              f"rate {units.format_rate(new.rate_bps)}, jitter {units.format_time(new.jitter_s)}, loss {new.loss:g}"
              + (f", edge {new.edge.mode} at {units.format_rate(new.edge.drain_rate_bps)}" if new.edge else ""))
    print(f"check it: testbed verify {backend.state.name}")
    return 0


def cmd_vm(args: argparse.Namespace) -> int:
    from testbed.backends.vm import choose_accel, find_setup, run_in_vm

    setup = find_setup()
    if args.check:
        print(f"stock-kernel tier available: {setup.kernel} via {setup.vng}")
        return 0
    command = " ".join(args.command) if args.command else "uname -r"
    accel = choose_accel(args.kvm, setup)
    print(f"booting {setup.kernel.name} under QEMU with {accel.name} ({accel.reason}): {command}", flush=True)
    return run_in_vm(command, Path(args.out).resolve(), kvm=accel.kvm, memory=args.memory, cpus=args.cpus,
                     timeout_s=args.timeout)


def cmd_run(args: argparse.Namespace) -> int:
    from testbed.run.placement import place_stages
    from testbed.run.runner import RunError, run_schedules

    options = args.options
    hosts = lifecycle.hosts_of(args.target)
    options.check_stages(len(place_stages(hosts, options.stages, options.placement)))
    rdma = args.rdma
    if options.transport == RDMA.key:
        rxe_support = rxe_in_namespaces()
        if not rxe_support.ok:
            raise RunError(f"--transport rdma cannot run: {rxe_support.reason}. Routes: {ROUTES}")
        rdma = rdma or "softroce"
    with lifecycle.testbed_for(args.target, name=args.name, backend=args.backend, shaper=args.shaper,
                               switch=args.switch, rdma=rdma) as backend:
        run_dir, summary = run_schedules(backend, options, Path(args.results))
    print(summary.render())
    print(f"\nresults: {run_dir} (summary.json, trace.json for chrome://tracing or ui.perfetto.dev)")
    if not summary.lossless_ok:
        print("testbed: packets were lost on a lossless link during the run (see summary.json)", file=sys.stderr)
        return 1
    return 0


def cmd_experiment(args: argparse.Namespace) -> int:
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from testbed.experiment.report import terminal_summary
    from testbed.experiment.sweep import Experiment

    if RDMA.key in args.spec.transports and not args.resume:
        rxe_in_namespaces().require()
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total} runs"),
                  TimeElapsedColumn()) as progress:
        holder: dict[str, int] = {}
        advance = lambda: progress.advance(holder["task"])  # noqa: E731
        if args.resume:
            experiment = Experiment.resume(Path(args.resume), log=progress.console.print, advance=advance)
        else:
            experiment = Experiment(args.spec, log=progress.console.print, advance=advance)
        holder["task"] = progress.add_task("GeoPipe experiment", total=experiment.total_runs())
        exp_dir = experiment.run()
    print(terminal_summary(exp_dir))
    print(f"\nresults: {exp_dir} (report.md, report.html, *.png, summary.json, points.csv)")
    return 0


def cmd_paper(args: argparse.Namespace) -> int:
    from testbed.experiment.paper import run_paper

    out = run_paper(args.spec)
    print((out / "report.md").read_text())
    print(f"results: {out} (report.md, paper.png, summary.json, points.csv)")
    wrong = [r["schedule"] for r in json.loads((out / "summary.json").read_text())["real_beside"] if not r["ok"]]
    if wrong:
        print(f"testbed: the real-arithmetic run of {', '.join(wrong)} did not train as one process does (see "
              "report.md)", file=sys.stderr)
        return 1
    return 0


def args_paper(p: argparse.ArgumentParser) -> None:
    p.add_argument("topology", nargs="?", default="3dc-8stages", help="file or shipped name (topologies/)")
    p.add_argument("--compute", default="llama2-13b-910b-tp8", help="the deployment profile (profiles/)")
    p.add_argument("--tokens", default="256Ki", help="tokens per step, the same for every schedule and shape")
    p.add_argument("--spines", default="100,400", help="spine rates in Gb/s, comma-separated")
    p.add_argument("--distances", default="0,1000", help="km per OTN span, comma-separated")
    p.add_argument("--schedule", default="1f1b,1f1b-prefetch,geopipe",
                   help="comma-separated, each at the shape the planner chose for it")
    p.add_argument("--iterations", type=int, default=2, help="timed iterations per run (after one warm-up)")
    p.add_argument("--dilation", default="auto", help="slow motion: off, auto (workers / cores) or a factor")
    p.add_argument("--results", default="results", help="where the experiment's folder goes")
    p.add_argument("--no-real", action="store_true",
                   help="leave out the short real-arithmetic run on the same links after the figure set")


def check_paper(args: argparse.Namespace) -> None:
    from testbed.experiment.paper import PaperSpec
    from testbed.experiment.real_beside import RealBesideSpec

    args.spec = PaperSpec(topology=args.topology, profile=args.compute,
                          tokens=_quantity(units.parse_count, args.tokens, "--tokens"),
                          spines_gbps=_numbers(args.spines, "--spines"), distances_km=_numbers(args.distances,
                                                                                               "--distances"),
                          iterations=args.iterations, dilation=_dilation(args.dilation), results=args.results,
                          schedules=tuple(_planned_schedules(args.schedule)),
                          real_beside=None if args.no_real else RealBesideSpec())


def _planned_schedules(text: str) -> list[str]:
    """`testbed paper --schedule`: those the shape planner knows."""
    from workloads.shapes import PLANNED

    chosen = [x.strip() for x in text.split(",") if x.strip()]
    bad = [x for x in chosen if x not in PLANNED]
    if bad or not chosen:
        raise UsageError(f"--schedule: {bad[0] if bad else '(none)'!r} is not one the shape planner plans",
                         hint=f"choose from {', '.join(PLANNED)}")
    return chosen


def args_congestion(p: argparse.ArgumentParser) -> None:
    p.add_argument("topology", nargs="?", default="2dc-congestion",
                   help="file or shipped name: a first link with 'lossless: pfc' and 'background:' traffic")
    p.add_argument("--variants", default="pfc,drop,queue", help="the edges to compare, comma-separated")
    p.add_argument("--cut", type=float, default=0.5, help="the spine port's rate after the cut, as a fraction")
    p.add_argument("--cut-iteration", type=int, default=3, help="the timed iteration the cut starts")
    p.add_argument("--iterations", type=int, default=6, help="timed iterations per run (after one warm-up)")
    p.add_argument("--microbatches", type=int, default=8, help="micro-batches per iteration")
    p.add_argument("--schedule", default="1f1b", help="the pipeline schedule")
    p.add_argument("--compute", default="gpt-7b-h100", help="compute as time: a deployment profile (profiles/)")
    p.add_argument("--results", default="results", help="where the experiment's folder goes")


def check_congestion(args: argparse.Namespace) -> None:
    from testbed.experiment.congestion import CongestionSpec

    args.spec = CongestionSpec(topology=args.topology, variants=tuple(v.strip() for v in args.variants.split(",")
                                                                       if v.strip()),
                               cut=args.cut, cut_iteration=args.cut_iteration, iterations=args.iterations,
                               microbatches=args.microbatches, schedule=args.schedule, compute=args.compute,
                               results=args.results)
    args.spec.check()                   # a CongestionError names what would run


def cmd_congestion(args: argparse.Namespace) -> int:
    from testbed.experiment.congestion import run_congestion

    out = run_congestion(args.spec)     # the API's run_congestion less its signal guard: main() reports a signal
    print((out / "report.md").read_text())
    print(f"results: {out} (report.md, report.html, congestion.png, congestion.json, one run folder per variant)")
    return 0


def cmd_cli(args: argparse.Namespace) -> int:
    from testbed.backends.mininet_cli import run_cli

    backend = lifecycle.open_backend(args.name)
    if args.script and not os.path.exists(args.script):
        raise BackendError(f"no CLI script at {args.script}")
    run_cli(backend, script=args.script)
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from testbed.experiment.report import rerender

    path = Path(args.run)
    if not (path / "summary.json").exists():
        candidates = sorted(Path(args.results).glob(f"*{args.run}*/summary.json"))
        if not candidates:
            raise BackendError(f"no experiment {args.run!r}: give a folder with summary.json (e.g. results/<id>)")
        path = candidates[-1].parent
    if "points" not in json.loads((path / "summary.json").read_text()):
        raise BackendError(f"{path} is a single run, not an experiment; its summary.json is the report")
    print(rerender(path))
    print(f"\nre-rendered: {path}/report.md, report.html, *.png")
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    from testbed.check.doctor import run_doctor

    report = run_doctor()
    if args.json:
        print(json.dumps(report.to_json(), indent=1))
        return 0
    print(report.render())
    return 0 if report.decision.backend != "none" else 1


REMOTE_ACTIONS = {
    "preflight": "SSH, root, kernel, Python/torch, clock offset; then provision and the doctor (shaper, rxe)",
    "up": "preflight, provision, shape every machine's NIC, verify",
    "verify": "the per-direction checks between the machines (round trip, goodput)",
    "run": "train across the machines (shaping must be up), collect into results/<run-id>/",
    "down": "teardown: stop this testbed's workers, remove its shaping and run folders on every machine",
    "cycle": "preflight -> provision -> shape -> verify -> run -> collect -> teardown",
}


REMOTE_STEPS = {
    "preflight": ("preflight", "provision"),
    "up": ("preflight", "provision", "shape", "verify"),
    "verify": ("preflight", "provision", "verify"),
    "run": ("preflight", "provision", "attach", "run"),
    "down": ("preflight", "provision", "teardown"),
}
"""The cycle's steps each `testbed remote` action runs, in order (`cycle` runs playbooks.cycle.full_cycle)."""


def _remote_step(cycle: Cycle, step: str, args: argparse.Namespace) -> int:
    """One step of a `testbed remote` action; non-zero stops the action with that exit code."""
    if step == "verify":
        failed = [c for c in cycle.verify() if not c.ok]
        if failed:
            print(f"testbed: {len(failed)} check(s) failed", file=sys.stderr)
        return 1 if failed else 0
    if step == "run":
        run_dir, summary = cycle.run(args.options)
        print(summary.render())
        print(f"\nresults: {run_dir}")
        return 0
    if step == "teardown":
        return 1 if cycle.teardown() else 0
    getattr(cycle, step)()                   # preflight, provision, shape, attach
    return 0


def cmd_remote(args: argparse.Namespace) -> int:
    from playbooks.cycle import Cycle, full_cycle
    from testbed.remote.inventory import load_inventory

    inventory = load_inventory(args.inventory)
    name = args.name or Path(args.inventory).stem
    if args.action == "cycle":
        run_dir, summary, cycle = full_cycle(inventory, args.options, testbed=name,
                                             results_root=Path(args.results), verify_required=args.verify == "required")
        print(summary.render())
        print("\ncycle: " + ", ".join(f"{k} {v:.1f} s" for k, v in cycle.step_s.items()))
        print(f"results: {run_dir}")
        return 0
    cycle = Cycle(inventory, name, Path(args.results))
    try:
        for step in REMOTE_STEPS[args.action]:
            code = _remote_step(cycle, step, args)
            if code:
                return code
    finally:
        cycle.close()
    return 0


# ---- The arguments' checks: run before the root check and before anything is brought up or read. ----------------

KNOWN_SCHEDULES = (*SCHEDULES, *TORCH_SCHEDULES)
"""Every schedule a command line can name: ours (workloads/schedule.py) and PyTorch's (workloads/layouts.py)."""

_BARE_NUMBER = re.compile(r"\s*[-+]?[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?\s*")


def _did_you_mean(given: str, known: Sequence[str]) -> str:
    close = difflib.get_close_matches(given, known, n=1)
    return f"did you mean {close[0]!r}? " if close else ""


def _schedules(text: str, flag: str, *, empty_ok: bool = False) -> list[str]:
    """A comma-separated list of schedule names, each one known (the nearest named where one is not)."""
    names = [s.strip() for s in text.split(",") if s.strip()]
    for name in names or ([] if empty_ok else [""]):
        if name not in KNOWN_SCHEDULES:
            raise UsageError(f"{flag}: unknown schedule {name or '(none)'!r}",
                             hint=f"{_did_you_mean(name, KNOWN_SCHEDULES)}choose from {', '.join(KNOWN_SCHEDULES)}")
    return names


def _duration(text: str, flag: str) -> float:
    """A duration with its unit: a bare number is refused, since it reads as ms here and as us in tc(8)."""
    if _BARE_NUMBER.fullmatch(text) and float(text) != 0:
        raise units.UnitError(f"{flag} {text.strip()}: a bare number is ambiguous (milliseconds here, microseconds "
                              "in tc(8))", f"write the unit: {text.strip()}ms or {text.strip()}us")
    return _quantity(units.parse_time, text, flag)


def _quantity(parse: Callable[[str], Any], text: str, flag: str) -> Any:
    try:
        return parse(text)
    except units.UnitError as exc:
        raise units.UnitError(f"{flag}: {exc.problem}", exc.fix) from None


def _numbers(text: str, flag: str, kind: type[float] | type[int] = float) -> list[Any]:
    try:
        return [kind(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UsageError(f"{flag} {text!r}: not a comma-separated list of numbers",
                         hint="write e.g. 0,500,1000" if kind is float else "write e.g. 8,16,32") from None


def _budget(text: str, flag: str) -> str:
    """A memory budget as the experiment records it (bytes or 1f1b+N)."""
    from workloads.memory import MemoryBudget

    try:
        return MemoryBudget.parse(text, units.parse_size).text
    except ValueError as exc:            # MemoryBudget's own refusal (a plain ValueError), given its flag
        raise UsageError(f"{flag}: {exc}") from None


def _compute(text: str) -> str:
    """`--compute` as the experiment records it, checked now (a bad value fails before anything comes up)."""
    from testbed.topology.profile import parse_compute

    return parse_compute(text).text


def _dilation(text: str) -> str:
    """`--dilation`'s form (off, auto or a factor of at least 1), checked now; whether the cores allow a factor is
    for the run to say, when it knows its workers."""
    plan_dilation(text, workers=1, cpus=1 << 16)
    return text


def _transports(text: str) -> list[str]:
    chosen = [t.strip() for t in text.split(",") if t.strip()]
    bad = [t for t in chosen if t not in TRANSPORTS]
    if bad or not chosen:
        raise UsageError(f"--transport: unknown {bad[0] if bad else '(none)'!r}", hint="give tcp, rdma or tcp,rdma")
    return chosen


def _run_options(args: argparse.Namespace) -> RunOptions:
    from testbed.run.runner import RunOptions

    return RunOptions(
        schedules=_schedules(args.schedule, "--schedule"), microbatches=args.microbatches,
        microbatch_size=args.microbatch_size, iterations=args.iterations,
        model={"n_layer": args.layers, "n_embd": args.width, "n_head": args.heads, "block_size": args.seq_len},
        memory_budget=args.memory_budget, stages=args.stages, placement=args.placement,
        hang_timeout_s=args.hang_timeout, lr=args.lr, seed=args.seed, dump_gradients=args.dump_gradients,
        transport=args.transport, rdma_slots=args.rdma_slots, sender=args.sender, dilation=_dilation(args.dilation),
        compute=args.compute, shape=_shape(args.shape),
        tokens=_quantity(units.parse_count, args.tokens, "--tokens") if args.tokens else None)


def _shape(text: str | None) -> tuple[int, int] | None:
    """`--shape BxS` -> (b, s)."""
    if text is None:
        return None
    b, x, q = text.strip().lower().partition("x")
    if not (x and b.isdigit() and q.isdigit() and int(b) > 0 and int(q) > 0):
        raise UsageError(f"--shape {text!r}: not sequences x tokens", hint="write e.g. --shape 1x1024")
    return int(b), int(q)


def check_training(args: argparse.Namespace) -> None:
    args.options = _run_options(args)


def check_exec(args: argparse.Namespace) -> None:
    if not args.command:
        raise UsageError("no command given", hint=f"write: testbed exec {args.node} -- CMD [ARGS...]")


def check_link(args: argparse.Namespace) -> None:
    args.values = {"delay_s": _duration(args.delay, "--delay") if args.delay else None,
                   "rate_bps": _quantity(units.parse_rate, args.rate, "--rate") if args.rate else None,
                   "jitter_s": _duration(args.jitter, "--jitter") if args.jitter else None,
                   "loss": _quantity(units.parse_fraction, args.loss, "--loss") if args.loss else None,
                   "edge_rate_bps": _quantity(units.parse_rate, args.edge_rate, "--edge-rate") if args.edge_rate else None}


def check_topology(args: argparse.Namespace) -> None:
    """The topology, read and validated (each problem with its fix) before anything else."""
    load_topology(resolve_topology(args.topology))


def check_experiment(args: argparse.Namespace) -> None:
    """The experiment's spec into args.spec; with --quick, quick's settings where the user gave no option."""
    if args.old_topology:
        if args.topology not in (DEFAULT_TOPOLOGY, args.old_topology):
            raise UsageError(f"two topologies given: {args.topology} and --topology {args.old_topology}",
                             hint="give one, as the first argument")
        args.topology = args.old_topology
    if not args.resume:
        check_topology(args)
    args.spec = _experiment_spec(args)
    if args.quick:
        from dataclasses import fields

        from testbed.api import ExperimentSpec as Quick

        default = _experiment_spec(build_parser().parse_args(["experiment", args.topology]))
        given = {f.name: getattr(args.spec, f.name) for f in fields(args.spec)
                 if getattr(args.spec, f.name) != getattr(default, f.name)}
        args.spec = Quick.quick(**{**given, "topology": args.topology})    # every option the user gave wins


def _experiment_spec(args: argparse.Namespace) -> Any:
    """The experiment's spec from its options (testbed.experiment.records.ExperimentSpec)."""
    from testbed.experiment.records import ExperimentSpec

    return ExperimentSpec(
        topology=args.topology, microbatches=args.microbatches, iterations=args.iterations,
        distances_km=_numbers(args.distances, "--distances"), focus_km=args.focus, repetitions=args.repetitions,
        budgets=[_budget(x, "--memory-budgets") for x in args.memory_budgets.split(",") if x.strip()],
        schedules=_schedules(args.schedule, "--schedule"),
        focus_schedules=_schedules(args.focus_schedule, "--focus-schedule", empty_ok=True),
        rates_mbit=_numbers(args.rates, "--rates"), microbatch_counts=_numbers(args.microbatch_counts,
                                                                               "--microbatch-counts", int),
        memory_budget=None if args.memory_budget in (None, "", "none") else _budget(args.memory_budget,
                                                                                    "--memory-budget"),
        results=args.results, backend=args.backend, switch=args.switch, transports=_transports(args.transport),
        dilation=_dilation(args.dilation), compute=_compute(args.compute), stages=args.stages,
        shape=None if args.shape is None else list(_shape(args.shape)),
        tokens=_quantity(units.parse_count, args.tokens, "--tokens") if args.tokens else None)


# ---- Each command's arguments. ------------------------------------------------------------------------------------

class _Renamed(argparse.Action):
    """An old spelling of an option, accepted for one release with a notice on stderr."""

    def __init__(self, option_strings: list[str], dest: str, now: str = "", **kwargs: Any) -> None:
        super().__init__(option_strings, dest, help=argparse.SUPPRESS, **kwargs)
        self.now = now

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        print(f"testbed: {option_string} is now {self.now}; the old spelling goes in the next release", file=sys.stderr)
        setattr(namespace, self.dest, values)


def _json_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print JSON (the contract in docs/) instead of text")


def args_doctor(p: argparse.ArgumentParser) -> None:
    _json_arg(p)


def args_plan(p: argparse.ArgumentParser) -> None:
    p.add_argument("topology", nargs="?", default=DEFAULT_TOPOLOGY, help="file or shipped name (topologies/)")
    p.add_argument("--name", help="testbed name (default: the topology's name)")
    p.add_argument("--tokens", help="the shape plan instead: each schedule's best micro-batch shape (b, s, m = "
                   "tokens / (b s)) and geopipe's dN at this many tokens per step (e.g. 1Mi, 262144)")
    p.add_argument("--compute", default="llama2-13b-910b-tp8",
                   help="with --tokens: the deployment profile (profiles/; NAME or NAME@VARIANT)")
    p.add_argument("--stages", type=int, help="with --tokens: pipeline stages (default: one per host)")
    _json_arg(p)


def _bring_up_args(p: argparse.ArgumentParser) -> None:
    """How a testbed is brought up: shared by `up` and by `run` on a topology."""
    p.add_argument("--backend", default="netns", choices=sorted(BACKENDS),
                   help="netns: namespaces, veths and bridges built here; mininet: Mininet's hosts and switches")
    p.add_argument("--switch", default="auto", choices=SWITCH_KINDS,
                   help="mininet: DC switch (auto: OVS where its kernel datapath runs, else Linux bridge; "
                        "ovs-user: private userspace OVS)")
    p.add_argument("--shaper", default="auto", choices=SHAPER_CHOICES,
                   help="link emulation: auto (netem if the kernel has it, else delayline), or none (no delay!)")
    p.add_argument("--rdma", choices=["none", "softroce"],
                   help="override the topology's rdma: softroce gives every host an rxe device (Linux >= 7.1)")


def args_up(p: argparse.ArgumentParser) -> None:
    p.add_argument("topology", nargs="?", default=DEFAULT_TOPOLOGY, help="file or shipped name (topologies/)")
    p.add_argument("--name", help="testbed name (default: the topology's name); lets several coexist")
    _bring_up_args(p)
    p.add_argument("--verify", default="quick", choices=["quick", "full", "skip"],
                   help="after bring-up: quick (reach, routes, delays, drops), full (+ TCP throughput), skip")
    p.add_argument("--no-verify", action="store_true", help="same as --verify skip")


def args_down(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", nargs="?", help="the testbed (default: the only one up)")
    p.add_argument("--all", action="store_true", help="every testbed this tool has up")


def args_status(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", nargs="?", help="one testbed (default: every one up)")
    _json_arg(p)


def args_exec(p: argparse.ArgumentParser) -> None:
    p.add_argument("node", help="a host or router name (testbed status lists them)")
    p.add_argument("--name", help="the testbed, when several have this node")
    p.add_argument("command", nargs="*", help="the command, after --")


def args_verify(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", nargs="?", help="the testbed (default: the only one up)")
    _json_arg(p)
    p.add_argument("--all", action="store_true", help="list every check, also each host pair and route")
    p.add_argument("--quick", action="store_true", help="skip the TCP throughput tests")


def args_link(p: argparse.ArgumentParser) -> None:
    p.add_argument("action", choices=["set"], help="set: change the link's shape")
    p.add_argument("a", help="datacenter at one end")
    p.add_argument("b", help="datacenter at the other end")
    p.add_argument("--name", help="the testbed, when several are up")
    p.add_argument("--from", dest="from_dc", help="change only the direction leaving this DC (default: both)")
    p.add_argument("--delay", help="one-way delay with its unit, e.g. 10ms or 800us (a bare number is refused)")
    p.add_argument("--rate", help="rate in bits, e.g. 500mbit or 10gbit")
    p.add_argument("--jitter", help="jitter with its unit, e.g. 0.5ms")
    p.add_argument("--loss", help="random loss, e.g. 0.1%% (only on links with lossless: false)")
    p.add_argument("--edge-rate", help="the receiving OTN edge's DC-side port rate, e.g. 500mbit (links with an edge: "
                   "lossless: pfc, a buffer or an edge_rate)")


def _training_args(p: argparse.ArgumentParser) -> None:
    """What to train and how: shared by `run` and `remote run`/`remote cycle`."""
    p.add_argument("--schedule", default="1f1b,1f1b-prefetch,geopipe",
                   help=f"comma-separated: {', '.join(SCHEDULES)}; PyTorch's own: {', '.join(TORCH_SCHEDULES)}")
    p.add_argument("--microbatches", type=int, default=8, help="micro-batches per iteration")
    p.add_argument("--microbatch-size", type=int, default=4, help="sequences per micro-batch")
    p.add_argument("--tokens", help="tokens per step (e.g. 256Ki): --microbatches derived as tokens / (b s) and "
                                    "recorded (b s: --shape's, or --microbatch-size x --seq-len)")
    p.add_argument("--shape", help="with --compute PROFILE: the micro-batch as BxS (sequences x tokens each, e.g. "
                                   "1x1024; default: the profile's); `testbed plan --tokens` says which is best")
    p.add_argument("--iterations", type=int, default=4, help="timed iterations (after one warm-up)")
    p.add_argument("--layers", type=int, default=4, help="transformer blocks of the model")
    p.add_argument("--width", type=int, default=128, help="the model's embedding width")
    p.add_argument("--heads", type=int, default=4, help="attention heads (must divide --width)")
    p.add_argument("--seq-len", type=int, default=64, help="tokens per sequence")
    p.add_argument("--memory-budget", help="in-flight memory per stage, enforced: bytes (64MiB) or 1f1b+N "
                                           "(what 1F1B holds with early receives, plus N micro-batches)")
    p.add_argument("--stages", type=int, help="pipeline stages (default: one per DC with --placement spread, every "
                                              "host with fill)")
    p.add_argument("--placement", default="spread", choices=["spread", "fill"],
                   help="spread: stages spread evenly over the DCs; fill: the first N hosts in DC order")
    p.add_argument("--hang-timeout", type=float, default=60.0, help="fail when no worker reports for this long (s)")
    p.add_argument("--lr", type=float, default=3e-3, help="AdamW learning rate (0: the weights never change)")
    p.add_argument("--seed", type=int, default=1234, help="model initialisation and data order")
    p.add_argument("--dump-gradients", action="store_true",
                   help="each rank writes its last iteration's gradients (grads-rank-<r>.pt beside its trace)")
    p.add_argument("--transport", default=AUTO, choices=CHOICES,
                   help="between stages: rdma (RC queue pairs over each host's rxe device; fails at once where "
                        "missing), tcp (gloo), auto (rdma where every stage has it, else tcp and why)")
    p.add_argument("--rdma-slots", type=int, default=4,
                   help="RDMA receive slots per neighbour (messages a sender may push ahead of the receiver)")
    p.add_argument("--sender", default="thread", choices=["thread", "inline"],
                   help="gloo's sends: from a thread of their own, the receives after a send posted before it "
                        "(thread), or written by the executor's thread in the schedule's order (inline)")
    _apparatus_args(p)


def _apparatus_args(p: argparse.ArgumentParser) -> None:
    """How the testbed keeps its own cost off the measurement (make bench-overhead compares the choices), and
    where the compute comes from."""
    p.add_argument("--compute", default="real", metavar="real|replay[:FILE]|PROFILE",
                   help="real: the model's arithmetic on this CPU; replay: every F and B becomes a wait of "
                        "the time the real model took here, profiled at the start (saved as compute.json); "
                        "replay:results/<id>/compute.json: a saved table, on any machine; PROFILE: a deployment "
                        "profile (profiles/, e.g. gpt-7b-h100) with its messages scaled by each link's rate scale")
    p.add_argument("--dilation", default=DILATION,
                   help="time dilation (DieCast): off, auto (each worker capped so that the workers leave a reserve of "
                        "the cores to the delay daemons and I/O threads; k = workers / (cores - reserve)) or a factor "
                        "k; links run k times slower and times are divided by k")


def args_run(p: argparse.ArgumentParser) -> None:
    p.add_argument("target", nargs="?", default=DEFAULT_TOPOLOGY,
                   help="a running testbed's name, or a topology (brought up for the run and removed after it)")
    _training_args(p)
    p.add_argument("--results", default="results", help="folder of the run's results/<run-id>/")
    p.add_argument("--name", help="name for a testbed brought up for this run (default: the topology's name)")
    _bring_up_args(p)


def args_experiment(p: argparse.ArgumentParser) -> None:
    p.add_argument("topology", nargs="?", default=DEFAULT_TOPOLOGY, help="file or shipped name (topologies/)")
    p.add_argument("--distances", default="0,500,1000,2000", help="km, comma-separated")
    p.add_argument("--schedule", default="1f1b,1f1b-prefetch,geopipe",
                   help="comma-separated, run at every distance: " + ", ".join(KNOWN_SCHEDULES))
    p.add_argument("--focus-schedule", default="torch-1f1b,torch-zbv",
                   help="comma-separated, also run at the focus distance, every repetition (PyTorch's strongest "
                        "that run here)")
    p.add_argument("--focus", type=float, default=1000.0, help="km of the repetitions, budget sweep and timeline")
    p.add_argument("--repetitions", type=int, default=3, help="runs at the focus distance")
    p.add_argument("--memory-budgets", default="1f1b+0,1f1b+1,1f1b+2,1f1b+3",
                   help="geopipe's budget sweep at the focus, comma-separated (bytes or 1f1b+N)")
    p.add_argument("--rates", default="50", help="rate sweep at the focus, Mbit/s, comma-separated (the default is "
                                                 "a bandwidth-bound one)")
    p.add_argument("--microbatch-counts", default="", help="optional micro-batch sweep at the focus, comma-separated")
    p.add_argument("--memory-budget", default="1f1b+1",
                   help="budget of the headline runs (1f1b, 1f1b-prefetch, geopipe; enforced): bytes or 1f1b+N, "
                        "or none")
    p.add_argument("--microbatches", type=int, default=64, help="micro-batches per iteration")
    p.add_argument("--tokens", help="tokens per step (e.g. 256Ki): --microbatches derived as tokens / (b s) of the "
                                    "micro-batch and recorded")
    p.add_argument("--shape", help="with --compute PROFILE: the micro-batch as BxS (e.g. 1x1024; default: the "
                                   "profile's)")
    p.add_argument("--stages", type=int, help="pipeline stages, spread evenly over the DCs (default: one per DC)")
    p.add_argument("--iterations", type=int, default=3,
                   help="timed iterations of each schedule per run, interleaved (after one warm-up)")
    p.add_argument("--results", default="results", help="folder of the experiment's results/<id>/")
    p.add_argument("--backend", default="netns", choices=sorted(BACKENDS), help="how the testbed is built")
    p.add_argument("--switch", default="auto", choices=SWITCH_KINDS, help="mininet: DC switch")
    p.add_argument("--transport", default="tcp",
                   help="comma-separated tcp,rdma: with rdma, a transport sweep at the focus (our schedules over each; "
                        "needs rxe in namespaces, Linux >= 7.1: run it under 'testbed vm')")
    _apparatus_args(p)
    p.add_argument("--quick", action="store_true",
                   help="the first look in about 15 s on 2 cores: 1000 km against 0 km, 1f1b and geopipe, 8 micro-batches, one "
                        "repetition, the same report (make demo QUICK=1); any option given beside it is kept")
    p.add_argument("--resume", metavar="RESULTS_DIR",
                   help="complete a stopped experiment: run only its missing points, with its recorded options "
                        "(the options above are then ignored); refused if the topology, code or machine changed")
    p.add_argument("--topology", dest="old_topology", action=_Renamed,
                   now="the first argument, as on plan, up and run (testbed experiment TOPOLOGY)")
    for old, new in (("--schedules", "--schedule"), ("--focus-schedules", "--focus-schedule"),
                     ("--budgets", "--memory-budgets"), ("--transports", "--transport")):
        p.add_argument(old, dest=new[2:].replace("-", "_"), action=_Renamed, now=f"spelled {new}")


def args_remote(p: argparse.ArgumentParser) -> None:
    p.add_argument("action", choices=list(REMOTE_ACTIONS), help="what to do on the machines (each listed above)")
    p.add_argument("inventory", help="inventory YAML (see playbooks/README.md)")
    p.add_argument("--name", help="testbed name on the machines (default: the inventory file's stem)")
    p.add_argument("--results", default="results", help="folder of the run's results/<run-id>/")
    p.add_argument("--verify", default="required", choices=["required", "warn"],
                   help="cycle: stop when verify fails (required) or run anyway and record it (warn)")
    _training_args(p)


def args_cli(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", nargs="?", help="the testbed (default: the only one up)")
    p.add_argument("--script", help="run these CLI commands and leave (Mininet's `source`)")


def args_report(p: argparse.ArgumentParser) -> None:
    p.add_argument("run", help="results/<id> or a part of the id")
    p.add_argument("--results", default="results", help="where to look for a part of an id")


def args_vm(p: argparse.ArgumentParser) -> None:
    p.add_argument("--check", action="store_true", help="only say whether the tier is available")
    p.add_argument("--kvm", default="auto", choices=["auto", "on", "off"],
                   help="auto: KVM if a probe guest boots with it here, else TCG (said which and why)")
    p.add_argument("--memory", default="2G", help="the guest's memory (QEMU's -m)")
    p.add_argument("--cpus", type=int, default=2, help="the guest's CPUs")
    p.add_argument("--out", default="results/vm", help="writable folder shared with the guest")
    p.add_argument("--timeout", type=float, default=1800.0,
                   help="seconds before the guest is killed (exit status 124, said on stderr)")
    p.add_argument("command", nargs="*", help="the command, after -- (default: uname -r)")


# ---- The table of commands, and what is built from it. -----------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Command:
    """One `testbed` command: the parser, the root check, the usage text and the dispatch all read this row."""

    name: str
    summary: str
    arguments: Callable[[argparse.ArgumentParser], None]
    handler: Callable[[argparse.Namespace], int]
    example: str
    needs_root: bool = False
    check: Callable[[argparse.Namespace], None] | None = None
    """The arguments' own checks (units, names, values), before the root check and before anything is touched."""
    details: str = ""
    """More of `--help`'s description, below the summary."""

    @property
    def help(self) -> str:
        return self.summary + (" (needs root)" if self.needs_root else "")


COMMANDS: tuple[Command, ...] = (
    Command("doctor", "probe what this kernel and machine offer", args_doctor, cmd_doctor, "testbed doctor"),
    Command("plan", "print the plan of a topology (addresses, routes, link shapes, queues)", args_plan, cmd_plan,
            "testbed plan 3dc-line --json"),
    Command("up", "bring a topology up", args_up, cmd_up, "sudo testbed up 2dc-1000km --shaper delayline",
            needs_root=True, check=check_topology),
    Command("down", "remove a testbed and everything it created", args_down, cmd_down, "sudo testbed down 2dc-1000km",
            needs_root=True),
    Command("status", "list running testbeds, their nodes and links", args_status, cmd_status, "testbed status --json"),
    Command("exec", "run a command in a node's namespace", args_exec, cmd_exec,
            "sudo testbed exec dc-a-h1 -- ip addr", needs_root=True, check=check_exec),
    Command("verify", "check a running testbed against its plan", args_verify, cmd_verify,
            "sudo testbed verify 2dc-1000km --quick", needs_root=True),
    Command("link", "change an OTN link at run time", args_link, cmd_link,
            "sudo testbed link set dc-a dc-b --delay 10ms --rate 500mbit", needs_root=True, check=check_link),
    Command("run", "train the pipeline workload across a testbed's hosts (or a topology's)", args_run, cmd_run,
            "sudo testbed run 2dc-1000km --schedule 1f1b,geopipe --microbatches 16", needs_root=True,
            check=check_training),
    Command("experiment", "the GeoPipe experiment: distance sweep, repetitions, budget sweep, report", args_experiment,
            cmd_experiment, "sudo testbed experiment 2dc-1000km --distances 0,1000 --repetitions 1", needs_root=True,
            check=check_experiment),
    Command("paper", "GeoPipe's own experiment: each schedule at its planned shape, spine rate x distance, a "
            "deployment profile as time", args_paper, cmd_paper, "sudo testbed paper --spines 100,400 --distances 0,1000",
            needs_root=True, check=check_paper),
    Command("congestion", "the paper's congestion test: background traffic, the spine port cut mid-run, PFC "
            "against tail drop and a deep queue", args_congestion, cmd_congestion,
            "sudo testbed congestion --iterations 6 --cut-iteration 3", needs_root=True, check=check_congestion),
    Command("remote", "the same experiment on real machines over SSH (an inventory file)", args_remote, cmd_remote,
            "testbed remote cycle lab.yaml --schedule 1f1b,geopipe", check=check_training,
            details="\n".join(f"  {k:<10} {v}" for k, v in REMOTE_ACTIONS.items())),
    Command("report", "re-render an experiment's plots and report from its summary.json", args_report, cmd_report,
            "testbed report results/20260101-120000-geopipe"),
    Command("cli", "Mininet's CLI on a running testbed (either backend)", args_cli, cmd_cli,
            "sudo testbed cli 2dc-1000km --script commands.txt", needs_root=True),
    Command("vm", "run a command under a stock kernel in QEMU", args_vm, cmd_vm,
            "testbed vm --timeout 600 -- python -m pytest -m vm tests/test_vm.py"),
)
TAIL_COMMANDS = ("exec", "vm")
"""Commands whose own command follows `--` (passed on untouched, options and all)."""


def usage() -> str:
    """The commands, one line each: name, what it does, and whether it needs root."""
    return "\n".join(f"  {c.name:<11} {c.help}" for c in COMMANDS)


__doc__ = f"{__doc__ or ''}\n{usage()}\n"


class _Help(argparse.RawDescriptionHelpFormatter):
    """Descriptions and examples as written; each option's default after its help, unless the help says it."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if action.default in (None, False, "", argparse.SUPPRESS) or "(default" in text or (
                not action.option_strings and action.nargs not in ("?", "*")):
            return text
        return f"{text} (default: %(default)s)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="testbed", description=__doc__.split("\n\n")[0], formatter_class=_Help,
                                     epilog="example: sudo testbed up 2dc-1000km && sudo testbed run 2dc-1000km")
    sub = parser.add_subparsers(dest="cmd", required=True, metavar="COMMAND")
    for command in COMMANDS:
        p = sub.add_parser(command.name, help=command.help, description=f"{command.help}\n{command.details}".strip(),
                           formatter_class=_Help, epilog=f"example:\n  {command.example}")
        command.arguments(p)
        p.set_defaults(entry=command)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    import signal

    signal.signal(signal.SIGPIPE, signal.SIG_DFL)      # `testbed status | head` ends quietly
    argv = list(sys.argv[1:] if argv is None else argv)
    tail: list[str] | None = None
    if argv[:1] and argv[0] in TAIL_COMMANDS and "--" in argv:
        argv, tail = argv[:argv.index("--")], argv[argv.index("--") + 1:]
    args = build_parser().parse_args(argv)
    if tail is not None:
        args.command = tail
    command: Command = args.entry
    try:
        if command.check:
            command.check(args)
        if command.needs_root and os.geteuid() != 0:
            raise TestbedError(f"'testbed {command.name}' needs root (network namespaces)", hint="run it with sudo")
        with unwinding():
            return int(command.handler(args))
    except (TestbedError, Interrupted) as exc:    # every error a user can reach, and a signal
        lines = exc.lines()
        _say("\n".join([f"testbed: {lines[0]}", *lines[1:]]))
        return exc.exit_code


def _say(line: str) -> None:
    """A last line on stderr, which may be a terminal that is already gone (SIGHUP)."""
    with contextlib.suppress(OSError):
        print(line, file=sys.stderr)
