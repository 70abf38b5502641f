"""A sweep of one's own: the cross-DC link's distance x rate, 1F1B against GeoPipe, into one plot.

Every point runs in one launch of the workers (the link is set to each in turn between iterations, as the
experiment's distance sweep does), with the compute of a 7B-class GPT on H100s replayed as time
(profiles/gpt-7b-h100.yaml), so that the network, the schedules and the memory budget are real and the run is
short. The rows have the columns of an experiment's points.csv (a pandas DataFrame where pandas is installed).

    sudo .venv/bin/python examples/sweep_rate_distance.py [RESULTS_DIR]
"""

from __future__ import annotations

import sys
from pathlib import Path

from testbed import Testbed

results = Path(sys.argv[1] if len(sys.argv) > 1 else "results/examples")

with Testbed.up("2dc-1000km", name="ex-sweep", log=None) as tb:
    grid = tb.link("dc-a", "dc-b").sweep(distances_km=[0, 1000, 2000], rates=["1gbit", "200mbit"])
    run = tb.run(["1f1b", "geopipe"], microbatches=4, iterations=2, compute="gpt-7b-h100", sweep=grid,
                 results=results, log=None)

rows = run.rows()
print(f"{'rate':>9} {'km':>5} {'schedule':>9} {'step (s)':>9} {'bubble':>7}")
for r in sorted(rows, key=lambda r: (-r["rate_mbit"], r["distance_km"], r["schedule"])):
    print(f"{r['rate_mbit']:>6g} Mb {r['distance_km']:>5g} {r['schedule']:>9} {r['step_s']:>9.3f} "
          f"{r['bubble_vs_reference']:>7.3f}")

import matplotlib  # noqa: E402 - only once the measuring is done

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

fig, ax = plt.subplots(figsize=(6, 4))
for (schedule, rate), style in zip(sorted({(r["schedule"], r["rate_mbit"]) for r in rows}), ["-o", "--o", "-s", "--s"],
                                   strict=False):
    points = sorted((r["distance_km"], r["bubble_vs_reference"]) for r in rows
                    if r["schedule"] == schedule and r["rate_mbit"] == rate)
    ax.plot(*zip(*points, strict=True), style, label=f"{schedule}, {rate:g} Mbit/s")
ax.set_xlabel("distance between the DCs (km)")
ax.set_ylabel("bubble (1 - compute alone / step)")
ax.set_title("7B GPT on H100s, 2 stages over 2 DCs, 4 micro-batches")
ax.legend()
fig.tight_layout()
plot = run.run_dir / "bubble_rate_distance.png"
fig.savefig(plot, dpi=120)
print(f"plot: {plot}")
