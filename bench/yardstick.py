"""The 0 km bubble against its yardsticks, side by side in one launch of this script (`make bench-yardstick`).

The stated yardstick (docs/training.md) is each stage's F+B of the step's micro-batches with every stage computing
at once and no communication, measured by the workers in their own processes and pinning before and after the
timed iterations of each launch: the physical floor of a step on this host. This script runs REPETITIONS launches
of the schedules interleaved at 0 km on 2dc-1000km (real compute, a model small enough that a micro-batch's F+B
is under 10 ms here) and prints, from the same launches:

- the reference per stage and micro-batch, in wall time and in CPU time, and the least sample of the whole
  script (the yardstick releases before 2026-12-04 used: it falls with the number of launches);
- each schedule's bubble (1 - yardstick / step) against the launch's own reference in wall time (the stated one),
  in CPU time, and against the least sample, median [min - max] over the launches; the ideal pipeline's own
  bubble (fill and drain: what no host can remove);
- the bubble of the ideal pipeline on these cores: each stage's compute measured while one step's messages cross
  beside it with no schedule (workloads/runs.py: measure_loaded_reference), on the configured links: the
  messages' CPU shares the 2 cores with the compute in any schedule;
- the breakdown of the step beyond the ideal pipeline (medians over the launches): which part 2 cores cannot lose
  (the ideal pipeline on these cores above the ideal one) and the rest, the testbed's own.

    .venv/bin/python bench/yardstick.py [--repetitions 3] [--microbatches 32] [--layers 2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from testbed.deploy import lifecycle  # noqa: E402
from testbed.deploy.linkset import set_link  # noqa: E402
from testbed.run.breakdown import side_by_side as breakdown_columns  # noqa: E402
from testbed.run.runner import RunOptions, run_schedules  # noqa: E402
from testbed.run.summary import RunSummary  # noqa: E402
from testbed.util import table  # noqa: E402
from testbed.util.paths import resolve_topology  # noqa: E402
from workloads.records import GPTConfig, RankTrace  # noqa: E402


def spread(values: list[float], fmt: str = "{:.3f}") -> str:
    """median [min - max]"""
    return f"{fmt.format(statistics.median(values))} [{fmt.format(min(values))} - {fmt.format(max(values))}]"


def samples(run_dir: Path, schedule: str) -> list[list[float]]:
    """Every reference sample (wall seconds) of each rank of one schedule's run, from its rank traces."""
    ranks = sorted((run_dir / schedule).glob("rank-*.json"), key=lambda p: int(p.stem.split("-")[1]))
    return [RankTrace.from_json(json.loads(p.read_text())).reference_compute_s for p in ranks]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repetitions", type=int, default=3)
    parser.add_argument("--microbatches", type=int, default=32)
    parser.add_argument("--layers", type=int, default=2, help="model layers (2: one per stage)")
    parser.add_argument("--schedules", default="1f1b,1f1b-prefetch,geopipe")
    parser.add_argument("--memory-budget", default="1f1b+1")
    parser.add_argument("--results", default="results/bench-yardstick")
    args = parser.parse_args()
    schedules = args.schedules.split(",")
    name = f"ys{os.getpid() % 10000}"
    launches: list[tuple[Path, RunSummary]] = []
    lifecycle.up(resolve_topology("2dc-1000km"), name)
    try:
        backend = lifecycle.open_backend(name)
        swept = backend.state.plan.directions[0]
        set_link(backend, swept.src_dc, swept.dst_dc, delay_s=0.0)
        for r in range(args.repetitions):
            options = RunOptions(schedules=schedules, microbatches=args.microbatches, memory_budget=args.memory_budget,
                                 dilation="off", model=GPTConfig(n_layer=args.layers))
            run_dir, summary = run_schedules(backend, options, Path(args.results), log=lambda _m: None)
            launches.append((run_dir, summary))
            print(f"launch {r + 1}: {run_dir}; {summary.compute_line()}", flush=True)
    finally:
        lifecycle.down(name)
    print(report(launches, schedules, args.microbatches))
    return 0


def report(launches: list[tuple[Path, RunSummary]], schedules: list[str], microbatches: int) -> str:
    first = launches[0][1].schedules[0]
    stages = len(first.reference_compute_s_per_stage or [])
    wall = [[s.reference_compute_s_per_stage[i] for _, run in launches for s in run.schedules[:1]
             if s.reference_compute_s_per_stage] for i in range(stages)]
    cpu = [[s.breakdown.stages[i].reference_cpu_s for _, run in launches for s in run.schedules[:1]
            if s.breakdown and s.breakdown.stages[i].reference_cpu_s] for i in range(stages)]
    least = [min(min(rank[i]) for run_dir, _ in launches for schedule in schedules[:1]
                 for rank in [samples(run_dir, schedule)] if rank) for i in range(stages)]
    fb = [run.fb_per_microbatch_s for _, run in launches if run.fb_per_microbatch_s]
    per_mb = lambda v: [x / microbatches * 1e3 for x in v]            # noqa: E731
    rows = [[f"stage {i}", spread(per_mb(wall[i]), "{:.2f}"), spread(per_mb(cpu[i]), "{:.2f}") if cpu[i] else "-",
             f"{least[i] / microbatches * 1e3:.2f}"] for i in range(stages)]
    out = [table.render(["reference per micro-batch (ms)", "wall, all stages at once (stated)", "CPU time",
                         "least sample of the script (old)"], rows,
                        f"\nthe yardsticks, {len(launches)} launches at 0 km; host F+B per micro-batch "
                        + (spread([x * 1e3 for x in fb], "{:.1f}") + " ms" if fb else "-"))]
    rows = []
    for k, schedule in enumerate(schedules):
        runs = [run.schedules[k] for _, run in launches]
        stated = [s.bubble_vs_reference for s in runs if s.bubble_vs_reference is not None]
        by_cpu = [statistics.mean(1 - st.reference_cpu_s / s.step_time_s for st in s.breakdown.stages)
                  for s in runs if s.breakdown and all(st.reference_cpu_s for st in s.breakdown.stages)]
        old = [statistics.mean(1 - ref / s.step_time_s for ref in least) for s in runs]
        ideal = [statistics.mean(1 - st.reference_s / s.breakdown.ideal_step_s for st in s.breakdown.stages)
                 for s in runs if s.breakdown and s.breakdown.ideal_step_s]
        cores = [statistics.mean(1 - st.reference_s / max(s.breakdown.ideal_step_s, s.breakdown.cores_ideal_step_s)
                                 for st in s.breakdown.stages)
                 for s in runs if s.breakdown and s.breakdown.ideal_step_s and s.breakdown.cores_ideal_step_s]
        own = [s.bubble_ratio for s in runs if s.bubble_ratio is not None]
        rows.append([schedule, spread(stated), spread(by_cpu) if by_cpu else "-", spread(old),
                     spread(ideal) if ideal else "-", spread(cores) if cores else "-", spread(own),
                     spread([s.step_time_s * 1e3 for s in runs], "{:.0f}")])
    out.append(table.render(["schedule", "bubble vs stated (wall)", "vs CPU reference", "vs least sample (old)",
                             "ideal pipeline's own", "ideal on these cores", "vs own spans", "step ms"], rows,
                            "\nthe 0 km bubble, median [min - max] over the launches"))
    columns = [(schedule, [run.schedules[k].breakdown for _, run in launches if run.schedules[k].breakdown])
               for k, schedule in enumerate(schedules)]
    headers, rows = breakdown_columns(columns)
    out.append(table.render(headers, rows, "\nwhere the 0 km step went beyond the ideal pipeline (ms per step, medians)"))
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
