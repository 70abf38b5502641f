"""RDMA vs TCP between two emulated DCs, side by side in one run: the same message sizes over the same shaped
link, through the two transports the pipeline workers use (gloo over TCP, RC queue pairs over SoftRoCE).

    testbed vm -- .venv/bin/python bench/transport.py         (needs rxe in namespaces: Linux >= 7.1)

Per size, two figures per transport, medians of REPEATS:
  one-way   ping-pong round trip / 2 (the receive is posted before the message leaves);
  late recv the receiver posts its receive only after the message could have arrived (as 1F1B posts just in
            time): the time from posting to having the data. gloo's TCP sends wait for the receiver, so this
            costs about a round trip plus the transfer; an RDMA write has already landed in a slot.
Prints a table and writes results/bench-transport.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

SIZES = (4 * 1024, 64 * 1024, 1024 * 1024)
REPEATS = 5


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    from workloads.rdma.endpoint import LinkParams
    from workloads.transport import GlooTransport, RdmaTransport

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://{args.master}", rank=args.rank, world_size=2)
    peer = 1 - args.rank
    params = LinkParams.for_path(2 * args.delay, args.rate, 4096, max(SIZES), slots=4)
    transports = {"tcp": GlooTransport(), "rdma": RdmaTransport(args.device, args.gid_index, args.rank,
                                                                 {peer: params})}
    late_wait = 2 * args.delay + max(SIZES) * 8 / args.rate + 0.05
    results = []
    for size in SIZES:
        for name, t in transports.items():
            buf = torch.zeros(size // 4)
            one_way, late = [], []
            tag = 0
            for _ in range(REPEATS):
                tag += 1
                t.barrier()
                if args.rank == 0:
                    t0 = time.monotonic()
                    back = t.irecv(buf, peer, tag)
                    t.isend(buf, peer, tag).wait()
                    back.wait()
                    one_way.append((time.monotonic() - t0) / 2)
                else:
                    t.irecv(buf, peer, tag).wait()
                    t.isend(buf, peer, tag).wait()
                tag += 1
                t.barrier()
                if args.rank == 0:
                    sent = t.isend(buf, peer, tag)
                    sent.wait()
                else:
                    time.sleep(late_wait)
                    t0 = time.monotonic()
                    t.irecv(buf, peer, tag).wait()
                    late.append(time.monotonic() - t0)
            box = [None, None]
            dist.all_gather_object(box, {"one_way": one_way, "late": late})
            if args.rank == 0:
                results.append({"size": size, "transport": name, "one_way_s": statistics.median(box[0]["one_way"]),
                                "late_recv_s": statistics.median(box[1]["late"]),
                                "one_way_all": box[0]["one_way"], "late_all": box[1]["late"]})
    transports["tcp"].barrier()
    transports["rdma"].close()
    dist.destroy_process_group()
    if args.rank == 0:
        Path(args.out).write_text(json.dumps(results, indent=1))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--topology", default=str(REPO / "topologies" / "2dc-softroce.yaml"))
    parser.add_argument("--out", default=str(Path(os.environ.get("TESTBED_VM_OUT", REPO / "results"))
                                             / "bench-transport.json"))
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--rank", type=int, default=0)
    parser.add_argument("--master", default="")
    parser.add_argument("--device", default="")
    parser.add_argument("--gid-index", type=int, default=1)
    parser.add_argument("--delay", type=float, default=0.0)
    parser.add_argument("--rate", type=float, default=1e9)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return 0

    from testbed.deploy import lifecycle
    from testbed.util import units

    name = f"bt{os.getpid() % 10000}"
    result = lifecycle.up(Path(args.topology), name, rdma="softroce")
    try:
        backend = lifecycle.open_backend(name)
        plan = result.plan
        a, b = plan.hosts[0], plan.hosts[-1]
        d = plan.direction(a.dc, b.dc)
        record = backend.state.rdma
        assert record is not None
        procs = []
        for rank, host in enumerate((a, b)):
            device = record.device_of(host.name)
            assert device is not None
            procs.append(backend.popen(host.name, [
                sys.executable, str(Path(__file__).resolve()), "--worker", "--rank", str(rank), "--master",
                f"{a.ip()}:29611", "--device", device.name, "--gid-index", str(device.gid_index), "--delay",
                repr(d.delay_s), "--rate", repr(d.rate_bps), "--out", args.out],
                env={**os.environ, "PYTHONPATH": str(REPO), "GLOO_SOCKET_IFNAME": "eth0"}))
        codes = [p.wait(timeout=1800) for p in procs]
        if any(codes):
            raise SystemExit(f"bench workers exited {codes}")
    finally:
        lifecycle.down(name)
    rows = json.loads(Path(args.out).read_text())
    print(f"{plan.topology}: {units.format_time(d.delay_s)} one way, {units.format_rate(d.rate_bps)}; "
          f"kernel {os.uname().release}{' under QEMU TCG' if os.environ.get('TESTBED_IN_VM') else ''}")
    print(f"{'size':>8}  {'transport':9}  {'one-way':>9}  {'late recv':>9}")
    for r in rows:
        print(f"{units.format_size(r['size']):>8}  {r['transport']:9}  {r['one_way_s'] * 1e3:7.1f}ms  "
              f"{r['late_recv_s'] * 1e3:7.1f}ms")
    by = {(r["size"], r["transport"]): r for r in rows}
    for size in SIZES:
        tcp, rdma = by[(size, "tcp")], by[(size, "rdma")]
        print(f"ratio tcp/rdma at {units.format_size(size)}: one-way {tcp['one_way_s'] / rdma['one_way_s']:.2f}x, "
              f"late recv {tcp['late_recv_s'] / max(rdma['late_recv_s'], 1e-6):.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
