"""Replay validated against real (`make bench-replay`): at each distance, the same schedules with real compute and
with compute replayed from a table of this host profiled in the same round, back to back on one testbed, in
ABBA order over the rounds. Real minus replay is what the compute itself lost under the emulator; the real run's
breakdown must account for it:

    step_real - step_replay  =  (ideal_real - ideal_replay)      the reference (all stages at once) against the
                                                                 table (each stage alone), on the ideal pipeline
                             +  compute parts of the real run    compute slower than alone, preempted, slept
                             +  residual                         executor, waits and skew that differ between them

The check: |residual| within --tolerance (5 %) of the real step at every point.

    .venv/bin/python bench/replay_vs_real.py [--topology 2dc-1000km] [--km 0,1000] [--rounds 2] [--microbatches 32]
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
from testbed.run.summary import RunSummary, ScheduleSummary  # noqa: E402
from testbed.topology.model import FIBRE_DELAY_S_PER_KM  # noqa: E402
from testbed.util import table  # noqa: E402
from testbed.util.paths import resolve_topology  # noqa: E402

COMPUTE_PARTS = ("compute_cpu_excess_s", "host_drift_s", "compute_preempted_s", "compute_blocked_s")


def compute_part(s: ScheduleSummary) -> float:
    """The real run's compute beyond its reference, mean over stages (seconds per step)."""
    assert s.breakdown is not None
    return statistics.mean(sum(st.component(p) for p in COMPUTE_PARTS) for st in s.breakdown.stages)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--topology", default="2dc-1000km")
    parser.add_argument("--km", default="0,1000")
    parser.add_argument("--schedules", default="1f1b,geopipe")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--microbatches", type=int, default=32)
    parser.add_argument("--memory-budget", default="1f1b+1")
    parser.add_argument("--tolerance", type=float, default=0.05)
    parser.add_argument("--results", default="results/bench-replay")
    args = parser.parse_args()
    schedules = args.schedules.split(",")
    name = f"rv{os.getpid() % 10000}"
    lifecycle.up(resolve_topology(args.topology), name)
    pairs: dict[float, list[tuple[RunSummary, RunSummary]]] = {}
    try:
        backend = lifecycle.open_backend(name)
        swept = backend.state.plan.directions[0]
        for km in (float(x) for x in args.km.split(",")):
            set_link(backend, swept.src_dc, swept.dst_dc, delay_s=km * FIBRE_DELAY_S_PER_KM)
            for r in range(args.rounds):
                got: dict[str, RunSummary] = {}
                for compute in (("replay", "real") if r % 2 == 0 else ("real", "replay")):
                    options = RunOptions(schedules=schedules, microbatches=args.microbatches, compute=compute,
                                         memory_budget=args.memory_budget, dilation="off")
                    _, got[compute] = run_schedules(backend, options, Path(args.results), log=lambda _m: None)
                pairs.setdefault(km, []).append((got["real"], got["replay"]))
                real = got["real"]
                print(f"{km:g} km round {r + 1}: " + ", ".join(
                    f"{s.schedule} real {s.step_time_s:.3f} s / replay {got['replay'].schedules[i].step_time_s:.3f} s"
                    for i, s in enumerate(real.schedules)) + f"; {real.compute_line()}", flush=True)
    finally:
        lifecycle.down(name)
    return report(pairs, schedules, args.tolerance)


def report(pairs: dict[float, list[tuple[RunSummary, RunSummary]]], schedules: list[str], tolerance: float) -> int:
    rows, worst = [], 0.0
    for km, runs in pairs.items():
        for i, schedule in enumerate(schedules):
            deltas, ideals, parts, residuals, steps = [], [], [], [], []
            for real_run, replay_run in runs:
                real, replay = real_run.schedules[i], replay_run.schedules[i]
                if real.breakdown is None or replay.breakdown is None or real.breakdown.ideal_step_s is None \
                        or replay.breakdown.ideal_step_s is None:
                    continue
                delta = real.breakdown.step_s - replay.breakdown.step_s
                ideal = real.breakdown.ideal_step_s - replay.breakdown.ideal_step_s
                part = compute_part(real)
                deltas.append(delta)
                ideals.append(ideal)
                parts.append(part)
                residuals.append(delta - ideal - part)
                steps.append(real.breakdown.step_s)
            if not deltas:
                continue
            share = max(abs(r) / s for r, s in zip(residuals, steps, strict=True))
            worst = max(worst, share)
            rows.append([f"{km:g}", schedule, f"{statistics.median(steps):.3f}", _ms(deltas), _ms(ideals), _ms(parts),
                         _ms(residuals), f"{share:.1%}"])
    print(table.render(["km", "schedule", "real step s", "real - replay ms", "ideal: reference - table ms",
                        "compute parts ms", "residual ms", "|residual| / step (worst)"], rows,
                       "\nreal minus replay, and what the real run's breakdown accounts for (medians over rounds)"))
    ok = worst <= tolerance
    print(("PASS" if ok else "FAIL") + f": the residual is within {worst:.1%} of the real step (bound {tolerance:.0%})")
    return 0 if ok else 1


def _ms(values: list[float]) -> str:
    return f"{statistics.median(values) * 1e3:+.1f}"


if __name__ == "__main__":
    sys.exit(main())
