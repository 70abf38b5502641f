"""RDMA pieces that run anywhere: QP and timeout sizing, RDMA MTU per path, device names, the transport choice,
and what a user sees on a kernel without rxe in namespaces (this machine's): `auto` takes TCP and says why,
`rdma` fails at once naming the missing piece and both routes, nothing brought up. The RDMA data path itself
runs in the stock-kernel tier (tests/test_vm_rdma.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import REPO, netns_with_prefix, run_cli

from testbed.backends import vm
from testbed.check.rdma import OwnRoundTrip, judge_rtt
from testbed.plan import build_plan
from testbed.rdma import softroce
from testbed.rdma.probe import ProbeResult
from testbed.rdma.support import kernel_version, rxe_in_namespaces
from testbed.run import transport
from testbed.state.records import RdmaRecord, RxeDevice
from testbed.topology import load_topology
from workloads.rdma.endpoint import HEADER, LinkParams

SOFTROCE = REPO / "topologies" / "2dc-softroce.yaml"


def test_queue_pairs_fill_the_path_and_ack_timeout_exceeds_the_round_trip() -> None:
    """rxe keeps 128 packets in flight per QP: 1 Gbit/s over a 20 ms round trip needs 2.5 MB in flight, five
    QPs of 128 x 4 KiB; 100 Mbit/s over 10 ms fits one. The ACK timeout 4.096 us x 2^t stays above 4 RTT."""
    long = LinkParams.for_path(0.020, 1e9, 4096, 65536, slots=4)
    assert long.qps == 5
    assert LinkParams.for_path(0.010, 1e8, 4096, 65536, slots=4).qps == 1
    assert LinkParams.for_path(0.5, 1e10, 1024, 65536, slots=4).qps == 8          # capped
    for rtt in (0.001, 0.02, 0.2):
        timeout = 4.096e-6 * 2 ** LinkParams.for_path(rtt, 1e9, 4096, 1024, slots=1).timeout_exp
        assert timeout >= 4 * rtt and timeout >= 0.1
    pool = LinkParams.for_path(0.02, 1e9, 4096, 65536, slots=4)
    assert pool.slot_bytes == 65536 + HEADER.size and pool.pool_bytes == 4 * (65536 + HEADER.size)
    assert LinkParams.for_path(0.02, 1e9, 4096, 8 << 20, slots=2).slot_payload == 1 << 20   # big messages chunk


def test_rdma_mtu_is_the_largest_that_fits_the_path() -> None:
    assert softroce.rdma_mtu_for(9000) == 4096
    assert softroce.rdma_mtu_for(1500) == 1024
    assert softroce.rdma_mtu_for(4096) == 2048          # 4096 + RoCEv2 headers does not fit 4096
    assert softroce.rdma_mtu_for(300) == 0


def test_rdma_round_trip_is_judged_on_the_floor_not_the_median() -> None:
    """Readings from the stock-kernel tier under TCG on a 40 ms link: a loaded guest moves the median (a CI run
    read 54.6 ms) but the shortest ping-pong less the probe's own shortest stays near 42 ms and passes; a path
    that skips the delay, or adds one, still fails."""
    def judge(shortest_ms: float, own_ms: float, *, tcg: bool = True, spread_ms: float = 0.0) -> bool:
        return judge_rtt("a--b", 0.040, shortest_ms / 1e3, OwnRoundTrip(own_ms / 1e3, spread_ms / 1e3), tcg=tcg,
                         where="a-h1", qps=1, rdma_mtu=4096).ok
    assert judge(48.5, 6.5) and judge(50.2, 7.4)       # measured floors (4 rounds): 41.2-43.0 ms after subtraction
    assert not judge(9.0, 6.5)                         # RDMA bypassed the shaped link
    assert not judge(38.0, 1.0)                        # 37 ms: a delay short of the configured one by over 3 %
    assert not judge(62.0, 6.5)                        # every ping-pong 15 ms slow: more than TCG's slack
    assert judge(41.5, 0.2, tcg=False) and not judge(43.5, 0.2, tcg=False)   # a host: 2 ms slack
    check = judge_rtt("a--b", 0.040, 0.0485, OwnRoundTrip(0.0065, 0.0), tcg=True, where="a-h1", qps=1, rdma_mtu=4096)
    assert "shortest of 30 ping-pongs" in check.measured and "(TCG)" in check.expected


def test_rdma_round_trip_allows_below_by_the_probes_own_spread_and_no_more() -> None:
    """A CI run under TCG read the own floor at 11.33 ms and the link at 48.69 ms (37.36 ms for 40 ms): the own
    floor is one reading of a round trip that spread by several ms there. The lower bound gives way by that
    spread, measured, and by nothing else: with a quiet probe the same reading fails, and a link without its
    delay fails whatever the spread."""
    def judge(shortest_ms: float, own_ms: float, spread_ms: float) -> bool:
        return judge_rtt("a--b", 0.040, shortest_ms / 1e3, OwnRoundTrip(own_ms / 1e3, spread_ms / 1e3), tcg=True,
                         where="a-h1", qps=1, rdma_mtu=4096).ok
    assert judge(48.69, 11.33, 3.0) and not judge(48.69, 11.33, 0.5)
    assert not judge(20.0, 11.33, 3.0)                                  # half the delay missing
    assert not judge(36.0, 0.1, 0.05)                                   # a quiet probe resolves 10 % short
    own = OwnRoundTrip.of(ProbeResult(one_way_s=0.006, one_way_min_s=0.004, one_way_p90_s=0.01, goodput_bps=0,
                                      bulk_s=0, size=64, count=1, qps=1, rdma_mtu=4096, transfer_s=[]))
    assert own == OwnRoundTrip(pytest.approx(0.008), pytest.approx(0.004))
    check = judge_rtt("a--b", 0.040, 0.0485, own, tcg=True, where="a-h1", qps=1, rdma_mtu=4096)
    assert "-4 ms (the probe's own spread)" in check.expected, check.expected


def test_device_names_are_unique_per_testbed_and_short_enough() -> None:
    assert softroce.device_name("demo", 0) == "rxe_demo_0"
    long = softroce.device_name("x" * 80, 3)
    assert len(long) <= softroce.IB_NAME_MAX and long.endswith("_3")
    assert long != softroce.device_name("y" * 80, 3)


def test_softroce_topology_widens_the_fabric_mtu() -> None:
    plan = build_plan(load_topology(SOFTROCE))
    assert plan.rdma == "softroce"
    assert {h.interfaces[0].mtu for h in plan.hosts} == {9000}
    assert transport.path_mtus(plan, list(plan.hosts)) == [4096]
    plain = build_plan(load_topology(REPO / "topologies" / "4dc-32hosts.yaml"))         # no fabric MTU given
    assert plain.rdma == "none" and {h.interfaces[0].mtu for h in plain.hosts} == {1500}
    jumbo = build_plan(load_topology(REPO / "topologies" / "2dc-1000km.yaml"))         # fabric: {mtu: 9000}
    assert jumbo.rdma == "none" and {h.interfaces[0].mtu for h in jumbo.hosts} == {9000}


def test_transport_choice_names_what_is_missing() -> None:
    plan = build_plan(load_topology(SOFTROCE))
    hosts = list(plan.hosts)
    assert transport.choose("tcp", plan, None, hosts, ["1f1b"]).name == "tcp"
    if not rxe_in_namespaces().ok:
        auto = transport.choose("auto", plan, None, hosts, ["1f1b"])
        assert auto.name == "tcp" and rxe_in_namespaces().reason in auto.reason
        with pytest.raises(transport.TransportError, match="Routes: run under the stock 7.x kernel"):
            transport.choose("rdma", plan, None, hosts, ["1f1b"])
    with pytest.raises(transport.TransportError, match="unknown --transport"):
        transport.choose("ib", plan, None, hosts, ["1f1b"])


def test_missing_rdma_pieces_are_named(monkeypatch: pytest.MonkeyPatch) -> None:
    """With rxe support assumed: no devices, a host without one, and PyTorch's schedules each say so."""
    from testbed.rdma.support import RxeSupport

    monkeypatch.setattr(transport, "rxe_in_namespaces", lambda: RxeSupport(True, "assumed"))
    plan = build_plan(load_topology(SOFTROCE))
    hosts = list(plan.hosts)
    assert "has no rxe devices" in transport.rdma_missing(plan, None, hosts, ["1f1b"])
    one = RdmaRecord(devices=[RxeDevice("dc-a-h1", "rxe_x_0", "eth0", 1, "::ffff:10.100.0.11", 4096)])
    assert transport.rdma_missing(plan, one, hosts, ["1f1b"]) == "no rxe device on dc-b-h1"
    both = RdmaRecord(devices=[*one.devices, RxeDevice("dc-b-h1", "rxe_x_1", "eth0", 1, "::ffff:10.100.1.11", 4096)])
    assert "torch-1f1b" in transport.rdma_missing(plan, both, hosts, ["1f1b", "torch-1f1b"])
    choice = transport.choose("auto", plan, both, hosts, ["1f1b", "geopipe"])
    assert choice.name == "rdma" and [d.name for d in choice.devices] == ["rxe_x_0", "rxe_x_1"]
    assert choice.path_rdma_mtu == [4096]


