"""Everything that crosses a file or process boundary round-trips through its JSON form unchanged."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from testbed.plan import Plan, build_plan
from testbed.state.records import DaemonFiles, MininetRecord, ProcessRecord, ShaperRecord, SwitchLayout
from testbed.state.store import TestbedState
from testbed.topology import load_topology
from testbed.util.paths import shipped_topologies
from workloads.memory import MemoryBudget
from workloads.records import IterationRecord, RankTrace, Span, WorkerConfig
from workloads.schedule import GeoPipeSizing


def _through_json(data: dict) -> dict:
    return json.loads(json.dumps(data))


@pytest.mark.parametrize("topology", shipped_topologies(), ids=lambda p: p.stem)
def test_plan_round_trips(topology: Path) -> None:
    plan = build_plan(load_topology(topology), "rt")
    again = Plan.from_json(_through_json(plan.to_json()))
    assert again == plan
    assert again.direction(plan.directions[0].src_dc, plan.directions[0].dst_dc) == plan.directions[0]


def test_plan_reads_the_old_key_for_directions() -> None:
    plan = build_plan(load_topology(shipped_topologies()[0]), "rt")
    data = _through_json(plan.to_json())
    data["shapes"] = data.pop("directions")
    assert Plan.from_json(data) == plan


def test_state_round_trips_with_every_record() -> None:
    plan = build_plan(load_topology(shipped_topologies()[0]), "rt")
    state = TestbedState(name="rt", backend="mininet", topology_source="x.yaml", plan=plan, phase="up",
                         netns=plan.netns_names(), processes=[ProcessRecord(12, 34, "delayline", "dc-b-rtr")],
                         shaper=ShaperRecord(name="delayline", calibration_s={"dc-a -> dc-b": 1e-4},
                                             native=["dc-b -> dc-a"], warnings=["w"],
                                             daemons={"dc-b-rtr": DaemonFiles("c.json", "s.json", "l.log")}),
                         mininet=MininetRecord(switch="ovs", switches=[SwitchLayout("dc-a", "tbx", "01", {"h": "p"})],
                                               root_interfaces=["p", "tbx"]))
    assert TestbedState.from_json(_through_json(state.to_json())) == state


def test_state_reads_the_extra_records_of_0_1() -> None:
    plan = build_plan(load_topology(shipped_topologies()[0]), "rt")
    old = {"name": "rt", "backend": "netns", "topology_source": "x.yaml", "phase": "up", "plan": plan.to_json(),
           "processes": [], "extra": {"shaper": {"name": "netem", "calibration_s": {"dc-a -> dc-b": 2e-5}}}}
    state = TestbedState.from_json(_through_json(old))
    assert state.shaper == ShaperRecord(name="netem", calibration_s={"dc-a -> dc-b": 2e-5}) and state.mininet is None


def test_worker_config_and_rank_trace_round_trip() -> None:
    config = WorkerConfig(rank=1, world=2, master_addr="10.0.0.1", master_port=1, schedules=["geopipe"],
                          link_delay_s=[0.005], link_rate_bps=[1e9], memory_budget=MemoryBudget(extra_microbatches=1), cpu=1)
    assert WorkerConfig.from_json(_through_json(config.to_json())) == config
    old = {**config.to_json(), "memory_budget": 10}                   # 0.2 wrote bytes as a number
    assert WorkerConfig.from_json(old).memory_budget == MemoryBudget(bytes=10)
    it = IterationRecord(iteration=1, warmup=False, start=1.0, end=2.0, spans=[Span("F", 0, 1.0, 1.5)],
                         memory=[(1.0, 5)], peak_inflight_bytes=5, loss=3.0, compute_s=0.5, wait_s=0.1)
    trace = RankTrace(config=config, schedule="geopipe", rank=1, iterations=[it], actions=["F0"],
                      geopipe_sizing=GeoPipeSizing((1, 0), (0, 2), (1, 0), ("hidden", "no link"), (0.012, 0.0),
                                                   (1, 0), (100, 90), (80, 40)),
                      activation_bytes=128, transport="gloo-tcp", reference_compute_s=[0.2, 0.19], budget_bytes=100,
                      compute_spread=[0.01, 0.012, 0.013])
    assert RankTrace.from_json(_through_json(trace.to_json())) == trace


def test_a_timed_span_round_trips_and_older_spans_read_without_their_actual_times() -> None:
    span = Span("F", 0, 1.0, 1.004, 0.0, 0.0, late_s=0.0012, woke=1.0051, actual_end=1.0052)
    it = IterationRecord(iteration=1, warmup=False, start=1.0, end=2.0, spans=[span])
    data = _through_json(it.to_json())
    assert IterationRecord.from_json(data) == it
    del data["spans"][0]["woke"], data["spans"][0]["actual_end"]
    older = IterationRecord.from_json(data).spans[0]
    assert (older.woke, older.actual_end, older.lateness_s) == (None, None, 0.0012)


def test_delay_daemon_files_round_trip() -> None:
    from testbed.shaping.delayline import DaemonConfig, DaemonStats, QueueConfig, QueueStats

    config = DaemonConfig(3, [QueueConfig(queue=0, ifname="otn0", delay_s=0.005, maxlen=2000)])
    assert DaemonConfig.from_json(_through_json(config.to_json())) == config
    stats = DaemonStats(pid=1, ready=True, uptime_s=2.0, advance_us=90.0, spin=False, oversleep_p90_us=120.0,
                        generation=3, cpu_s=0.4, queues={0: QueueStats(packets=10, id_gaps=1)})
    assert DaemonStats.from_json(_through_json(stats.to_json())) == stats


def test_run_summary_round_trips_and_keeps_the_old_link_keys() -> None:
    from testbed.run.summary import LinkRecord, RunSummary, ScheduleSummary, StageLink, StagePlacement
    from testbed.util.hostload import HostLoad

    schedule = ScheduleSummary(
        schedule="geopipe", bubble_ratio=0.1, bubble_ratio_per_stage=[0.1, 0.1], step_time_s=1.0,
        step_time_spread_s=[0.9, 1.1], tokens_per_s=100.0, bubble_ratio_iterations=[[0.1], [0.1]], exposed_comm_s=0.0,
        exposed_comm_s_per_stage=[0.0, 0.0], compute_s_per_stage=[0.9, 0.9], peak_inflight_activation_bytes=5,
        peak_inflight_activation_bytes_per_stage=[5, 0], loss_first=4.0, loss_last=3.0, iterations=4,
        geopipe_sizing=GeoPipeSizing((1, 0), (0, 2), (1, 0), ("hidden", "no link")),
        reference_compute_s_per_stage=[0.8, 0.8], bubble_vs_reference=0.2, bubble_vs_reference_per_stage=[0.2, 0.2],
        span_stretch_per_stage=[1.12, 1.0], budget_bytes_per_stage=[10, 10], budget_ok=True,
        host_load=HostLoad(wall_s=5.0, steal_fraction=0.06, run_queue_mean=3.0, run_queue_max=5,
                           daemon_cpu_fraction=0.05, disturbed=True, reasons=["CPU steal 6.0% > 5%"]), repeated=1)
    assert schedule.stretched
    summary = RunSummary(
        run_id="r", topology="t", testbed="t", stages=[StagePlacement(0, "h1", "dc-a")], stage_links=[StageLink(0.005, 1e9)],
        links=[LinkRecord("a--b", "dc-a", "dc-b", 0.005, 1e9, "5 ms", True, 0, True)], lossless_ok=True,
        shaper="delayline", backend="netns", switch=None, shaper_calibration_s={}, transport="gloo-tcp", kernel="k",
        cpus=2, oversubscribed=True, workers=2, delay_daemons=2, options={"schedules": ["geopipe"]},
        schedules=[schedule])
    data = _through_json(summary.to_json())
    assert RunSummary.from_json(data) == summary
    assert (data["links"][0]["from"], data["links"][0]["to"]) == ("dc-a", "dc-b")
    del data["links"][0]["src_dc"], data["links"][0]["dst_dc"]
    data["schedules"][0]["geo_plan"] = data["schedules"][0].pop("geopipe_sizing")
    assert RunSummary.from_json(data) == summary
