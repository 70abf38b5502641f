"""Background traffic and the congestion experiment, without root: the topology element, the iperf3 command line
and report, TCP's counters, the variants' topologies and the report's arithmetic."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from testbed.experiment.congestion import CongestionError, CongestionSpec, iteration_steps, variant_topology
from testbed.experiment.congestion_report import series, summarize, table, write_report
from testbed.plan.builder import build_plan
from testbed.plan.model import Plan
from testbed.probe.tcpstats import TcpCounters, counters_during, parse_counters
from testbed.run.background import iperf_command, read_report
from testbed.topology import TopologyError
from testbed.topology.background import BackgroundLoad
from testbed.topology.loader import parse_topology
from testbed.util.paths import resolve_topology

TWO_BY_TWO = """
name: t
datacenters: {dc-a: {hosts: 2}, dc-b: {hosts: 2}}
links: [{a: dc-a, b: dc-b, distance: 1000km, rate: 100mbit, lossless: pfc}]
"""


def test_background_loads_parse_with_their_defaults() -> None:
    t = parse_topology(TWO_BY_TWO + """background:
  - {from: dc-a-h2, to: dc-b-h2}
  - {from: dc-b-h1, to: dc-a-h2, flows: 3, rate: 60mbit, class: lossy}
""")
    assert t.background == (BackgroundLoad("dc-a-h2", "dc-b-h2"),
                            BackgroundLoad("dc-b-h1", "dc-a-h2", flows=3, rate_bps=60e6, lossy=True))
    plan = build_plan(t)
    assert Plan.from_json(json.loads(json.dumps(plan.to_json()))).background == t.background


def test_every_background_problem_is_named_at_once() -> None:
    with pytest.raises(TopologyError) as caught:
        parse_topology(TWO_BY_TWO + """background:
  - {from: dc-a-h9, to: dc-b-h2, flows: 0, rate: fast, class: bulk, burst: 3}
