"""Where a step's time goes at 0 km and at 1000 km (`make breakdown`): the strong baseline and geopipe,
interleaved in one launch at each distance, on 2dc-1000km; per schedule and distance the step split into
the ideal pipeline (reference compute on the configured links) and the testbed's own cost, part by part
(testbed/run/breakdown.py), ranked, and who used the CPU. The runs stay in results/breakdown/.

    .venv/bin/python bench/breakdown.py [--distances 0,1000] [--dilation off] [--memory-budget 1f1b+1]
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
from testbed.run.breakdown import COMPONENTS, LABELS, render  # noqa: E402
from testbed.run.runner import RunOptions, run_schedules  # noqa: E402
from testbed.run.summary import ScheduleSummary  # noqa: E402
from testbed.topology.model import FIBRE_DELAY_S_PER_KM  # noqa: E402
from testbed.util import table  # noqa: E402
from testbed.util.paths import resolve_topology  # noqa: E402

SCHEDULES = ("1f1b-prefetch", "geopipe")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--distances", default="0,1000")
    parser.add_argument("--memory-budget", default="1f1b+1")
    parser.add_argument("--microbatches", type=int, default=64)
    parser.add_argument("--dilation", default="off")
    parser.add_argument("--results", default="results/breakdown")
    args = parser.parse_args()
    name = f"bd{os.getpid() % 10000}"
    measured: dict[tuple[float, str], ScheduleSummary] = {}
    lifecycle.up(resolve_topology("2dc-1000km"), name)
    try:
        backend = lifecycle.open_backend(name)
        swept = backend.state.plan.directions[0]
        for km in (float(x) for x in args.distances.split(",")):
            set_link(backend, swept.src_dc, swept.dst_dc, delay_s=km * FIBRE_DELAY_S_PER_KM)
            options = RunOptions(schedules=list(SCHEDULES), microbatches=args.microbatches,
                                 memory_budget=args.memory_budget, dilation=args.dilation)
            run_dir, summary = run_schedules(backend, options, Path(args.results), log=lambda _m: None)
            print(f"{km:g} km: {run_dir}", flush=True)
            for s in summary.schedules:
                measured[(km, s.schedule)] = s
    finally:
        lifecycle.down(name)
    for (km, schedule), s in measured.items():
        if s.breakdown:
            print("\n" + render(f"{schedule} at {km:g} km", s.breakdown))
    print("\n" + side_by_side(measured))
    return 0


def side_by_side(measured: dict[tuple[float, str], ScheduleSummary]) -> str:
    """Milliseconds per step, mean over stages, one column per (distance, schedule)."""
    keys = [k for k, s in measured.items() if s.breakdown]
    head = ["ms per step (mean over stages)", *(f"{s} @{km:g} km" for km, s in keys)]

    def row(label: str, values: list[float | None]) -> list[str]:
        return [label, *("-" if v is None else f"{v * 1e3:+.0f}" for v in values)]

    splits = [measured[k].breakdown for k in keys]
    rows = [["step", *(f"{b.step_s * 1e3:.0f}" for b in splits if b)],
            ["ideal step (reference compute, configured links)",
             *(f"{b.ideal_step_s * 1e3:.0f}" if b and b.ideal_step_s else "-" for b in splits)],
            row("the testbed's own cost", [b.overhead_s if b else None for b in splits])]
    for part in COMPONENTS:
        rows.append(row(f"  {LABELS[part]}", [statistics.mean(st.component(part) for st in b.stages) if b else None
                                               for b in splits]))
    rows.append(["bubble vs reference", *(f"{measured[k].bubble_vs_reference:.3f}" for k in keys)])
    rows.append(["span stretch (max over stages)",
                 *(f"{max(measured[k].span_stretch_per_stage or [0]):.2f}" for k in keys)])
    return table.render(head, rows, "side by side")


if __name__ == "__main__":
    sys.exit(main())
