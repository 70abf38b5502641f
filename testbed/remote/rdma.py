"""The RDMA transport across machines: chosen by the single machine's rule (testbed.run.transport.decide), each
stage's machine given an rxe device on its shaped NIC by its agent (recorded there before it exists, removed by
`unshape` at teardown), the RDMA MTU per stage boundary from both devices and the path, and RDMA verify per
stage boundary between DCs (the single machine's probe and judges)."""

from __future__ import annotations

import json
from typing import Any

from testbed.backends.vm import in_vm
from testbed.check.checks import Check
from testbed.check.rdma import BULK_BYTES, OWN_PINGS, PINGS, OwnRoundTrip, judge_rate, judge_rtt
from testbed.rdma.probe import ProbeResult
from testbed.rdma.softroce import rdma_mtu_for
from testbed.remote.fleet import Fleet, read_line
from testbed.remote.hostshape import path_of
from testbed.remote.inventory import Machine
from testbed.remote.replies import ListeningReply, PortReply, RxeReply
from testbed.remote.verify import dc_pair
from testbed.run.transport import TransportChoice, decide, path_ip_mtu, schedules_missing
from testbed.state.records import RxeDevice
from workloads.records import TCP

PROBE_TIMEOUT_S = 120.0


def rdma_missing(fleet: Fleet, chosen: list[Machine], schedules: list[str]) -> str:
    """Why these machines cannot train over RDMA ('' when they can): each machine's own answer (`env`), then
    the schedules."""
    lacking = [f"{m.name}: {fleet.facts[m.name].env.rdma}" for m in chosen
               if m.name in fleet.facts and fleet.facts[m.name].env.rdma]
    return "; ".join(lacking) or schedules_missing(schedules)


def check_transport(fleet: Fleet, requested: str, chosen: list[Machine], schedules: list[str]) -> tuple[str, str]:
    """The transport these machines will use and why, decided before anything is set up (no device made)."""
    return decide(requested, "" if requested == TCP.key else rdma_missing(fleet, chosen, schedules))


def choose_transport(fleet: Fleet, plan: Any, requested: str, chosen: list[Machine],
                     schedules: list[str]) -> TransportChoice:
    """The run's transport; for RDMA every stage's machine gets (or keeps) its rxe device first."""
    key, reason = check_transport(fleet, requested, chosen, schedules)
    if key == TCP.key:
        return TransportChoice(key, reason)
    devices: dict[str, RxeDevice] = {}

    def give(m: Machine) -> str:
        index = fleet.inventory.machines.index(m)
        reply = fleet.agent(m, RxeReply, "rxe", fleet.testbed, m.name, str(index), m.data_address, root=True)
        devices[m.name] = RxeDevice(node=m.name, name=reply.name, netdev=reply.netdev, gid_index=reply.gid_index,
                                    gid=reply.gid, active_mtu=reply.active_mtu)
        return (f"rxe {reply.name} on {reply.netdev}: GID index {reply.gid_index}, RDMA MTU {reply.active_mtu}"
                + ("" if reply.created else " (there already)"))

    fleet.each("rdma", give, chosen)
    stages = [devices[m.name] for m in chosen]
    return TransportChoice(key, reason.replace("every stage has", "every stage's machine has"), devices=stages,
                           path_rdma_mtu=boundary_mtus(plan, chosen, stages))


def boundary_mtus(plan: Any, chosen: list[Machine], devices: list[RxeDevice]) -> list[int]:
    """Per stage boundary: the largest RDMA MTU both ports run at and the path's IP MTU carries."""
    return [min(a_dev.active_mtu, b_dev.active_mtu, rdma_mtu_for(path_ip_mtu(plan, a.dc, b.dc)))
            for a, b, a_dev, b_dev in zip(chosen, chosen[1:], devices, devices[1:], strict=False)]


def verify_rdma(fleet: Fleet, plan: Any, chosen: list[Machine], devices: list[RxeDevice],
                mtus: list[int]) -> list[Check]:
    """RDMA verify across machines, as on one machine (testbed/check/rdma.py's judges): per stage boundary that
    crosses DCs the round trip over the two rxe devices (less the probe's own on the sending machine) and the
    goodput each way, with the endpoint the workers use."""
    tcg = in_vm()
    checks: list[Check] = []
    for a, b, a_dev, b_dev, mtu in zip(chosen, chosen[1:], devices, devices[1:], mtus, strict=False):
        if a.dc == b.dc:
            continue
        rtt_s = path_of(plan, a.dc, b.dc)[0] + path_of(plan, b.dc, a.dc)[0]
        run = probe(fleet, plan, a, b, a_dev, b_dev, mtu, rtt_s)
        own = probe(fleet, plan, a, a, a_dev, a_dev, mtu, 0.001, size=4096, count=1, pings=OWN_PINGS)
        checks.append(judge_rtt(f"{dc_pair(a.dc, b.dc)} {a.name} <-> {b.name}", rtt_s, 2 * run.one_way_min_s,
                                OwnRoundTrip.of(own), tcg=tcg, where=a.name, qps=run.qps, rdma_mtu=run.rdma_mtu))
        back = probe(fleet, plan, b, a, b_dev, a_dev, mtu, rtt_s, pings=1)
        for src, dst, result in ((a, b, run), (b, a, back)):
            checks.append(judge_rate(f"{src.dc} -> {dst.dc} ({src.name} -> {dst.name})",
                                     path_of(plan, src.dc, dst.dc)[1], result, tcg=tcg))
    return checks


def probe(fleet: Fleet, plan: Any, src: Machine, dst: Machine, src_dev: RxeDevice, dst_dev: RxeDevice, mtu: int,
          rtt_s: float, *, size: int = BULK_BYTES, count: int = 16, pings: int = PINGS) -> ProbeResult:
    """The probe's server on `dst` (left running over SSH), its client on `src` (bulk src -> dst)."""
    rate = path_of(plan, src.dc, dst.dc)[1] if src.dc != dst.dc else plan.fabric_rate_bps(src.dc)
    common = ["--rtt", repr(rtt_s), "--rate", repr(rate), "--mtu", str(mtu), "--size", str(size), "--count",
              str(count), "--pings", str(pings), "--timeout", repr(PROBE_TIMEOUT_S)]
    port = fleet.agent(dst, PortReply, "freeport", dst.data_address).port
    server = fleet.agent_channel(dst, "rdma-probe", "serve", "--device", dst_dev.name, "--gid-index",
                                 str(dst_dev.gid_index), "--port", str(port), *common, root=True)
    try:
        ListeningReply.from_json(json.loads(read_line(server, dst.name, 60)))
        return fleet.agent(src, ProbeResult, "rdma-probe", "client", "--device", src_dev.name, "--gid-index",
                           str(src_dev.gid_index), "--server", f"{dst.data_address}:{port}", *common, root=True,
                           timeout_s=PROBE_TIMEOUT_S + 30)
    finally:
        server.close()
