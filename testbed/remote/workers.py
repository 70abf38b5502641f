"""One schedule's pipeline workers on several machines: configs copied, each worker started over its own SSH
channel, supervised (progress lines, a worker's failure with the end of its log, no progress for too long),
stopped by pid file whatever happened, and the rank traces fetched."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from testbed.remote.fleet import Fleet
from testbed.remote.inventory import Machine
from testbed.remote.replies import KillReply, PortReply
from testbed.remote.ssh import RemoteError
from testbed.run.runner import RunError, RunOptions
from testbed.run.summary import StageLink
from testbed.run.transport import TransportChoice
from testbed.util.interrupts import cleanup, raise_if_pending
from workloads.compute import CostTable
from workloads.records import RankTrace, WorkerConfig


def run_schedule(fleet: Fleet, schedule: str, options: RunOptions, chosen: list[Machine], links: list[StageLink],
                 out_dir: Path, run_id: str, transport: TransportChoice, table: CostTable | None = None
                 ) -> tuple[list[RankTrace], float]:
    """Rank i on chosen[i]; the traces and logs in out_dir, and the seconds spent fetching them."""
    master = chosen[0]
    port = fleet.agent(master, PortReply, "freeport", master.data_address).port
    remote_dirs = {m.name: f"{fleet.workdir(m)}/runs/{run_id}/{schedule}" for m in chosen}
    channels: list[Any] = []
    try:
        for rank, m in enumerate(chosen):
            session, facts = fleet.sessions[m.name], fleet.facts[m.name]
            folder = remote_dirs[m.name]
            config = WorkerConfig(
                rank=rank, world=len(chosen), master_addr=master.data_address, master_port=port, schedules=[schedule],
                microbatches=options.microbatches, microbatch_size=options.microbatch_size,
                iterations=options.iterations, model=options.model, split=options.split,
                link_delay_s=[lk.delay_s for lk in links], link_rate_bps=[lk.rate_bps for lk in links],
                memory_budget=options.memory_budget, lr=options.lr, seed=options.seed, out_dir=folder,
                cpu=rank % (facts.env.cpus or 1), timeout_s=max(60.0, options.hang_timeout_s),
                dump_gradients=options.dump_gradients, transport=transport.name, rdma_slots=options.rdma_slots,
                rdma_mtu=transport.path_rdma_mtu, rdma_device=transport.devices[rank].name if transport.devices else "",
                rdma_gid_index=transport.devices[rank].gid_index if transport.devices else -1,
                compute=options.compute.kind, cost_table=table)
            local = out_dir / f"worker-{rank}.json"
            local.parent.mkdir(parents=True, exist_ok=True)
            local.write_text(json.dumps(config.to_json(), indent=1))
            session.run(["mkdir", "-p", folder])
            session.put(local, f"{folder}/worker-{rank}.json")
            channels.append(session.start(
                ["env", f"PYTHONPATH={facts.project}", "OMP_NUM_THREADS=1", f"GLOO_SOCKET_IFNAME={m.nic}",
                 facts.python, "-m", "testbed.remote.agent", "worker", f"{folder}/worker-{rank}.json",
                 f"{folder}/worker-{rank}.log", f"{folder}/worker-{rank}.pid"]))
        supervise(fleet, chosen, channels, remote_dirs, options.hang_timeout_s)
    finally:
        with cleanup():
            stop_workers(fleet, chosen, channels, remote_dirs)
    fetch = time.monotonic()
    ranks = []
    for rank, m in enumerate(chosen):
        fleet.sessions[m.name].get(f"{remote_dirs[m.name]}/{schedule}/rank-{rank}.json", out_dir / f"rank-{rank}.json")
        fleet.sessions[m.name].get(f"{remote_dirs[m.name]}/worker-{rank}.log", out_dir / f"worker-{rank}.log")
        ranks.append(RankTrace.from_json(json.loads((out_dir / f"rank-{rank}.json").read_text())))
    return ranks, time.monotonic() - fetch


def stop_workers(fleet: Fleet, chosen: list[Machine], channels: list[Any], remote_dirs: dict[str, str]) -> None:
    """Close the workers' channels (their pty hangs up) and stop any still running by its pid file."""
    for channel in channels:
        channel.close()
    fleet.each("stop", lambda m: _stopped(fleet.agent(m, KillReply, "kill", f"{remote_dirs[m.name]}/worker-"
                                                      f"{chosen.index(m)}.pid")), chosen, stop=False)


def supervise(fleet: Fleet, chosen: list[Machine], channels: list[Any], remote_dirs: dict[str, str],
              hang_timeout_s: float) -> None:
    """Until every worker exited 0: its progress lines logged; a worker that fails stops the run with the end of
    its log; no line from any worker for hang_timeout_s stops it too."""
    buffers = [b"" for _ in channels]
    last = time.monotonic()
    while True:
        raise_if_pending()
        for rank, channel in enumerate(channels):
            while channel.recv_ready():
                buffers[rank] += channel.recv(65536)
                *lines, buffers[rank] = buffers[rank].split(b"\n")
                for line in lines:
                    last = time.monotonic()
                    progress(line, rank, len(channels), fleet.log)
            if channel.exit_status_ready() and not channel.recv_ready():
                code = channel.recv_exit_status()
                if code != 0:
                    m = chosen[rank]
                    tail = fleet.sessions[m.name].run(["tail", "-c", "1500", f"{remote_dirs[m.name]}/worker-{rank}.log"],
                                                      check=False).stdout
                    raise RemoteError(m.name, f"worker {rank} exited with {code}; the run was stopped. End of "
                                      f"its log:\n{tail.strip()}")
        if all(c.exit_status_ready() and c.recv_exit_status() == 0 for c in channels):
            return
        if time.monotonic() - last > hang_timeout_s:
            raise RunError(f"no progress for {hang_timeout_s:.0f} s; the run was stopped")
        time.sleep(0.05)


def progress(line: bytes, rank: int, world: int, log: Callable[[str], None]) -> None:
    """The last rank's iteration events, one line each."""
    try:
        event = json.loads(line.strip() or b"{}")
    except json.JSONDecodeError:
        return
    if event.get("event") == "iteration" and rank == world - 1:
        loss = event.get("loss")
        log(f"            iteration {event['iteration']}: {event['seconds']:.3f} s"
            + (f", loss {loss:.3f}" if loss is not None else ""))


def _stopped(result: KillReply) -> str:
    return "worker already ended" if result.stopped is None else f"worker {result.stopped} stopped"
