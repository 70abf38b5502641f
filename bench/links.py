"""Link-emulation benchmark matrix: one-way delay x rate on a 2-DC topology, measured in one run.

For each (delay, rate): bring the 2-DC topology up with that link (queues and TCP buffers sized for it),
measure RTT (ICMP, timed after the ingress queue) against 2 x delay, TCP goodput against the rate, drops on
every stage, and the delay daemons' CPU; then tear down. Usage:
    .venv/bin/python bench/links.py [--shaper auto|delayline|netem] [--delays 0.1,1,5,20] [--rates 10,100,1000]
Goals (issue 3): RTT within max(3 %, 0.2 ms) of 2 x delay, goodput >= 96 % of what the rate allows at the MTU, zero drops,
delay-line CPU <= 25 % of one core at 1 Gbit.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from testbed.check import links as linkcheck  # noqa: E402
from testbed.check.links import MAX_GOODPUT_FRACTION, MIN_GOODPUT_FRACTION  # noqa: E402
from testbed.deploy import lifecycle  # noqa: E402
from testbed.probe.latency import round_trip  # noqa: E402
from testbed.probe.throughput import tcp_throughput  # noqa: E402
from testbed.shaping.registry import resolve, shaper_for  # noqa: E402
from testbed.util import table  # noqa: E402

GOODPUT_OF_RATE = (1500 - 52) / (1500 + 14)
"""TCP payload per HTB-metered frame at MTU 1500 (IP, TCP, timestamps; Ethernet header): 95.6 %."""

TOPOLOGY = """name: {name}
datacenters: {{dc-a: {{hosts: 1}}, dc-b: {{hosts: 1}}}}
links:
  - {{a: dc-a, b: dc-b, delay: {delay_ms}ms, rate: {rate_mbit}mbit}}
