"""Where a step's time goes at 0 km and at 1000 km (`make breakdown`): the strong baseline and geopipe,
interleaved in one launch at each distance, on 2dc-1000km; per schedule and distance the step split into
the ideal pipeline (reference compute on the configured links) and the testbed's own cost, part by part
(testbed/run/breakdown.py), ranked, and who used the CPU. The runs stay in results/breakdown/.

    .venv/bin/python bench/breakdown.py [--distances 0,1000] [--dilation off] [--memory-budget 1f1b+1]
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from testbed.deploy import lifecycle  # noqa: E402
from testbed.deploy.linkset import set_link  # noqa: E402
from testbed.run.breakdown import render  # noqa: E402
from testbed.run.breakdown import side_by_side as breakdown_columns  # noqa: E402
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
    columns = [(f"{schedule} @{km:g} km", [s.breakdown]) for (km, schedule), s in measured.items() if s.breakdown]
    headers, rows = breakdown_columns(columns)
    rows.append(["bubble vs reference", *(f"{s.bubble_vs_reference:.3f}" for s in measured.values() if s.breakdown)])
    rows.append(["span stretch (max over stages)",
                 *(f"{max(s.span_stretch_per_stage or [0]):.2f}" for s in measured.values() if s.breakdown)])
    return table.render(headers, rows, "side by side")


if __name__ == "__main__":
    sys.exit(main())