""")
    text = str(caught.value)
    for needle in ("background[0].from: unknown host 'dc-a-h9'", "background[0].flows", "background[0].rate",
                   "background[0].class", "background[0].burst: unknown key"):
        assert needle in text, text


def test_each_background_flow_gets_a_window_in_the_rate_queue() -> None:
    alone = build_plan(parse_topology(TWO_BY_TWO)).directions[0].rate_queue_packets
    loaded = build_plan(parse_topology(TWO_BY_TWO + "background: [{from: dc-a-h2, to: dc-b-h2, flows: 5}]"))
    assert loaded.directions[0].rate_queue_packets > alone * 1.5     # 4 hosts -> 4 + 4 senders


def test_iperf_command_paces_each_flow_and_marks_the_lossy_class() -> None:
    argv = iperf_command(BackgroundLoad("a", "b", flows=4, rate_bps=80e6, lossy=True), "10.0.0.2", 5000)
    assert argv[argv.index("-P") + 1] == "4" and argv[argv.index("-b") + 1] == "20000000"
    assert argv[argv.index("-S") + 1] == "32"                        # DSCP CS1: TOS 0x20
    plain = iperf_command(BackgroundLoad("a", "b"), "10.0.0.2", 5000)
    assert "-b" not in plain and "-S" not in plain


def test_the_load_report_is_iperf3s_and_says_when_there_is_none(tmp_path: Path) -> None:
    load = BackgroundLoad("dc-a-h2", "dc-b-h2", flows=2)
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"end": {"sum_sent": {"bytes": 25_000_000, "seconds": 2.0, "retransmits": 7}},
                                "error": "interrupt - the client has terminated"}))
    report = read_report(load, path)
    assert (report.bytes_sent, report.retransmits, report.sent_bps) == (25_000_000, 7, 100e6)
    path.write_text("iperf3: error - unable to connect to server")
    assert "unable to connect" in read_report(load, path).note


def test_tcp_counters_read_retransmits_probes_and_timeouts() -> None:
    text = ("Tcp: RtoAlgorithm RtoMin RetransSegs InErrs\nTcp: 1 200 17 0\n"
            "TcpExt: SyncookiesSent TCPTimeouts TCPLossProbes\nTcpExt: 0 3 9\n")
    counters = parse_counters(text)
    assert counters == TcpCounters(17, 9, 3)
    assert parse_counters("Ip: Forwarding\nIp: 1\n") is None
    during = counters_during({"h": TcpCounters(10, 2, 1), "g": None}, {"h": counters, "g": TcpCounters(1)})
    assert during == {"h": {"retransmits": 7, "loss_probes": 7, "timeouts": 2}, "g": None}


def test_variants_keep_the_buffer_and_change_only_the_edge(tmp_path: Path) -> None:
    source = resolve_topology("2dc-congestion")
    pfc = parse_topology(variant_topology(source, "pfc", tmp_path / "p.yaml").read_text())
    drop = parse_topology(variant_topology(source, "drop", tmp_path / "d.yaml").read_text())
    queue = parse_topology(variant_topology(source, "queue", tmp_path / "q.yaml").read_text())
    buffers = [build_plan(t).directions[0].edge.buffer_bytes for t in (pfc, drop)]  # type: ignore[union-attr]
    assert buffers[0] == buffers[1] > 0
    assert [t.links[0].edge.mode for t in (pfc, drop, queue)] == ["pfc", "drop", "queue"]   # type: ignore[union-attr]
    assert pfc.background == drop.background == queue.background != ()
    plain = tmp_path / "plain.yaml"
    raw = yaml.safe_load(source.read_text())
    del raw["background"]
    plain.write_text(yaml.safe_dump(raw))
    with pytest.raises(CongestionError, match="background"):
        variant_topology(plain, "pfc", tmp_path / "x.yaml")


@pytest.mark.parametrize(("fields", "needle"), [({"variants": ("pfc", "red")}, "red"), ({"cut": 1.5}, "fraction"),
                                                ({"cut_iteration": 9}, "1..6")])
def test_a_congestion_spec_that_cannot_run_is_refused(fields: dict, needle: str) -> None:
    with pytest.raises(CongestionError, match=needle):
        CongestionSpec(**fields).check()


def _sample(t: float, bytes_in: int, pause_s: float, peak: int) -> dict:
    return {"t": t, "direction": "dc-a -> dc-b", "bytes_in": bytes_in, "pause_s": pause_s,
            "buffer_interval_peak_bytes": peak}


def _variant(name: str, drops: int, steps: list[float]) -> dict:
    samples = [_sample(0.5 * i, int(0.5 * i * 100e6 / 8) if i <= 6 else int(3 * 100e6 / 8 + (0.5 * i - 3) * 50e6 / 8),
                       0.25 * max(0, i - 6), 300_000 if i > 6 else 10_000) for i in range(20)]
    start, rows = 0.0, []
    for number, step in enumerate(steps, 1):
        rows.append({"iteration": number, "start_s": start, "end_s": start + step, "step_s": step})
        start += step
    edge = {"mode": "pfc", "pauses": 12, "pause_s": 3.25, "drops": drops, "lossy_drops": 0, "buffer_peak_bytes": 300_000,
            "xoff_bytes": 262_063, "headroom_bytes": 262_063, "buffer_bytes": 524_126, "queue_delay_max_s": 0.05}
    return {"variant": name, "steps": rows, "cut_s": 3.0, "samples": samples, "fb_per_microbatch_s": 0.1272,
            "links": [{"src_dc": "dc-a", "dst_dc": "dc-b", "drops_during_run": 0, "edge": edge}],
            "tcp": {"dc-a-h1": {"retransmits": 2, "loss_probes": 2, "timeouts": 0},
                    "dc-a-h2": {"retransmits": 40, "loss_probes": 1, "timeouts": 0}},
            "background": [{"load": "dc-a-h2 -> dc-b-h2", "retransmits": 40}]}


def test_the_report_reads_throughput_pause_share_and_steps_around_the_cut(tmp_path: Path) -> None:
    variant = _variant("pfc", 0, [1.0, 1.2, 5.0, 6.0])
    points = series(variant["samples"], "dc-a -> dc-b")
    assert points[0]["bps"] == pytest.approx(100e6) and points[-1]["bps"] == pytest.approx(50e6)
    assert points[-1]["paused"] == pytest.approx(0.5)
    row = summarize(variant, cut_iteration=3)
    assert (row.step_before_s, row.step_after_s, row.step_max_after_s) == (1.1, 5.5, 6.0)
    assert row.throughput_before_bps == pytest.approx(100e6) and row.throughput_after_bps == pytest.approx(50e6)
    assert (row.stage_retransmits, row.background_retransmits, row.bound_bytes) == (2, 40, 524_126)
    lines = table([row, summarize(_variant("drop", 57, [1.0, 1.0, 2.0, 2.0]), 3)])
    assert "| pfc | 1100 ms | 5500 ms / 6000 ms | 100.0 / 50.0 | 0 / 0 |" in lines[2]
    assert "| drop |" in lines[3] and "| 57 / 0 |" in lines[3]
    (tmp_path / "congestion.json").write_text(json.dumps({
        "spec": {"schedule": "1f1b", "microbatches": 8, "iterations": 4, "compute": "gpt-7b-h100", "cut": 0.5,
                 "cut_iteration": 3}, "topology": "2dc-congestion.yaml",
        "variants": [variant, _variant("drop", 57, [1.0, 1.0, 2.0, 2.0])]}))
    report = write_report(tmp_path).read_text()
    assert "F+B per micro-batch per stage: 127 ms" in report and (tmp_path / "congestion.png").stat().st_size > 10_000
    page = (tmp_path / "report.html").read_text()
    assert page.count("<table>") == 1 and "<td>pfc</td>" in page and "data:image/png;base64," in page


def test_iteration_steps_place_each_iteration_from_the_first_start(tmp_path: Path) -> None:
    from workloads.records import IterationRecord, RankTrace, WorkerConfig

    for rank, shift in ((0, 0.0), (1, 0.1)):
        config = WorkerConfig(rank=rank, world=2, master_addr="x", master_port=1, schedules=["1f1b"])
        its = [IterationRecord(iteration=i, warmup=i == 0, start=10.0 + i + shift, end=10.9 + i + shift) for i in range(3)]
        trace = RankTrace(config=config, schedule="1f1b", rank=rank, iterations=its)
        (tmp_path / f"rank-{rank}.json").write_text(json.dumps(trace.to_json()))
    origin, steps = iteration_steps(tmp_path)
    assert origin == 10.0
    assert [(s["iteration"], round(s["start_s"], 6), round(s["step_s"], 6)) for s in steps] == [(1, 1.0, 1.0),
                                                                                                (2, 2.0, 1.0)]


FAKE_IPERF = """#!/bin/sh
# A stand-in for iperf3: the server waits; the client's behaviour is chosen by FAKE_CLIENT.
case "$1" in
  -s) exec sleep 30 ;;
