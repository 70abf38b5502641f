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
    config = WorkerConfig(rank=1, world=2, master_addr="10.0.0.1", master_port=1, schedule="geopipe",
                          link_delay_s=[0.005], link_rate_bps=[1e9], memory_budget=10, cpu=1)
    assert WorkerConfig.from_json(_through_json(config.to_json())) == config
    it = IterationRecord(iteration=1, warmup=False, start=1.0, end=2.0, spans=[Span("F", 0, 1.0, 1.5)],
                         memory=[(1.0, 5)], peak_inflight_bytes=5, loss=3.0, compute_s=0.5, wait_s=0.1)
    trace = RankTrace(config=config, schedule="geopipe", rank=1, iterations=[it], actions=["F0"],
                      geopipe_sizing=GeoPipeSizing((1, 0), (0, 2), (1, 0), ("hidden", "no link")),
                      activation_bytes=128, transport="gloo-tcp")
    assert RankTrace.from_json(_through_json(trace.to_json())) == trace
