"""Soak: continuous pipeline training across a topology on the delay line for a long stretch.

Trains back to back (1f1b, then gpipe, again and again) across every host of the topology, and every
`--sample` seconds measures, without stopping the training: unintended drops on every OTN direction, the
the delay line's own release lateness (each packet's release against arrival + delay, from the daemons),
probe delays of every direction (never short; long only by queueing behind the training), and each
daemon's resident memory and CPU rate. Passes on zero drops, mean lateness within 0.1 ms in every window,
no short probe, a clean idle delay check at the end, and no daemon whose memory or CPU grows. Usage:
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
from typing import cast

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from testbed.check.links import check_delays  # noqa: E402
from testbed.deploy import lifecycle  # noqa: E402
from testbed.run.runner import RunOptions, run_schedules  # noqa: E402
from testbed.shaping.delayline_shaper import DelaylineShaper  # noqa: E402
from testbed.shaping.registry import shaper_for  # noqa: E402
from testbed.util import table  # noqa: E402
from testbed.util.interrupts import unwinding  # noqa: E402
from testbed.util.paths import resolve_topology  # noqa: E402

MEMORY_GROWTH_LIMIT = 0.10
"""A daemon's RSS at the end may exceed its RSS after the first sample by at most 10 %."""
CPU_GROWTH_LIMIT = 1.5
LATENESS_LIMIT_US = 100.0
"""Mean lateness of released packets per sampling window: the one-way delay tolerance's 0.1 ms floor. The
daemon adds up only positive lateness (an early release counts as zero), so this mean is an upper bound on
the release error; the probes' delay checks (the verify criterion) are the like-for-like figure."""
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
    """Drops, the delay line's own release lateness (cumulative), probe delays, daemon memory and CPU.

    Probes cross links that carry the training's traffic, so they also see queueing behind it: a probe may
    come out long (queueing, as on a real loaded link) but never short (a missing or shortened hold)."""
    delays = check_delays(backend, probes=10)  # type: ignore[arg-type]
    short = [f"{c.subject}: {c.measured} (want {c.expected})" for c in delays if not c.ok
             and _ms(c.measured) < _ms(c.expected) - _ms(c.expected.split("±")[1])]
    long = [c for c in delays if not c.ok and f"{c.subject}: {c.measured} (want {c.expected})" not in short]
    drops = {d.direction: d.unintended for d in shaper.drops()}
    daemons, lateness = {}, {}
    for node in shaper.record.daemons:
        status, stats = shaper.supervisor_status(node), shaper.daemon_stats(node)
        daemons[node] = {"rss_kib": rss_kib(status.daemon_pid if status else None),
                         "cpu_s": stats.cpu_s if stats else None, "restarts": status.restarts if status else None}
        for q, qs in (stats.queues.items() if stats else []):
            lateness[f"{node}/{q}"] = {"released": qs.released, "late_us_sum": qs.late_us_sum,
                                       "late_us_max": qs.late_us_max}
    return {"t_s": time.monotonic() - started, "drops": drops, "short": short,
            "queued_ms_max": max((_ms(c.measured) - _ms(c.expected.split("±")[0]) for c in long), default=0.0),
            "lateness": lateness, "daemons": daemons}


def _ms(text: str) -> float:
    """`8.048 ms median of 10` or `5 ms ± 2.891 ms` or `750 us` -> milliseconds."""
    value, unit = text.split()[:2]
    return float(value) * {"ms": 1.0, "us": 1e-3, "s": 1e3}[unit]


def _window_lateness_us(a: dict, b: dict) -> float:
    """Mean lateness of the packets released between two samples, over every delay-line queue."""
    released = sum(b["lateness"][k]["released"] - a["lateness"].get(k, {}).get("released", 0) for k in b["lateness"])
    late = sum(b["lateness"][k]["late_us_sum"] - a["lateness"].get(k, {}).get("late_us_sum", 0.0) for k in b["lateness"])
    return late / released if released else 0.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--topology", default="4dc-ring")
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--sample", type=float, default=60.0, help="seconds between samples")
    parser.add_argument("--results", default="results/soak")
    parser.add_argument("--schedules", default="1f1b,gpipe",
                        help="trained in turn")
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
        assert shaper is not None and shaper.daemon_role is not None, "the soak measures a delay line's daemons"
        shaper = cast(DelaylineShaper, shaper)
        stages = len(backend.state.plan.hosts)
        options = RunOptions(schedules=args.schedules.split(","), microbatches=16, iterations=8, hang_timeout_s=120,
                             stages=stages, placement="fill",
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
                late = _window_lateness_us(samples[-2], s) if len(samples) > 1 else 0.0
                print(f"[{s['t_s']:6.0f} s] runs {runs}, drops {sum(s['drops'].values())}, release lateness "
                      f"{late:.0f} us mean, probes {'never short' if not s['short'] else 'SHORT: ' + '; '.join(s['short'])}"
                      f" (queueing behind training up to {s['queued_ms_max']:.1f} ms), daemon RSS "
                      + ", ".join(f"{n} {d['rss_kib']} KiB" for n, d in s["daemons"].items()), flush=True)
        stop.set()
        samples.append(sample(shaper, backend, started))
        idle = check_delays(backend, probes=20)
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
    drops = sum(last["drops"].values())
    windows = [_window_lateness_us(a, b) for a, b in zip(samples, samples[1:], strict=False)]
    late_max = max((v["late_us_max"] for v in last["lateness"].values()), default=0.0)
    never_short = all(not s["short"] for s in samples)
    idle_ok = all(c.ok for c in idle)
    delays_ok = never_short and idle_ok and max(windows, default=0.0) <= LATENESS_LIMIT_US
    print(f"drops on lossless links: {drops}; delay line release lateness per minute: mean "
          f"{min(windows, default=0):.0f}-{max(windows, default=0):.0f} us (limit {LATENESS_LIMIT_US:.0f}), worst "
          f"single packet {late_max / 1e3:.2f} ms; probes short in {sum(bool(s['short']) for s in samples)}/{len(samples)}"
          f" samples; queueing behind training up to {max(s['queued_ms_max'] for s in samples):.1f} ms; idle check "
          f"after the soak {sum(c.ok for c in idle)}/{len(idle)}; daemon memory and CPU steady: "
          f"{'yes' if growth_ok else 'NO'}" + (f"; training failed: {failures[0]}" if failures else ""))
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
    with unwinding():           # Ctrl-C, SIGTERM, SIGHUP: the testbed it brought up is removed
        sys.exit(main())