esac
if [ "$FAKE_CLIENT" = fail ]; then echo '{"error": "unable to connect to server"}'; exit 1; fi
trap 'echo "{\\"end\\": {\\"sum_sent\\": {\\"bytes\\": 1000, \\"seconds\\": 1.0, \\"retransmits\\": 2}}}"; exit 0' TERM
while :; do sleep 0.05; done
"""


def _fake_backend():  # type: ignore[no-untyped-def]
    import subprocess
    from types import SimpleNamespace

    plan = build_plan(parse_topology(TWO_BY_TWO + "background: [{from: dc-a-h2, to: dc-b-h2, rate: 40mbit}]"))
    state = SimpleNamespace(plan=plan, processes=[], save=lambda: None)
    return SimpleNamespace(state=state, popen=lambda _node, argv, **kw: subprocess.Popen(argv, **kw))


def test_loads_are_stopped_and_reported_with_the_dilation_undone(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from testbed.run import background

    fake = tmp_path / "iperf3"
    fake.write_text(FAKE_IPERF)
    fake.chmod(0o755)
    monkeypatch.setattr(background, "require_iperf3", lambda: str(fake))
    backend = _fake_backend()
    with background.background_traffic(backend, backend.state.plan.background, tmp_path, log=lambda _m: None,
                                       dilation=2.0) as reports:
        assert {p.role for p in backend.state.processes} == {"background"} and len(backend.state.processes) == 2
    assert backend.state.processes == []
    (report,) = reports
    assert (report.bytes_sent, report.retransmits, report.rate_bps) == (1000, 2, 40e6)
    assert report.sent_bps == 16000                                   # 8000 bit/s in slow motion, k = 2
    assert "-b 20000000 " in " ".join(iperf_command(BackgroundLoad("a", "b", rate_bps=20e6), "x", 1)) + " "


def test_a_load_that_cannot_start_leaves_no_process(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from testbed.run import background

    fake = tmp_path / "iperf3"
    fake.write_text(FAKE_IPERF)
    fake.chmod(0o755)
    monkeypatch.setattr(background, "require_iperf3", lambda: str(fake))
    monkeypatch.setenv("FAKE_CLIENT", "fail")
    backend = _fake_backend()
    with pytest.raises(background.BackgroundError, match="unable to connect"), \
            background.background_traffic(backend, backend.state.plan.background, tmp_path, log=lambda _m: None):
        pytest.fail("the block must not run")
    assert backend.state.processes == []                              # the waiting server was stopped too


def test_the_edge_snapshot_gives_occupancy_now_and_the_peak_since_the_last() -> None:
    from testbed.shaping.otn_edge import EdgeConfig, OtnEdge

    edge = OtnEdge(EdgeConfig("drop", line_rate_bps=100e6, drain_rate_bps=10e6, buffer_bytes=0))
    for i in range(10):                                               # 10 x 1000 B at 100 Mbit/s into 10 Mbit/s
        edge.admit(i * 80e-6, 1000, 0.001)
    first = edge.snapshot(0.0015)             # 7 reached the edge (1 ms + 80 us each), the first one forwarded
    assert first["buffer_now_bytes"] == 6000 and first["buffer_interval_peak_bytes"] == 9000
    assert first["at_s"] == 0.0015
    later = edge.snapshot(0.1)                                        # drained; the peak starts again from now
    assert later["buffer_now_bytes"] == 0 and later["buffer_interval_peak_bytes"] == first["buffer_now_bytes"]
    assert edge.snapshot(0.2)["buffer_interval_peak_bytes"] == 0


def test_a_host_that_is_not_a_name_is_refused_not_crashed() -> None:
    with pytest.raises(TopologyError, match=r"background\[0\].from: expected a host name"):
        parse_topology(TWO_BY_TWO + "background: [{from: [dc-a-h1], to: dc-b-h2}]")


def test_drops_count_each_lost_packet_once() -> None:
    from testbed.experiment.congestion_report import link_drops

    assert link_drops({"drops_during_run": 5, "edge": {"mode": "pfc", "drops": 5}}) == 5       # the shaper has them
    assert link_drops({"drops_during_run": 2, "edge": {"mode": "drop", "drops": 71}}) == 73    # it does not
    assert link_drops({"drops_during_run": None, "edge": None}) == 0


def test_the_sampler_keeps_each_new_write_at_its_own_time() -> None:
    import time
    from types import SimpleNamespace

    from testbed.experiment.edge_sampler import EdgeSampler
    from testbed.shaping.otn_edge import EdgeCounters

    writes = iter([{"x": EdgeCounters(bytes_in=1, at_s=5.0)}] * 3 + [{"x": EdgeCounters(bytes_in=9, at_s=5.5)}] * 50)
    shaper = SimpleNamespace(edge_counters=lambda: next(writes, {}))
    with EdgeSampler(shaper) as sampler:          # type: ignore[arg-type]
        time.sleep(0.6)
    assert [(s.t, s.counters.bytes_in) for s in sampler.samples] == [(5.0, 1), (5.5, 9)]
    broken = SimpleNamespace(edge_counters=lambda: 1 / 0)
    with EdgeSampler(broken) as sampler:          # type: ignore[arg-type]
        time.sleep(0.2)
    assert "ZeroDivisionError" in sampler.error
