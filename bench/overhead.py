"""The testbed's own cost, variant against variant, measured side by side in one run (`make bench-overhead`).

Each comparison runs the same training (2dc-1000km, 64 micro-batches, budget 1f1b+1) under a few variants of
one part of the apparatus, interleaved (repetition r runs the variants in rotated order, so a slow stretch of
the host lands on each), and prints per variant the medians of: step time, the ideal step and the testbed's
own cost (testbed/run/breakdown.py), the parts of it (compute preempted, compute slower than alone, waiting
beyond the ideal pipeline, executor), the delay daemons' CPU and the error of the delay the link delivered
during the runs, and each variant's step against the first.

    .venv/bin/python bench/overhead.py --compare daemon [--km 1000] [--repetitions 2] [--layers 2]

Comparisons:
  daemon   the delay daemons' timing: normal priority vs SCHED_FIFO, spinning to releases or not
  mtu      MTU 1500 vs 9000 on the OTN link and the DC fabric (two testbeds, alternating)
  tcp      the hosts' TCP: BBR with slow start after idle (this machine's Linux default) vs reno without
  comm     the workers' communication threads (gloo's I/O loop) at normal vs real-time priority
  affinity the workers' communication threads on the worker's own core vs on any core
  sender   gloo's sends written by the executor's thread vs a sender thread (the receives after a send first)
  dilation time dilation off vs on (workers capped, link delay x k and rate / k, times / k)
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from testbed.backends.base import Backend  # noqa: E402
from testbed.deploy import lifecycle  # noqa: E402
from testbed.deploy.linkset import set_link  # noqa: E402
from testbed.run.runner import RunOptions, run_schedules  # noqa: E402
from testbed.run.summary import ScheduleSummary  # noqa: E402
from testbed.shaping.delayline import Timing  # noqa: E402
from testbed.shaping.registry import shaper_for  # noqa: E402
from testbed.topology.model import FIBRE_DELAY_S_PER_KM  # noqa: E402
from testbed.util import table  # noqa: E402
from testbed.util.paths import resolve_topology  # noqa: E402
from workloads.records import GPTConfig  # noqa: E402


@dataclass(frozen=True, slots=True)
class Variant:
    """One way to run the apparatus: daemon timing, run options, or a topology of its own."""

    name: str
    timing: Timing | None = None
    options: dict[str, Any] = field(default_factory=dict)
    topology: dict[str, Any] | None = None
    """Overrides merged into the topology file (a testbed of its own)."""


COMPARISONS: dict[str, list[Variant]] = {
    "daemon": [Variant("normal priority, spin", timing=Timing(realtime=False, spin=True)),
               Variant("SCHED_FIFO, spin", timing=Timing(realtime=True, spin=True)),
               Variant("SCHED_FIFO, no spin", timing=Timing(realtime=True, spin=False)),
               Variant("normal priority, no spin", timing=Timing(realtime=False, spin=False))],
    "mtu": [Variant("MTU 1500", topology={"defaults": {"link": {"mtu": 1500}, "fabric": {"mtu": 1500}}}),
            Variant("MTU 9000", topology={"defaults": {"link": {"mtu": 9000}, "fabric": {"mtu": 9000}}})],
    "tcp": [Variant("bbr, slow start after idle (Linux here)",
                    topology={"tcp": {"congestion_control": "bbr", "slow_start_after_idle": True}}),
            Variant("reno, no slow start after idle", topology={"tcp": {"congestion_control": "reno",
                                                                         "slow_start_after_idle": False}})],
    "comm": [Variant("comm threads normal", options={"comm_priority": "normal"}),
             Variant("comm threads real-time", options={"comm_priority": "realtime"})],
    "affinity": [Variant("comm threads on the worker's core", options={"comm_affinity": "own"}),
                 Variant("comm threads on any core", options={"comm_affinity": "any"})],
    "sender": [Variant("sends written by the executor, schedule's order", options={"sender": "inline"}),
               Variant("sends from a sender thread, receives first", options={"sender": "thread"})],
    "dilation": [Variant("no dilation", options={"dilation": "off"}),
                 Variant("dilation", options={"dilation": "auto"})],
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--compare", choices=sorted(COMPARISONS), required=True)
    parser.add_argument("--km", type=float, default=1000.0)
    parser.add_argument("--layers", type=int, default=None, help="model layers (default: the model's 4)")
    parser.add_argument("--repetitions", type=int, default=2)
    parser.add_argument("--schedules", default="1f1b-prefetch,geopipe")
    parser.add_argument("--microbatches", type=int, default=64)
    parser.add_argument("--memory-budget", default="1f1b+1")
    parser.add_argument("--results", default="results/bench-overhead")
    args = parser.parse_args()
    variants = COMPARISONS[args.compare]
    schedules = args.schedules.split(",")
    runs: dict[tuple[str, str], list[ScheduleSummary]] = {}
    fb_s: list[float] = []
    testbeds: dict[str, str] = {}
    try:
        for v in variants:
            key = _topology_key(v)
            if key not in testbeds:
                testbeds[key] = f"ov{os.getpid() % 1000}{len(testbeds)}"
                _up(testbeds[key], v.topology, args.km)
        for rep in range(args.repetitions):
            order = variants[rep % len(variants):] + variants[:rep % len(variants)]
            for v in order:
                backend = lifecycle.open_backend(testbeds[_topology_key(v)])
                _apply(backend, v)
                print(f"repetition {rep + 1}: {v.name}", flush=True)
                model = {"model": GPTConfig(n_layer=args.layers)} if args.layers else {}
                options = RunOptions(schedules=schedules, microbatches=args.microbatches,
                                     memory_budget=args.memory_budget, **model, **v.options)
                _, summary = run_schedules(backend, options, Path(args.results), log=lambda _m: None)
                if summary.fb_per_microbatch_s:
                    fb_s.append(summary.fb_per_microbatch_s)
                for s in summary.schedules:
                    runs.setdefault((v.name, s.schedule), []).append(s)
                    print(f"  {s.schedule}: step {s.step_time_s:.3f} s", flush=True)
    finally:
        for name in testbeds.values():
            lifecycle.down(name)
    print(render(variants, schedules, runs, args))
    if fb_s:
        print(f"host F+B per micro-batch over the runs: {statistics.median(fb_s) * 1e3:.1f} ms "
              f"[{min(fb_s) * 1e3:.1f}-{max(fb_s) * 1e3:.1f}]")
    return 0


def _topology_key(v: Variant) -> str:
    return repr(sorted((v.topology or {}).items()))


def _up(name: str, overrides: dict[str, Any] | None, km: float) -> None:
    source = resolve_topology("2dc-1000km")
    doc = _merged(yaml.safe_load(source.read_text()), overrides or {})
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        yaml.safe_dump(doc, f)
    try:
        lifecycle.up(Path(f.name), name)
    finally:
        os.unlink(f.name)
    backend = lifecycle.open_backend(name)
    swept = backend.state.plan.directions[0]
    set_link(backend, swept.src_dc, swept.dst_dc, delay_s=km * FIBRE_DELAY_S_PER_KM)


def _merged(doc: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    out = dict(doc)
    for key, value in overrides.items():
        out[key] = _merged(out.get(key) or {}, value) if isinstance(value, dict) else value
    return out


def _apply(backend: Backend, v: Variant) -> None:
    if v.timing is None:
        return
    shaper = shaper_for(backend)
    retime: Callable[[Timing], None] | None = getattr(shaper, "retime", None)
    if retime is None:
        raise SystemExit(f"--compare daemon needs the delay line (this testbed's shaper is {backend.state.shaper_name})")
    if shaper.timing() != v.timing:          # type: ignore[union-attr]
        retime(v.timing)
        backend.state.save()


def render(variants: list[Variant], schedules: list[str], runs: dict[tuple[str, str], list[ScheduleSummary]],
           args: argparse.Namespace) -> str:
    def med(values: list[float | None]) -> float | None:
        real = [v for v in values if v is not None]
        return statistics.median(real) if real else None

    def ms(v: float | None) -> str:
        return "-" if v is None else f"{v * 1e3:.0f}"

    rows = []
    for schedule in schedules:
        base = med([s.step_time_s for s in runs.get((variants[0].name, schedule), [])])
        for v in variants:
            got = runs.get((v.name, schedule), [])
            if not got:
                continue
            step = med([s.step_time_s for s in got])
            parts = {name: med([_part(s, name) for s in got]) for name in
                     ("compute_preempted_s", "compute_cpu_excess_s", "wait_beyond_ideal_s", "executor_s")}
            rows.append([schedule, v.name, f"{step:.3f} [{min(s.step_time_s for s in got):.3f}-"
                                           f"{max(s.step_time_s for s in got):.3f}]",
                         ms(med([s.breakdown.ideal_step_s if s.breakdown else None for s in got])),
                         ms(med([s.breakdown.overhead_s if s.breakdown else None for s in got])),
                         *(ms(parts[k]) for k in parts),
                         _pct(med([_daemon_share(s) for s in got])),
                         _us(med([_hold_error(s) for s in got])),
                         "-" if base is None or step is None else f"{step / base:.3f}"])
    return table.render(["schedule", "variant", "step s [min-max]", "ideal ms", "own cost ms", "preempted ms",
                         "slower CPU ms", "waits beyond ms", "executor ms", "daemons CPU", "hold error us",
                         "step vs first"], rows,
                        f"\n--compare {args.compare}: 2dc-1000km at {args.km:g} km, {args.microbatches} micro-batches, "
                        f"budget {args.memory_budget}, {args.repetitions} interleaved repetitions (medians; parts "
                        f"are means over stages, testbed/run/breakdown.py)")


def _part(s: ScheduleSummary, name: str) -> float | None:
    if s.breakdown is None:
        return None
    return statistics.mean(st.component(name) for st in s.breakdown.stages)


def _daemon_share(s: ScheduleSummary) -> float | None:
    if s.breakdown is None:
        return None
    return next((c.fraction for c in s.breakdown.cpu if c.name == "delay daemons"), None)


def _hold_error(s: ScheduleSummary) -> float | None:
    if not s.link_timing:
        return None
    return max((t.mean_error_s for t in s.link_timing), key=abs)


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v:.1%}"


def _us(v: float | None) -> str:
    return "-" if v is None else f"{v * 1e6:+.0f}"


if __name__ == "__main__":
    sys.exit(main())