def test_kernel_versions_and_releases() -> None:
    assert kernel_version("7.3.4+deb13-amd64") == (7, 3) and kernel_version("6.1.0-57-amd64") == (6, 1)
    assert kernel_version("6.18.44-fc-v1252") < (7, 1) <= kernel_version("7.1.0")
    assert vm._version_key("7.3.4+deb13-amd64") > vm._version_key("6.12.1-amd64") > vm._version_key("6.1.0-57-amd64")
    assert vm.kernel_release(Path("/boot/vmlinuz-6.12.1-amd64")) == "6.12.1-amd64"
    assert vm.kernel_release(Path("/usr/lib/modules/7.3.4+deb13-amd64/vmlinuz")) == "7.3.4+deb13-amd64"


def test_the_stock_kernel_booted_is_the_newest_other_than_the_running_one(tmp_path: Path, monkeypatch) -> None:
    """On a scripted /boot and /usr/lib/modules (where install-stock-kernel.sh puts trixie-backports' kernel): the
    running kernel is left out, a release in both places counts once (/boot's), versions sort as numbers."""
    images = ["boot/vmlinuz-6.1.0-57-amd64", "boot/vmlinuz-6.12.1-amd64", "boot/vmlinuz-7.3.4+deb13-amd64",
              "usr/lib/modules/7.3.4+deb13-amd64/vmlinuz", "usr/lib/modules/7.10.1+deb13-amd64/vmlinuz",
              "usr/lib/modules/7.2.12+deb13-amd64/vmlinuz", "usr/lib/modules/6.1.0-57-amd64/vmlinuz"]
    for image in images:
        (tmp_path / image).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / image).write_bytes(b"")
    (tmp_path / "usr/lib/modules/6.12.1-amd64").mkdir()                   # modules without an image: not a kernel
    monkeypatch.setattr(vm, "Path", lambda p: tmp_path / str(p).lstrip("/"))
    monkeypatch.setattr(vm.platform, "release", lambda: "6.1.0-57-amd64")
    kernels = vm.stock_kernels()
    assert [str(k.relative_to(tmp_path)) for k in kernels] == [
        "boot/vmlinuz-6.12.1-amd64", "usr/lib/modules/7.2.12+deb13-amd64/vmlinuz", "boot/vmlinuz-7.3.4+deb13-amd64",
        "usr/lib/modules/7.10.1+deb13-amd64/vmlinuz"]
    assert [vm.kernel_release(k) for k in kernels] == ["6.12.1-amd64", "7.2.12+deb13-amd64", "7.3.4+deb13-amd64",
                                                       "7.10.1+deb13-amd64"]


