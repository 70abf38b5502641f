"""How often `verify --full` passes on correct links, and how often it fails a link shaped 5 % slow.

For each topology: bring it up (delay line), run the full verification N times back to back and count the
runs where every check passed (and which checks failed otherwise); then, on the first topology, set the
HTB rate of one OTN direction 5 % below its plan behind the testbed's back and count the runs in which that
direction's goodput check fails. Prints the pass rates; exit 1 unless N/N and N/N. Usage:
    .venv/bin/python bench/verify_repeat.py [--topologies 2dc-1000km,4dc-ring] [--runs 20] [--slow-runs 20]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from testbed.check.verify import verify_testbed  # noqa: E402
from testbed.deploy import lifecycle  # noqa: E402
from testbed.shaping.htb import change_rate  # noqa: E402
from testbed.util import table  # noqa: E402
from testbed.util.interrupts import unwinding  # noqa: E402
from testbed.util.paths import resolve_topology  # noqa: E402

SLOW_BY = 0.05


def repeat(topology: str, runs: int, slow_runs: int) -> dict:
    name = f"vr{os.getpid() % 10000}"
    lifecycle.up(resolve_topology(topology), name, shaper="delayline")
    try:
        backend = lifecycle.open_backend(name)
        passed, failures, seconds = 0, collections.Counter(), []
        for _ in range(runs):
            started = time.monotonic()
            report = verify_testbed(backend, level="full")
            seconds.append(time.monotonic() - started)
            passed += report.ok
            failures.update(f"{c.kind} {c.subject}: {c.measured}" for c in report.failures())
            print(f"  {topology}: {'pass' if report.ok else 'FAIL'} ({len(report.checks)} checks, "
                  f"{seconds[-1]:.0f} s)", flush=True)
        slow = {}
        if slow_runs:
            d = backend.state.plan.directions[0]
            with backend.netlink(d.src_node) as ipr:
                change_rate(ipr, d.src_ifname, d.rate_bps * (1 - SLOW_BY))
            caught, measured = 0, []
            for _ in range(slow_runs):
                report = verify_testbed(backend, level="full")
                check = next(c for c in report.checks if c.kind == "throughput" and c.subject == f"{d.link} {d.label}")
                caught += not check.ok
                measured.append(check.measured)
                print(f"  {topology} {d.label} at {1 - SLOW_BY:.0%} of its rate: "
                      f"{'caught' if not check.ok else 'MISSED'}: {check.measured}", flush=True)
            slow = {"direction": d.label, "runs": slow_runs, "caught": caught, "measured": measured}
        return {"topology": topology, "runs": runs, "passed": passed, "failures": dict(failures),
                "seconds_median": sorted(seconds)[len(seconds) // 2] if seconds else None, "slow": slow}
    finally:
        lifecycle.down(name)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--topologies", default="2dc-1000km,4dc-ring")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--slow-runs", type=int, default=20)
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("needs root (network namespaces)", file=sys.stderr)
        return 1
    results = [repeat(t, args.runs, args.slow_runs if i == 0 else 0)
               for i, t in enumerate(args.topologies.split(","))]
    rows = [(r["topology"], f"{r['passed']}/{r['runs']}", f"{r['seconds_median']:.0f}",
             f"{r['slow']['caught']}/{r['slow']['runs']} ({r['slow']['direction']})" if r["slow"] else "-")
            for r in results]
    print(table.render(["topology", "verify --full passed", "s per run", "5 % slow link failed"], rows, "\n"))
    for r in results:
        for failure, count in r["failures"].items():
            print(f"  {r['topology']}: {count}x {failure}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    ok = all(r["passed"] == r["runs"] and (not r["slow"] or r["slow"]["caught"] == r["slow"]["runs"]) for r in results)
    return 0 if ok else 1


if __name__ == "__main__":
    with unwinding():           # Ctrl-C, SIGTERM, SIGHUP: the testbed it brought up is removed
        sys.exit(main())
