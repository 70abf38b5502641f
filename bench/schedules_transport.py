"""1F1B (plain and with early receives) and GeoPipe over gloo TCP and over RDMA, on one shaped link, in one run.

    testbed vm --timeout 7200 --out results/vm -- .venv/bin/python bench/schedules_transport.py
                                                                        (make bench-schedules-transport)

Needs rxe in namespaces (Linux >= 7.1), so on this project's 2-core host it runs under QEMU TCG, where torch
computes ~100x slower than natively: a 5 ms link next to a TCG step is noise. The link is therefore scaled by
the same factor (`--time-scale`, default 100 inside the VM, 1 elsewhere): 2dc-softroce's 1000 km, 5 ms one
way, becomes 500 ms, so delay and compute keep their native proportion. The delay is measured (one-way
probes) and printed before the runs. Order: ABBA by default (tcp, rdma, rdma, tcp), so a drift of the host
over the run falls on both transports alike. Per transport and schedule: median step time, tokens/s, bubble
ratio and bubble vs the single-stage reference, all from the runs' summaries; then the ratios, GeoPipe's
against the strongest baseline (the faster 1F1B, over either transport), not only plain 1F1B over TCP.
Writes <out>/bench-schedules-transport.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

SCHEDULES = ("1f1b", "1f1b-prefetch", "geopipe")
"""1f1b-prefetch posts its receives early: over gloo TCP it is the strongest 1F1B a user would run."""
BASELINES = ("1f1b", "1f1b-prefetch")
TRANSPORTS = ("tcp", "rdma")
MODEL = ("--layers", "2", "--width", "32", "--heads", "2", "--seq-len", "16")
METRICS = ("step_time_s", "tokens_per_s", "bubble_ratio", "bubble_vs_reference")


def scaled_topology(source: Path, scale: float, out_dir: Path) -> Path:
    """The topology with every link's one-way delay (its distance at 5 us/km, or its delay) times `scale`."""
    from testbed.topology import load_topology

    spec = yaml.safe_load(source.read_text())
    topology = load_topology(source)
    for raw, link in zip(spec["links"], topology.links, strict=True):
        for key in ("distance", "distance_km", "delay"):
            raw.pop(key, None)
        raw["delay"] = f"{link.a_to_b.delay_s * scale * 1e3:g}ms"
    spec["name"] = f"{spec['name']}-x{scale:g}"
    path = out_dir / f"{spec['name']}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def one_run(name: str, transport: str, schedules: list[str], microbatches: int, results: Path) -> list[dict]:
    """One `testbed run` of `schedules` over `transport`; their summaries' schedule entries."""
    before = set(results.glob("*/summary.json"))
    cmd = [str(REPO / ".venv/bin/testbed"), "run", name, "--transport", transport, "--schedule", ",".join(schedules),
           "--microbatches", str(microbatches), "--microbatch-size", "1", "--iterations", "1", *MODEL,
           "--hang-timeout", "900", "--results", str(results)]
    subprocess.run(cmd, check=True, timeout=3600)
    new = sorted(set(results.glob("*/summary.json")) - before)
    summary = json.loads(new[-1].read_text())
    assert summary["transport"].startswith("rdma" if transport == "rdma" else "gloo"), summary["transport"]
    return summary["schedules"]


