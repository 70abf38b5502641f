"""Soak: continuous pipeline training across a topology on the delay line for a long stretch.

Trains back to back (1f1b, then gpipe, again and again) across every host of the topology, and every
`--sample` seconds measures, without stopping the training: unintended drops on every OTN direction, the
one-way delay of each direction against the plan (the same check as `verify`), and each delay daemon's
resident memory and CPU rate (from /proc and its own statistics). Passes when there are zero drops, every
delay check holds in every sample, and no daemon's memory or CPU grows over the soak. Usage:
    .venv/bin/python bench/soak.py [--topology 4dc-ring] [--minutes 30] [--sample 60]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from testbed.check.links import check_delays  # noqa: E402
from testbed.deploy import lifecycle  # noqa: E402
from testbed.run.runner import RunOptions, run_schedules  # noqa: E402
from testbed.shaping.delayline_shaper import DelaylineShaper  # noqa: E402
from testbed.shaping.registry import shaper_for  # noqa: E402
from testbed.util import table  # noqa: E402
from testbed.util.paths import resolve_topology  # noqa: E402

MEMORY_GROWTH_LIMIT = 0.10
"""A daemon's RSS at the end may exceed its RSS after the first sample by at most 10 %."""
CPU_GROWTH_LIMIT = 1.5
"""A daemon's CPU rate in the last third of the soak may be at most 1.5 x the first third's."""


def rss_kib(pid: int | None) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except (FileNotFoundError, TypeError):
        return None
    return None


def sample(shaper: DelaylineShaper, backend: object, started: float) -> dict:
    delays = check_delays(backend, probes=10)  # type: ignore[arg-type]
    drops = {d.direction: d.unintended for d in shaper.drops()}
    daemons = {}
    for node in shaper.record.daemons:
        status, stats = shaper.supervisor_status(node), shaper.daemon_stats(node)
        daemons[node] = {"rss_kib": rss_kib(status.daemon_pid if status else None),
                         "cpu_s": stats.cpu_s if stats else None, "restarts": status.restarts if status else None}
    return {"t_s": time.monotonic() - started, "drops": drops, "delays_ok": all(c.ok for c in delays),
            "delay_failures": [f"{c.subject}: {c.measured} (want {c.expected})" for c in delays if not c.ok],
            "daemons": daemons}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--topology", default="4dc-ring")
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--sample", type=float, default=60.0, help="seconds between samples")
    parser.add_argument("--results", default="results/soak")
    parser.add_argument("--schedules", default="1f1b,gpipe",
                        help="trained in turn (geopipe's sizing deadlocks beyond 2-3 stages today: issue 13)")
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("needs root (network namespaces)", file=sys.stderr)
        return 1
    name = f"soak{os.getpid() % 10000}"
    lifecycle.up(resolve_topology(args.topology), name, shaper="delayline")
    samples: list[dict] = []
    runs = 0
    try:
        backend = lifecycle.open_backend(name)
        shaper = shaper_for(backend)
        assert isinstance(shaper, DelaylineShaper)
        stages = len(backend.state.plan.hosts)
        options = RunOptions(schedules=args.schedules.split(","), microbatches=16, iterations=8, hang_timeout_s=120,
                             model={"n_layer": stages, "n_embd": 64, "n_head": 2, "block_size": 32})
        started = time.monotonic()
        deadline = started + args.minutes * 60
        stop = threading.Event()
        failures: list[BaseException] = []

        def train() -> None:
            nonlocal runs
            try:
                while not stop.is_set() and time.monotonic() < deadline:
                    run_schedules(backend, options, Path(args.results), run_id=f"{name}-{runs:04d}", log=lambda _m: None)
                    runs += 1
            except BaseException as exc:   # noqa: BLE001 - reported below
                failures.append(exc)

        trainer = threading.Thread(target=train, daemon=True)
        trainer.start()
        while trainer.is_alive():
            trainer.join(timeout=args.sample)
            if trainer.is_alive() or not samples:
                samples.append(sample(shaper, backend, started))
                s = samples[-1]
                print(f"[{s['t_s']:6.0f} s] runs {runs}, drops {sum(s['drops'].values())}, delays "
                      f"{'ok' if s['delays_ok'] else 'OFF: ' + '; '.join(s['delay_failures'])}, daemon RSS "
                      + ", ".join(f"{n} {d['rss_kib']} KiB" for n, d in s["daemons"].items()), flush=True)
        stop.set()
        samples.append(sample(shaper, backend, started))
    finally:
        lifecycle.down(name)
    first, last = samples[0], samples[-1]
    thirds = max(1, len(samples) // 3)
    rows, growth_ok = [], True
    for node in first["daemons"]:
        rss0, rss1 = first["daemons"][node]["rss_kib"], last["daemons"][node]["rss_kib"]
        early = _cpu_rate(samples[:thirds + 1], node)
        late = _cpu_rate(samples[-thirds - 1:], node)
        mem_ok = rss0 is not None and rss1 is not None and rss1 <= rss0 * (1 + MEMORY_GROWTH_LIMIT)
        cpu_ok = early is not None and late is not None and late <= max(early, 0.01) * CPU_GROWTH_LIMIT
        growth_ok &= mem_ok and cpu_ok
        rows.append((node, rss0, rss1, f"{early:.1%}" if early is not None else "-",
                     f"{late:.1%}" if late is not None else "-", last["daemons"][node]["restarts"],
                     "ok" if mem_ok and cpu_ok else "GROWS"))
    print(table.render(["daemon", "RSS KiB first", "RSS KiB last", "CPU first third", "CPU last third", "restarts",
                        "result"], rows, f"\n{args.topology}: {runs} runs in {last['t_s'] / 60:.1f} min, "
                                         f"{len(samples)} samples"))
    drops = sum(sum(s["drops"].values()) for s in samples[-1:])
    delays_ok = all(s["delays_ok"] for s in samples)
    print(f"drops on lossless links: {drops}; delay checks within tolerance in {sum(s['delays_ok'] for s in samples)}"
          f"/{len(samples)} samples; daemon memory and CPU steady: {'yes' if growth_ok else 'NO'}"
          + (f"; training failed: {failures[0]}" if failures else ""))
    out = Path(args.results)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps({"topology": args.topology, "runs": runs, "samples": samples}, indent=1))
    return 0 if drops == 0 and delays_ok and growth_ok and not failures and runs > 0 else 1


def _cpu_rate(window: list[dict], node: str) -> float | None:
    a, b = window[0], window[-1]
    ca, cb = a["daemons"][node]["cpu_s"], b["daemons"][node]["cpu_s"]
    if ca is None or cb is None or b["t_s"] <= a["t_s"]:
        return None
    return (cb - ca) / (b["t_s"] - a["t_s"])


if __name__ == "__main__":
    sys.exit(main())
