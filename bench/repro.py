"""Reproducibility of the headline, measured (`make bench-repro`): the focus point (2dc-1000km at 1000 km, the
headline budget) run N times in one go, each run the strong baseline and geopipe interleaved iteration by
iteration in one launch (and PyTorch's 1F1B beside them), and the spread of what the report states: each
schedule's step time, geopipe's step-time speed-up over 1f1b-prefetch and its cut of the bubble, and the
extra micro-batches geopipe's plan chose in each run's warm-up.

    .venv/bin/python bench/repro.py [--runs 3] [--km 1000] [--memory-budget 1f1b+1] [--dilation off]

Prints every run and, per figure, the median, min-max and the largest deviation from the median in percent;
exit status 1 when the speed-up strays more than --tolerance (default 5 %) from its median or two runs planned
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
    parser.add_argument("--tolerance", type=float, default=0.05)
    parser.add_argument("--results", default="results/bench-repro")
    args = parser.parse_args()
    name = f"rp{os.getpid() % 10000}"
    lifecycle.up(resolve_topology("2dc-1000km"), name)
    runs: list[dict[str, ScheduleSummary]] = []
    try:
        backend = lifecycle.open_backend(name)
        swept = backend.state.plan.directions[0]
        set_link(backend, swept.src_dc, swept.dst_dc, delay_s=args.km * FIBRE_DELAY_S_PER_KM)
        for i in range(args.runs):
            options = RunOptions(schedules=list(SCHEDULES), microbatches=args.microbatches,
                                 memory_budget=args.memory_budget, unbudgeted=["torch-1f1b"], dilation=args.dilation)
            _, summary = run_schedules(backend, options, Path(args.results), log=lambda _m: None)
            runs.append({s.schedule: s for s in summary.schedules})
            print(f"run {i + 1}: " + ", ".join(f"{s} {runs[-1][s].step_time_s:.3f} s" for s in SCHEDULES)
                  + f"; plan {_plan(runs[-1]['geopipe'])}", flush=True)
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
    figures = {f"{s} step s": [r[s].step_time_s for r in runs] for s in SCHEDULES}
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
                       f"each run the schedules interleaved"))
    plans = [_plan(r["geopipe"]) for r in runs]
    print(f"geopipe's plan (extra micro-batches per stage) in each run's warm-up: {', '.join(plans)}")
    speedups = figures["geopipe speed-up over 1f1b-prefetch"]
    med = statistics.median(speedups)
    stray = [v for v in speedups if abs(v / med - 1) > args.tolerance]
    ok = not stray and len(set(plans)) == 1
    print(("PASS" if ok else "FAIL") + f": speed-up within +-{args.tolerance:.0%} of its median "
          f"({'yes' if not stray else 'no: ' + ', '.join(f'{v:.3f}' for v in stray)}), one plan "
          f"({'yes' if len(set(plans)) == 1 else 'no'})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
