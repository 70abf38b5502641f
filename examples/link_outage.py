"""A link outage in the middle of training: the dc-a <-> dc-b link carries nothing for 200 ms, 100 ms into the
second timed iteration of 1F1B, and comes back. The link is lossless, so nothing is dropped: its packets wait and
leave in order, the training completes, and the outage shows in the run's summary (`events`), in trace.json (an
`events` track, for chrome://tracing or ui.perfetto.dev) and in that iteration's time.

    sudo .venv/bin/python examples/link_outage.py [RESULTS_DIR]
"""

from __future__ import annotations

import sys

from testbed import At, Testbed, link_down

results = sys.argv[1] if len(sys.argv) > 1 else "results/examples"

with Testbed.up("2dc-1000km", name="ex-outage", log=None) as tb:
    outage = At(iteration=2, offset_s=0.1, action=link_down("dc-a", "dc-b", for_s=0.2))
    run = tb.run(["1f1b"], microbatches=8, iterations=3, compute="gpt-7b-h100", events=[outage],
                 results=results, log=None)

for event in run.events:
    print(f"{event['action']}: applied at {event['start_s']:.3f} s, undone at {event['end_s']:.3f} s "
          f"(trace time), restored: {event['restored']}")
for i, seconds in enumerate(run.iteration_times("1f1b"), start=1):
    print(f"iteration {i}: {seconds:.3f} s" + ("   <- the outage" if i == outage.iteration else ""))
print(f"lossless: {run.lossless_ok} (packets lost on lossless links: "
      f"{sum(lk.drops_during_run or 0 for lk in run.links if lk.lossless)})")
print(f"trace: {run.run_dir / 'trace.json'}")
