"""Reproducibility of the headline, measured (`make bench-repro`): the focus point (2dc-1000km at 1000 km, the
headline budget) run N times in one go, each run the strong baseline and geopipe interleaved iteration by
iteration in one launch (and PyTorch's 1F1B beside them), and the spread of what the report states: each
schedule's step time, geopipe's step-time speed-up over 1f1b-prefetch and its cut of the bubble, and the
extra micro-batches geopipe's plan chose in each run's warm-up.

    .venv/bin/python bench/repro.py [--runs 3] [--km 1000] [--memory-budget 1f1b+1] [--dilation off]
                                    [--compute real|replay|replay:FILE|PROFILE]

With compute as time, PyTorch's 1F1B (real compute only) is left out; `--compute replay` profiles this host in the
first run and replays that table (its compute.json) in every later one, so the runs differ only by what the
emulator and the executor do.

Prints every run and, per figure, the median, min-max and the largest deviation from the median in percent;
exit status 1 when the speed-up strays more than --tolerance (default 5 %, 1 % with compute as time) from its
median, a schedule's step more than --step-tolerance (timed compute only, default 2 %), or two runs planned
different extra micro-batches.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from testbed.deploy import lifecycle  # noqa: E402
from testbed.deploy.linkset import set_link  # noqa: E402
from testbed.run.runner import RunOptions, run_schedules  # noqa: E402
from testbed.run.summary import ScheduleSummary  # noqa: E402
from testbed.topology.model import FIBRE_DELAY_S_PER_KM  # noqa: E402
from testbed.util import table  # noqa: E402
from testbed.util.paths import resolve_topology  # noqa: E402

SCHEDULES = ("1f1b-prefetch", "geopipe", "torch-1f1b")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--km", type=float, default=1000.0)
    parser.add_argument("--memory-budget", default="1f1b+1")
    parser.add_argument("--microbatches", type=int, default=64)
    parser.add_argument("--dilation", default="off")
    parser.add_argument("--tolerance", type=float)
    parser.add_argument("--step-tolerance", type=float, default=0.02)
    parser.add_argument("--compute", default="real")
    parser.add_argument("--results", default="results/bench-repro")
    args = parser.parse_args()
    timed = args.compute != "real"
    if args.tolerance is None:
        args.tolerance = 0.01 if timed else 0.05
    args.schedules = [s for s in SCHEDULES if not (timed and s.startswith("torch-"))]
    compute = args.compute
    name = f"rp{os.getpid() % 10000}"
    lifecycle.up(resolve_topology("2dc-1000km"), name)
    runs: list[dict[str, ScheduleSummary]] = []
    try:
        backend = lifecycle.open_backend(name)
        swept = backend.state.plan.directions[0]
        set_link(backend, swept.src_dc, swept.dst_dc, delay_s=args.km * FIBRE_DELAY_S_PER_KM)
        for i in range(args.runs):
            options = RunOptions(schedules=list(args.schedules), microbatches=args.microbatches,
                                 memory_budget=args.memory_budget, unbudgeted=["torch-1f1b"], dilation=args.dilation,
                                 compute=compute)
            run_dir, summary = run_schedules(backend, options, Path(args.results), log=lambda _m: None)
            if compute == "replay":              # the first run's profile of this host, replayed from now on
                compute = f"replay:{run_dir / 'compute.json'}"
            runs.append({s.schedule: s for s in summary.schedules})
            print(f"run {i + 1}: " + ", ".join(f"{s} {runs[-1][s].step_time_s:.3f} s" for s in args.schedules)
                  + f"; plan {_plan(runs[-1]['geopipe'])}; {summary.compute_line()}", flush=True)
    finally:
        lifecycle.down(name)
    return report(runs, args)


def _plan(s: ScheduleSummary) -> str:
    return "/".join(map(str, s.geopipe_sizing.extra_inflight)) if s.geopipe_sizing else "-"


def _speedup(run: dict[str, ScheduleSummary]) -> float:
    return run["1f1b-prefetch"].step_time_s / run["geopipe"].step_time_s


def _cut(run: dict[str, ScheduleSummary]) -> float:
    pre, geo = run["1f1b-prefetch"].bubble_vs_reference, run["geopipe"].bubble_vs_reference
    return 1 - geo / pre if pre and geo is not None else float("nan")


def report(runs: list[dict[str, ScheduleSummary]], args: argparse.Namespace) -> int:
    figures = {f"{s} step s": [r[s].step_time_s for r in runs] for s in args.schedules}
    figures["geopipe speed-up over 1f1b-prefetch"] = [_speedup(r) for r in runs]
    figures["geopipe bubble cut vs 1f1b-prefetch"] = [_cut(r) for r in runs]
    rows = []
    for name, values in figures.items():
        med = statistics.median(values)
        spread = max(abs(v / med - 1) for v in values) if med else float("nan")
        rows.append([name, " ".join(f"{v:.3f}" for v in values), f"{med:.3f}", f"{min(values):.3f}-{max(values):.3f}",
                     f"{spread:.1%}"])
    print(table.render(["figure", "runs", "median", "min-max", "largest deviation"], rows,
                       f"\n{args.runs} runs at {args.km:g} km, budget {args.memory_budget}, dilation {args.dilation}, "
                       f"compute {args.compute}, each run the schedules interleaved"))
    plans = [_plan(r["geopipe"]) for r in runs]
    print(f"geopipe's plan (extra micro-batches per stage) in each run's warm-up: {', '.join(plans)}")
    speedups = figures["geopipe speed-up over 1f1b-prefetch"]
    med = statistics.median(speedups)
    stray = [v for v in speedups if abs(v / med - 1) > args.tolerance]
    steps_ok = True
    if args.compute != "real":
        for s in args.schedules:
            values = figures[f"{s} step s"]
            worst = max(abs(v / statistics.median(values) - 1) for v in values)
            steps_ok = steps_ok and worst <= args.step_tolerance
            print(f"{s}: every step within {worst:.2%} of its median (bound {args.step_tolerance:.0%})")
    ok = not stray and len(set(plans)) == 1 and steps_ok
    print(("PASS" if ok else "FAIL") + f": speed-up within +-{args.tolerance:.0%} of its median "
          f"({'yes' if not stray else 'no: ' + ', '.join(f'{v:.3f}' for v in stray)}), one plan "
          f"({'yes' if len(set(plans)) == 1 else 'no'})" + ("" if args.compute == "real" else
                                                          f", steps within +-{args.step_tolerance:.0%}: "
                                                          + ("yes" if steps_ok else "no")))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