@pytest.mark.root
def test_transport_rdma_fails_at_once_where_rxe_cannot_work_in_namespaces(unique_name: str) -> None:
    if rxe_in_namespaces().ok:
        pytest.skip("this kernel runs rxe in namespaces (the stock-kernel tier covers it)")
    out = run_cli("run", "2dc-softroce", "--name", unique_name, "--transport", "rdma", check=False, timeout=60)
    assert out.returncode == 1
    assert "--transport rdma cannot run: " + rxe_in_namespaces().reason in out.stderr
    assert "stock 7.x kernel in QEMU" in out.stderr and "one stage per real host" in out.stderr
    assert netns_with_prefix(f"tb-{unique_name}-") == []
    up = run_cli("up", "2dc-softroce", "--name", unique_name, check=False, timeout=60)
    assert up.returncode == 1 and "SoftRoCE between emulated hosts is not available here" in up.stderr
    assert netns_with_prefix(f"tb-{unique_name}-") == []


def test_the_model_knows_rdma_needs_no_round_trip_for_a_late_receive() -> None:
    """1F1B posts receives just in time: over receiver-driven TCP each crossing pays an extra round trip that a
    sender-driven RDMA write does not; a schedule that posts every receive early gains nothing from RDMA."""
    from workloads import schedule as S
    from workloads.simulate import Costs, simulate

    def step(name: str, receiver_driven: bool) -> float:
        costs = Costs([0.002, 0.002], [0.004, 0.004], [0.010], [1e8], 65536, 65536, receiver_driven=receiver_driven)
        return simulate(S.build(name, 2, 8), costs).iteration_s

    tcp, rdma = step("1f1b", True), step("1f1b", False)
    assert rdma < tcp - 8 * 0.010                    # at least one 10 ms delay saved per just-in-time micro-batch
    assert step("gpipe", False) <= step("gpipe", True)


def test_experiment_plans_a_transport_sweep_only_when_asked() -> None:
    from testbed.experiment.records import ExperimentSpec
    from testbed.experiment.sweep import Experiment

    spec = ExperimentSpec(distances_km=[0, 1000], repetitions=1, budgets=[], rates_mbit=[], focus_schedules=[])
    assert not [st for st in Experiment(spec).planned() if st.sweep == "transport"]
    spec.transports = ["tcp", "rdma"]
    sweep = [st for st in Experiment(spec).planned() if st.sweep == "transport"]
    assert [(st.schedule, st.transport) for st in sweep] == [(s, t) for s in spec.schedules for t in ("tcp", "rdma")]
    assert len({st.label for st in sweep}) == len(sweep) and all(st.km == spec.focus_km for st in sweep)