"""


def measure(delay_ms: float, rate_mbit: float, shaper: str, seconds: float) -> dict:
    name = f"bl{os.getpid() % 10000}"
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "link.yaml"
        path.write_text(TOPOLOGY.format(name=name, delay_ms=delay_ms, rate_mbit=rate_mbit))
        lifecycle.up(path, name, shaper=shaper)
    try:
        backend = lifecycle.open_backend(name)
        sh = shaper_for(backend)
        plan = backend.state.plan
        addr_b = plan.receiver_address(plan.direction("dc-a", "dc-b"))
        rtt = round_trip(backend.netns_path("dc-a-rtr"), addr_b, count=20, timeout_s=1 + 4 * delay_ms / 1e3)
        cpu = {n: linkcheck.daemon_cpu(sh, n) for n in ("dc-a-rtr", "dc-b-rtr")}
        tput = tcp_throughput(backend, "dc-a-rtr", "dc-b-rtr", addr_b, seconds=seconds)
        wall = tput.seconds + 1.0
        cpu_after = {n: linkcheck.daemon_cpu(sh, n) for n in cpu}
        cpu_share = [max(0.0, cpu_after[n] - cpu[n]) / wall for n in cpu if cpu[n] is not None]
        drops = sum(d.unintended for d in sh.drops()) if sh else 0
        record = backend.state.shaper
        calibration = record.calibration_s if record else {}
        return {"delay_ms": delay_ms, "rate_mbit": rate_mbit, "shaper": backend.state.shaper_name,
                "rtt_ms": rtt.median_s * 1e3, "rtt_lost": rtt.lost, "goodput_mbit": tput.bits_per_s / 1e6,
                "retransmits": tput.retransmits, "drops": drops,
                "daemon_cpu_max": max(cpu_share) if cpu_share else None,
                "calibration_us": max(calibration.values()) * 1e6 if calibration else None,
                "stage": "native path" if record and record.native else backend.state.shaper_name}
    finally:
        lifecycle.down(name)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shaper", default="auto")
    parser.add_argument("--delays", default="0.1,1,5,20", help="one-way delays, ms")
    parser.add_argument("--rates", default="10,100,1000", help="rates, Mbit/s")
    parser.add_argument("--seconds", type=float, default=4.0, help="iperf3 time per cell")
    parser.add_argument("--json", help="also write the rows to this file")
    parser.add_argument("--netem-vm", action="store_true",
                        help="also run the matrix with the netem shaper under the stock kernel (testbed vm, QEMU) "
                             "and print both side by side")
    args = parser.parse_args()
    shaper = resolve(args.shaper)
    rows, records, failures = [], [], 0
    for delay in (float(x) for x in args.delays.split(",")):
        for rate in (float(x) for x in args.rates.split(",")):
            r = measure(delay, rate, shaper, args.seconds)
            records.append(r)
            want = 2 * delay
            tol = max(0.03 * want, 0.2)
            rtt_ok = abs(r["rtt_ms"] - want) <= tol and not r["rtt_lost"]
            frac = r["goodput_mbit"] / rate
            tput_ok = MIN_GOODPUT_FRACTION <= frac / GOODPUT_OF_RATE <= MAX_GOODPUT_FRACTION
            cpu = r["daemon_cpu_max"]
            cpu_ok = cpu is None or rate < 1000 or cpu <= 0.25
            ok = rtt_ok and tput_ok and r["drops"] == 0 and cpu_ok
            failures += not ok
            rows.append((f"{delay:g}", f"{rate:g}", f"{want:.3f}", f"{r['rtt_ms']:.3f}",
                         f"{r['rtt_ms'] - want:+.3f}" + ("" if rtt_ok else " !"), f"{r['goodput_mbit']:.1f}",
                         f"{frac:.1%}" + ("" if tput_ok else " !"), r["retransmits"], r["drops"],
                         "-" if cpu is None else f"{cpu:.0%}" + ("" if cpu_ok else " !"),
                         "-" if r["calibration_us"] is None else f"{r['calibration_us']:.0f}", r["stage"],
                         "pass" if ok else "FAIL"))
            print(f"  {delay:g} ms x {rate:g} Mbit: rtt {r['rtt_ms']:.3f} ms, {r['goodput_mbit']:.1f} Mbit, "
                  f"drops {r['drops']}", flush=True)
    print(table.render(["delay ms", "rate Mbit", "2xdelay ms", "RTT ms", "RTT err ms", "goodput Mbit", "of rate",
                        "retrans", "drops", "daemon CPU", "calib us", "delay by", "result"], rows,
                       f"\nshaper {shaper}, kernel {os.uname().release}"))
    print(f"\n{len(rows) - failures}/{len(rows)} cells meet the goals (RTT within max(3 %, 0.2 ms) of 2 x delay, "
          f"goodput {MIN_GOODPUT_FRACTION:.0%}-{MAX_GOODPUT_FRACTION:.0%} of {GOODPUT_OF_RATE:.1%} of the rate, "
          "zero drops, daemon CPU <= 25 % at 1 Gbit)")
    if args.json:
        Path(args.json).write_text(json.dumps(records, indent=1))
    if args.netem_vm:
        print_side_by_side(records, run_netem_in_vm(args))
    return 0 if failures == 0 else 1


def run_netem_in_vm(args: argparse.Namespace) -> list[dict]:
    """The same matrix with netem, inside Debian's stock kernel under QEMU; its rows as JSON."""
    from testbed.backends.vm import run_in_vm

    out = Path("results/bench-links-vm").resolve()
    command = (f".venv/bin/python bench/links.py --shaper netem --delays {args.delays} --rates {args.rates} "
               f"--seconds {args.seconds:g} --json {out}/netem.json")
    print("\nnetem under the stock kernel (QEMU TCG: expect its own path jitter and CPU limits) ...", flush=True)
    run_in_vm(command, out)
    return list(json.loads((out / "netem.json").read_text()))


def print_side_by_side(host: list[dict], vm: list[dict]) -> None:
    rows = []
    for h, v in zip(host, vm, strict=True):
        rows.append((f"{h['delay_ms']:g}", f"{h['rate_mbit']:g}", f"{2 * h['delay_ms']:.3f}",
                     f"{h['rtt_ms']:.3f}", f"{v['rtt_ms']:.3f}", f"{h['goodput_mbit'] / h['rate_mbit']:.1%}",
                     f"{v['goodput_mbit'] / v['rate_mbit']:.1%}", f"{h['drops']}/{v['drops']}",
                     "-" if h["daemon_cpu_max"] is None else f"{h['daemon_cpu_max']:.0%}"))
    print(table.render(["delay ms", "rate Mbit", "2xdelay ms", f"RTT {host[0]['shaper']}", "RTT netem (VM)",
                        f"goodput {host[0]['shaper']}", "goodput netem (VM)", "drops host/VM", "daemon CPU"], rows,
                       "\nside by side"))


if __name__ == "__main__":
    sys.exit(main())
