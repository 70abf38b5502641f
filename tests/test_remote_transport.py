"""Which transport several machines train over: the single machine's rule (testbed.run.transport.decide) fed by
each machine's own answer (`env`'s rdma), and the RDMA MTU per stage boundary. No SSH: facts are given."""

from __future__ import annotations

from pathlib import Path

import pytest
from paperlab import paper_inventory

from testbed.plan.builder import build_plan
from testbed.rdma.probe import ProbeResult
from testbed.rdma.softroce import ROCE_OVERHEAD
from testbed.remote import rdma as remote_rdma
from testbed.remote.fleet import Fleet, HostFacts
from testbed.remote.inventory import Machine, load_inventory
from testbed.remote.rdma import boundary_mtus, check_transport
from testbed.remote.replies import EnvReply
from testbed.run.transport import TransportError
from testbed.state.records import RxeDevice

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture
def fleet(tmp_path: Path) -> Fleet:
    inventory = paper_inventory(tmp_path)
    fleet = Fleet(load_inventory(inventory), "t", log=lambda _line: None)
    for m in fleet.inventory.machines:
        fleet.facts[m.name] = HostFacts(m.name, m.dc, m.login, env=EnvReply())
    return fleet


def test_rdma_where_every_machine_can_and_our_schedules_run(fleet: Fleet) -> None:
    machines = list(fleet.inventory.machines)
    assert check_transport(fleet, "rdma", machines, ["1f1b", "geopipe"])[0] == "rdma"
    assert check_transport(fleet, "auto", machines, ["geopipe"])[0] == "rdma"
    assert check_transport(fleet, "tcp", machines, ["geopipe"]) == ("tcp", "asked for (--transport tcp)")


def test_a_machine_without_rxe_is_named_rdma_fails_and_auto_says_why_it_took_tcp(fleet: Fleet) -> None:
    machines = list(fleet.inventory.machines)
    fleet.facts["dc-b-h1"].env.rdma = "kernel 6.1 has no rdma_rxe module"
    with pytest.raises(TransportError, match=r"--transport rdma cannot run: dc-b-h1: kernel 6.1 has no rdma_rxe "
                                             r"module\. Routes: .*testbed remote cycle INVENTORY --transport rdma"):
        check_transport(fleet, "rdma", machines, ["1f1b"])
    assert check_transport(fleet, "auto", machines, ["1f1b"]) == (
        "tcp", "--transport auto took tcp: dc-b-h1: kernel 6.1 has no rdma_rxe module")
    fleet.facts["dc-b-h1"].env.rdma = ""
    with pytest.raises(TransportError, match="torch-1f1b call torch.distributed"):
        check_transport(fleet, "rdma", machines, ["torch-1f1b"])
    with pytest.raises(TransportError, match="unknown --transport 'ib'"):
        check_transport(fleet, "ib", machines, ["1f1b"])


def test_the_rdma_mtu_per_boundary_is_the_smallest_of_both_ports_and_the_path(fleet: Fleet) -> None:
    machines = list(fleet.inventory.machines)
    plan = build_plan(fleet.inventory.topology, "t")
    ports = [RxeDevice(m.name, f"rxe{i}", "data0", active_mtu=mtu) for i, (m, mtu) in enumerate(
        zip(machines, [4096, 512, 4096], strict=True))]
    assert boundary_mtus(plan, machines, ports) == [512, 512]          # the slower port on either side
    ports[1].active_mtu = 4096
    assert {d.mtu for d in plan.directions} == {1500}
    assert boundary_mtus(plan, machines, ports) == [1024, 1024]        # the path: RoCEv2 frames of 1024 fit 1500


def _probe_result(one_way_min_s: float, goodput_bps: float) -> ProbeResult:
    return ProbeResult(one_way_s=one_way_min_s, one_way_min_s=one_way_min_s, one_way_p90_s=one_way_min_s,
                       goodput_bps=goodput_bps, bulk_s=1.0, size=1, count=1, qps=1, rdma_mtu=1024, transfer_s=[])


@pytest.mark.parametrize("fault", [None, "link without its delay", "direction unshaped", "direction too slow"])
def test_rdma_verify_judges_each_boundary_between_dcs_as_one_machine_does(
        fleet: Fleet, monkeypatch: pytest.MonkeyPatch, fault: str | None) -> None:
    """Probes are scripted: the stages' path round trip (4 ms + 4 ms, 3 ms + 3 ms) plus the probe's own 0.3 ms,
    and RoCEv2 goodput at 95 % of the 50 Mbit/s rate; each injected fault fails exactly its check."""
    machines = list(fleet.inventory.machines)
    plan = build_plan(fleet.inventory.topology, "t")
    own_s, expected = 0.0003, 50e6 * 1024 / (1024 + ROCE_OVERHEAD + 14)
    calls: list[tuple[str, str]] = []

    def scripted(_fleet: Fleet, _plan: object, src: Machine, dst: Machine, *_a: object, **_k: object) -> ProbeResult:
        calls.append((src.name, dst.name))
        rtt = 0.0 if src is dst else {frozenset("ab"): 0.008, frozenset("bc"): 0.006}[frozenset(
            (src.dc[-1], dst.dc[-1]))]
        if fault == "link without its delay" and {src.dc, dst.dc} == {"dc-a", "dc-b"}:
            rtt = 0.0
        rate = 0.95 * expected
        if fault == "direction unshaped" and (src.dc, dst.dc) == ("dc-c", "dc-b"):
            rate = 3 * expected
        if fault == "direction too slow" and (src.dc, dst.dc) == ("dc-b", "dc-c"):
            rate = 0.6 * expected
        return _probe_result((rtt + own_s) / 2, rate)

    monkeypatch.setattr(remote_rdma, "probe", scripted)
    monkeypatch.setattr(remote_rdma, "in_vm", lambda: False)
    devices = [RxeDevice(m.name, f"rxe{i}", "data0", gid_index=1, active_mtu=1024) for i, m in enumerate(machines)]
    checks = remote_rdma.verify_rdma(fleet, plan, machines, devices, [1024, 1024])
    assert [c.kind for c in checks] == ["rdma-rtt", "rdma-rate", "rdma-rate"] * 2
    assert ("dc-a-h1", "dc-a-h1") in calls and ("dc-b-h1", "dc-b-h1") in calls     # each sender's own round trip
    failed = [c.subject for c in checks if not c.ok]
    assert failed == {None: [], "link without its delay": ["dc-a <-> dc-b dc-a-h1 <-> dc-b-h1"],
                      "direction unshaped": ["dc-c -> dc-b (dc-c-h1 -> dc-b-h1)"],
                      "direction too slow": ["dc-b -> dc-c (dc-b-h1 -> dc-c-h1)"]}[fault]


def test_rdma_verify_skips_a_boundary_inside_one_dc(fleet: Fleet, monkeypatch: pytest.MonkeyPatch) -> None:
    machines = list(fleet.inventory.machines)
    monkeypatch.setattr(remote_rdma, "probe", lambda *a, **k: pytest.fail("no probe inside one DC"))
    same_dc = [machines[0], machines[0]]
    assert remote_rdma.verify_rdma(fleet, build_plan(fleet.inventory.topology, "t"), same_dc,
                                   [RxeDevice("x", "rxe0", "data0")] * 2, [1024]) == []