def main() -> int:
    in_vm = bool(os.environ.get("TESTBED_IN_VM"))
    out_root = Path(os.environ.get("TESTBED_VM_OUT", REPO / "results"))
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--topology", default=str(REPO / "topologies" / "2dc-softroce.yaml"))
    parser.add_argument("--time-scale", type=float, default=100.0 if in_vm else 1.0)
    parser.add_argument("--order", default="tcp,rdma,rdma,tcp",
                        help="transports in run order (ABBA: a drift over the run falls on both alike)")
    parser.add_argument("--schedules", default=",".join(SCHEDULES))
    parser.add_argument("--microbatches", type=int, default=8)
    parser.add_argument("--out", default=str(out_root / "bench-schedules-transport.json"))
    args = parser.parse_args()
    order, schedules = args.order.split(","), args.schedules.split(",")
    if set(order) - set(TRANSPORTS):
        parser.error(f"--order: transports are {', '.join(TRANSPORTS)}")
    sys.stdout.reconfigure(line_buffering=True)     # through the VM's console as it happens

    from testbed.check.links import check_delays
    from testbed.deploy import lifecycle

    name = f"bs{os.getpid() % 10000}"
    results = out_root / "bench-schedules-transport"
    results.mkdir(parents=True, exist_ok=True)
    rows: dict[tuple[str, str], list[dict]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        topology = scaled_topology(Path(args.topology), args.time_scale, Path(tmp))
        result = lifecycle.up(topology, name, rdma="softroce")
        try:
            backend = lifecycle.open_backend(name)
            delays = check_delays(backend, probes=5)
            for c in delays:
                print(f"{c.kind:8} {c.subject:30} {c.expected:22} {c.measured:30} {'pass' if c.ok else 'FAIL'}")
            for transport in order:
                for entry in one_run(name, transport, schedules, args.microbatches, results):
                    rows.setdefault((transport, entry["schedule"]), []).append(entry)
                Path(args.out).write_text(json.dumps({"partial": True, "order": order,   # kept if stopped later
                                                      "runs": {f"{t}/{s}": v for (t, s), v in rows.items()}}))
        finally:
            lifecycle.down(name)

    plan = result.plan
    d = plan.directions[0]
    table = {f"{t}/{s}": {m: statistics.median(e[m] for e in rows[(t, s)]) for m in METRICS} | {"runs": len(rows[(t, s)])}
             for t in TRANSPORTS for s in schedules if (t, s) in rows}
    Path(args.out).write_text(json.dumps({"topology": plan.topology, "time_scale": args.time_scale,
                                          "delay_s": d.delay_s, "rate_bps": d.rate_bps,
                                          "microbatches": args.microbatches, "model": MODEL,
                                          "kernel": os.uname().release, "tcg": in_vm,
                                          "delay_checks": [c.to_json() for c in delays],
                                          "medians": table,
                                          "runs": {f"{t}/{s}": v for (t, s), v in rows.items()}}, indent=1))
    print(f"{plan.topology}: {d.delay_s * 1e3:g} ms one way (x{args.time_scale:g}), {d.rate_bps / 1e6:g} Mbit/s; "
          f"{args.microbatches} micro-batches; kernel {os.uname().release}{' under QEMU TCG' if in_vm else ''}")
    print(f"{'transport':9} {'schedule':13} {'step':>8} {'tokens/s':>9} {'bubble':>7} {'vs ref':>7} runs")
    for key, v in table.items():
        t, s = key.split("/")
        print(f"{t:9} {s:13} {v['step_time_s']:7.2f}s {v['tokens_per_s']:9.1f} {v['bubble_ratio']:7.3f} "
              f"{v['bubble_vs_reference']:7.3f} {v['runs']}")
    step = {key: v["step_time_s"] for key, v in table.items()}
    for s in schedules:
        if f"rdma/{s}" in step and f"tcp/{s}" in step:
            print(f"{s}: step time rdma/tcp {step[f'rdma/{s}'] / step[f'tcp/{s}']:.3f}")
    for t in TRANSPORTS:
        baselines = [(step[f"{t}/{b}"], b) for b in BASELINES if f"{t}/{b}" in step]
        if baselines and f"{t}/geopipe" in step:
            best, which = min(baselines)
            print(f"{t}: step time geopipe / strongest baseline ({which}) {step[f'{t}/geopipe'] / best:.3f}")
    if "rdma/geopipe" in step and any(f"{t}/{b}" in step for t in TRANSPORTS for b in BASELINES):
        best, which = min((step[f"{t}/{b}"], f"{b} over {t}") for t in TRANSPORTS for b in BASELINES
                          if f"{t}/{b}" in step)
        print(f"geopipe over rdma / strongest baseline anywhere ({which}): {step['rdma/geopipe'] / best:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
