"""netns vs Mininet backend, side by side in one run: bring-up times and bubble ratios of the same workload.

Part 1 (bring-up): TOPOLOGY_UP (default 4dc-32hosts) brought up and down on each backend, alternately,
without shaping, reachability of all host pairs checked (untimed).
Part 2 (training): the demo's topology and workload (2dc-1000km, 1f1b and geopipe, 64 micro-batches) on
each backend, alternately, REPS times: bring-up + shaping time, quick verify, bubble ratios, step times.
The backends agree when each schedule's median bubble ratios differ by no more than the larger spread of the
two backends' repetitions (and at least 0.02 absolute). Usage:
    .venv/bin/python bench/backends.py [--reps 3] [--microbatches 64] [--up-topology 4dc-32hosts]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from testbed.check.verify import check_reachability, verify_testbed  # noqa: E402
from testbed.deploy import lifecycle  # noqa: E402
from testbed.run.runner import RunOptions, run_schedules  # noqa: E402
from testbed.util import table  # noqa: E402
from testbed.util.paths import resolve_topology  # noqa: E402

BACKENDS = ("netns", "mininet")
SCHEDULES = ("1f1b", "geopipe")
MIN_TOLERANCE = 0.02


def bringup(topology: Path, backend: str, name: str) -> tuple[float, float, int]:
    """Seconds to bring up and to tear down, and host pairs that answered."""
    result = lifecycle.up(topology, name, backend=backend, shaper="none")
    try:
        reach = check_reachability(result.plan)
        assert all(c.ok for c in reach), f"{backend}: {sum(not c.ok for c in reach)} host pairs unreachable"
    finally:
        down_s = lifecycle.down(name)
    return result.seconds, down_s, len(reach)


def training(backend: str, name: str, microbatches: int, iterations: int, results: Path) -> dict:
    """One bring-up + verify + 1f1b/geopipe run on the demo topology; returns the figures of one row."""
    result = lifecycle.up(resolve_topology("2dc-1000km"), name, backend=backend)
    try:
        handle = lifecycle.open_backend(name)
        report = verify_testbed(handle, level="quick")
        _, summary = run_schedules(handle, RunOptions(schedules=list(SCHEDULES), microbatches=microbatches,
                                                       iterations=iterations), results, log=lambda _m: None)
    finally:
        down_s = lifecycle.down(name)
    row = {"up_s": result.seconds, "shaped_s": result.shaped_seconds, "down_s": down_s,
           "verify": f"{sum(c.ok for c in report.checks)}/{len(report.checks)}", "shaper": summary.shaper}
    for s in summary.schedules:
        row[s.schedule] = s.bubble_ratio
        row[s.schedule + "_step_s"] = s.step_time_s
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--microbatches", type=int, default=64)
    parser.add_argument("--iterations", type=int, default=4)
    parser.add_argument("--up-topology", default="4dc-32hosts")
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("bench/backends.py needs root", file=sys.stderr)
        return 1
    name = f"bb{os.getpid() % 10000}"

    up_topology = resolve_topology(args.up_topology)
    ups: dict[str, list[tuple[float, float, int]]] = {b: [] for b in BACKENDS}
    for _ in range(args.reps):
        for backend in BACKENDS:
            ups[backend].append(bringup(up_topology, backend, name))
    rows = [(b, " ".join(f"{u:.3f}" for u, _, _ in ups[b]), f"{statistics.median(u for u, _, _ in ups[b]):.3f}",
             f"{statistics.median(d for _, d, _ in ups[b]):.3f}", ups[b][0][2]) for b in BACKENDS]
    print(table.render(["backend", "bring-up s (each rep)", "median up s", "median down s", "pairs reached"], rows,
                       f"Bring-up of {up_topology.stem}, no shaping"))
    ratio = statistics.median(u for u, _, _ in ups["mininet"]) / statistics.median(u for u, _, _ in ups["netns"])
    print(f"mininet / netns bring-up: {ratio:.2f}x\n")

    runs: dict[str, list[dict]] = {b: [] for b in BACKENDS}
    with tempfile.TemporaryDirectory(prefix="bench-backends-") as tmp:
        for rep in range(args.reps):
            for backend in BACKENDS:
                runs[backend].append(training(backend, name, args.microbatches, args.iterations, Path(tmp)))
                r = runs[backend][-1]
                print(f"rep {rep + 1} {backend:8s} up {r['up_s']:.2f} s + shaping {r['shaped_s']:.2f} s, verify "
                      f"{r['verify']}, bubble 1f1b {r['1f1b']:.3f} geopipe {r['geopipe']:.3f}", flush=True)
    rows, agree = [], True
    for schedule in SCHEDULES:
        med = {b: statistics.median(r[schedule] for r in runs[b]) for b in BACKENDS}
        spread = {b: max(r[schedule] for r in runs[b]) - min(r[schedule] for r in runs[b]) for b in BACKENDS}
        tolerance = max(MIN_TOLERANCE, *spread.values())
        delta = med["mininet"] - med["netns"]
        ok = abs(delta) <= tolerance
        agree &= ok
        steps = {b: statistics.median(r[schedule + "_step_s"] for r in runs[b]) for b in BACKENDS}
        rows.append((schedule, f"{med['netns']:.3f} (±{spread['netns'] / 2:.3f})",
                     f"{med['mininet']:.3f} (±{spread['mininet'] / 2:.3f})", f"{delta:+.3f}", f"{tolerance:.3f}",
                     f"{steps['netns']:.3f} / {steps['mininet']:.3f}", "pass" if ok else "FAIL"))
    print(table.render(["schedule", "netns bubble", "mininet bubble", "delta", "noise bound", "step s netns / mininet",
                        "within noise"], rows,
                       f"\n2dc-1000km, {args.microbatches} micro-batches, {args.reps} reps per backend, shaper "
                       f"{runs['netns'][0]['shaper']}"))
    for b in BACKENDS:
        reduction = [1 - r["geopipe"] / r["1f1b"] for r in runs[b]]
        print(f"{b}: geopipe bubble reduction vs 1f1b {statistics.median(reduction):.1%} "
              f"({min(reduction):.1%}-{max(reduction):.1%}); up + shaping "
              f"{statistics.median(r['up_s'] + r['shaped_s'] for r in runs[b]):.2f} s")
    return 0 if agree else 1


if __name__ == "__main__":
    sys.exit(main())
