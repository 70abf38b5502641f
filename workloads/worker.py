"""One pipeline rank, run inside one emulated host: `python -m workloads.worker CONFIG.json`.

Rendezvous over the emulated network (gloo, TCP store on rank 0), a probe of the transport's per-message
cost, then every schedule of the run interleaved iteration by iteration (workloads/runs.py: each with its own
copy of the stage, optimizer and data, so each trains as it would alone): first one warm-up iteration of
each (excluded from metrics; geopipe's plan is made from it), then the reference compute (the stage's F and
B alone, once per model layout), then the timed iterations in ABBA order (A B, B A, A B, ...) so that the
host's slow and fast stretches fall on every schedule alike, then the reference again. Progress goes to
stdout as JSON lines; each schedule's trace is written to OUT/<schedule>/rank-<r>.json.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import sys
from pathlib import Path
from typing import Any

from workloads.commthreads import set_comm_affinity, set_comm_priority, uncap_comm_threads
from workloads.hostcpu import HostCpu
from workloads.layouts import TORCH_SCHEDULES, stage_layout
from workloads.probe import probe_message_cost
from workloads.records import RDMA, WorkerConfig
from workloads.runs import OursRun, TorchRun, activation_shape, log, measure_loaded_reference, measure_reference


def main(config_path: str) -> int:
    cfg = WorkerConfig.from_json(json.loads(Path(config_path).read_text()))
    if cfg.cgroup:                          # a dilated run: capped before any work (threads follow the process)
        Path(cfg.cgroup).write_text(str(os.getpid()))
    if cfg.cpu is not None:
        os.sched_setaffinity(0, {cfg.cpu})
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://{cfg.master_addr}:{cfg.master_port}", rank=cfg.rank,
                            world_size=cfg.world, timeout=datetime.timedelta(seconds=cfg.timeout_s))
    dist.barrier()                          # gloo's pairs and their I/O threads exist from here on
    if cfg.comm_cgroup:
        uncap_comm_threads(cfg.comm_cgroup)
    set_comm_priority(cfg.comm_priority)
    set_comm_affinity(cfg.comm_affinity)
    log("ready", rank=cfg.rank)
    try:
        traces = run_interleaved(cfg)
    finally:
        dist.destroy_process_group()
    for trace in traces:
        folder = Path(trace.config.out_dir, trace.schedule)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"rank-{cfg.rank}.json").write_text(json.dumps(trace.to_json()))
    log("done", rank=cfg.rank)
    return 0


def per_setting(cfg: WorkerConfig) -> list[WorkerConfig]:
    """The configuration of each link setting (its links, its traces' folder); one, as given, without any."""
    if not cfg.settings:
        return [cfg]
    return [dataclasses.replace(cfg, link_delay_s=list(s.link_delay_s), link_rate_bps=list(s.link_rate_bps),
                                out_dir=str(Path(cfg.out_dir, s.label)), schedules=list(s.schedules or cfg.schedules),
                                settings=[]) for s in cfg.settings]


def run_interleaved(cfg: WorkerConfig) -> list[Any]:
    """Every schedule of `cfg` under every link setting on this rank, interleaved: warm-ups setting by setting,
    then each timed round visits the settings in ABBA order and, within one, the schedules in ABBA order.
    The traces, setting by setting in `cfg.schedules` order."""
    import torch

    shape = activation_shape(cfg)
    if cfg.timed and cfg.cost_table is None:           # replay: this host's table, profiled now
        from workloads.hostprofile import profile_host

        cfg = dataclasses.replace(cfg, cost_table=profile_host(cfg, shape))
    elements = message_elements(cfg, int(torch.Size(shape).numel()))
    configs = per_setting(cfg)
    widest = max(configs, key=lambda c: max(c.link_delay_s, default=0.0))
    transport, detail = open_transport(widest, max(elements, default=1) * 4)
    host = HostCpu(cfg.watch)
    switch = LinkSwitch(cfg.rank)
    runs: list[list[OursRun | TorchRun]] = []
    for index, c in enumerate(configs):
        switch.to(index)
        message_cost = probe_message_cost(c, transport, elements)
        for name in c.schedules:
            Path(c.out_dir, name).mkdir(parents=True, exist_ok=True)
        runs.append([TorchRun(c, name, transport) if name in TORCH_SCHEDULES
                     else OursRun(c, name, transport, detail, message_cost, host) for name in c.schedules])
        for run in runs[-1]:
            run.iteration(0)
    everything = [run for group in runs for run in group]
    _reference(cfg, everything)
    _loaded_reference(runs, switch)
    for it in range(1, cfg.iterations + 1):
        for index in _abba(list(range(len(configs))), it):
            switch.to(index)
            for run in _abba(runs[index], it):
                run.iteration(it)
    for run in everything:
        run.finish()
    _reference(cfg, everything)
    _loaded_reference(runs, switch)
    transport.barrier()                  # every rank is done sending before any closes its queue pairs
    transport.close()
    return [run.trace() for run in everything]


def message_elements(cfg: WorkerConfig, activation_elements: int) -> list[int]:
    """Float32 elements of one message over each stage link: the model's activation, or the cost table's
    bytes on the wire (a deployment's message over the link's rate scale)."""
    if cfg.cost_table is None:
        return [activation_elements] * (cfg.world - 1)
    return [cfg.cost_table.wire_bytes(link) // 4 for link in range(cfg.world - 1)]


def _abba(items: list[Any], iteration: int) -> list[Any]:
    """In order on odd iterations, reversed on even ones: a drift of the host falls on every item alike."""
    return items if iteration % 2 else list(reversed(items))


class LinkSwitch:
    """Moves the run to another link setting: rank 0 asks the runner (a `link` event on stdout, then one line
    on stdin once it is in force), every rank waits at a barrier. Setting 0 is in force at the start."""

    def __init__(self, rank: int) -> None:
        self.rank, self.current = rank, 0

    def to(self, index: int) -> None:
        if index == self.current:
            return
        import torch.distributed as dist

        if self.rank == 0:
            log("link", rank=self.rank, setting=index)
            if not sys.stdin.readline():
                raise RuntimeError("the runner closed the link-switch channel")
        dist.barrier()
        self.current = index


LOADED_PASSES = 2
"""Loaded reference passes each time the reference is measured: the breakdown takes the least (the messages'
least toll on the compute; the rest of a run's cost stays the testbed's own)."""


def _reference(cfg: WorkerConfig, runs: list[OursRun | TorchRun]) -> None:
    """One reference per model layout (runs with the same layout compute the same), given to every run."""
    by_layout: dict[str, tuple[float, float]] = {}
    for run in runs:
        layout = stage_layout(run.name)
        if layout not in by_layout:
            by_layout[layout] = measure_reference(cfg, run)
        run.reference.append(by_layout[layout][0])
        run.reference_cpu.append(by_layout[layout][1])


def _loaded_reference(settings: list[list[OursRun | TorchRun]], switch: LinkSwitch) -> None:
    """Real compute: under each link setting in turn (the messages' cost on the cores depends on the links), the
    loaded reference (one stage's pass with one step's messages crossing beside it) LOADED_PASSES times, given
    to that setting's runs of ours (their model layout is one chunk a rank, the same for all of them)."""
    for index, runs in enumerate(settings):
        ours = [run for run in runs if isinstance(run, OursRun)]
        if not ours or ours[0].cfg.timed:
            continue
        switch.to(index)
        loaded = [measure_loaded_reference(ours[0].cfg, ours[0]) for _ in range(LOADED_PASSES)]
        for run in ours:
            run.reference_loaded.extend(loaded)


def open_transport(cfg: WorkerConfig, message_bytes: int) -> tuple[Any, dict[str, Any]]:
    """gloo over TCP, or RDMA queue pairs to the neighbouring ranks sized from the path between them. gloo's sends
    are posted from a thread of their own (workloads/transport.py: SenderThread) unless `cfg.sender` is inline."""
    from workloads.transport import GlooTransport, RdmaTransport, SenderThread

    if cfg.transport != RDMA.key or not any(s not in TORCH_SCHEDULES for s in cfg.schedules):
        if cfg.sender == "thread":
            return SenderThread(GlooTransport()), {"sends": "posted from a sender thread"}
        return GlooTransport(), {}
    from workloads.rdma.endpoint import LinkParams

    peers = {}
    for peer in (cfg.rank - 1, cfg.rank + 1):
        if 0 <= peer < cfg.world:
            boundary = min(peer, cfg.rank)
            peers[peer] = LinkParams.for_path(2 * cfg.link_delay_s[boundary], cfg.link_rate_bps[boundary],
                                              cfg.rdma_mtu[boundary], message_bytes, cfg.rdma_slots)
    transport = RdmaTransport(cfg.rdma_device, cfg.rdma_gid_index, cfg.rank, peers, timeout_s=cfg.timeout_s)
    detail = {"device": cfg.rdma_device, "pool_bytes": transport.pool_bytes(),
              "peers": {str(r): {"qps": p.qps, "rdma_mtu": p.rdma_mtu, "timeout_exp": p.timeout_exp,
                                 "slots": p.slots, "slot_bytes": p.slot_bytes} for r, p in peers.items()}}
    log("transport", rank=cfg.rank, transport=transport.name, **detail)
    return transport, detail


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
