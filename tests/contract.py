"""The summary.json contract every run meets, one machine or several (docs/json-contracts.md). Each check can
fail: figures are recomputed from the ones they derive from, and measurements are held to what the run
itself implies (two workers computing keep the run queue busy; a reference half or double the compute's own
CPU time is a broken yardstick)."""

from __future__ import annotations

from typing import Any

import pytest

from testbed.util.hostload import HOST_DRIFT_BOUND

PER_SCHEDULE = ("bubble_ratio", "bubble_ratio_per_stage", "step_time_s", "tokens_per_s", "exposed_comm_s",
                "peak_inflight_activation_bytes", "bubble_vs_reference", "reference_compute_s_per_stage",
                "span_stretch_per_stage", "budget_bytes_per_stage", "host_load", "breakdown")
PARTS = ("reference_s", "compute_cpu_excess_s", "host_drift_s", "compute_preempted_s", "compute_blocked_s", "wait_s",
         "executor_s", "skew_s")


def check_summary(summary: dict[str, Any], schedules: list[str], stages: int, delay_line: bool = True) -> None:
    """Assert what every run's summary.json holds, whatever ran it."""
    assert summary["topology"] and summary["shaper"] in ("delayline", "netem")
    assert summary["transport"] == "gloo-tcp" and summary["kernel"] and summary["lossless_ok"]
    assert [s["schedule"] for s in summary["schedules"]] == schedules
    assert len(summary["stages"]) == stages and len(summary["stage_links"]) == stages - 1
    for lk in summary["links"]:          # verified before the run: its one-way reading is a number, not only text
        if lk["delay_ok"] is not None and summary["backend"] != "remote-ssh":
            assert lk["measured_one_way_s"] == pytest.approx(lk["configured_delay_s"], rel=0.2, abs=0.5e-3), lk
    for s in summary["schedules"]:
        for key in PER_SCHEDULE:
            assert s[key] is not None, key
        assert 0 < s["bubble_ratio"] < 1 and len(s["bubble_ratio_per_stage"]) == stages
        yardstick, step = s["reference_yardstick_s_per_stage"], s["step_time_s"]
        assert s["bubble_vs_reference_per_stage"] == pytest.approx([1 - r / step for r in yardstick], rel=1e-9)
        assert s["span_stretch_per_stage"] == pytest.approx(
            [c / r for c, r in zip(s["compute_s_per_stage"], yardstick, strict=True)], rel=1e-9)
        assert s["budget_ok"] and all(p <= b for p, b in zip(s["peak_inflight_activation_bytes_per_stage"],
                                                             s["budget_bytes_per_stage"], strict=True))
        load = s["host_load"]
        assert 0 <= load["steal_fraction"] < 0.5 and 0 <= load["foreign_fraction"] < 0.5
        if load["foreign_measured"]:      # one machine: sampled through the run (several: one sample per machine)
            assert load["run_queue_mean"] >= min(stages, summary["cpus"]) * 0.5   # the workers keep the cores busy
        # the host's speed over the run: the reference after vs before, within the bound unless the run says it
        # was disturbed by it (then it was measured again and is marked)
        assert load["host_drift"] is not None and (abs(load["host_drift"]) <= HOST_DRIFT_BOUND or load["disturbed"]), load
        assert load["drifted"] == (abs(load["host_drift"]) > HOST_DRIFT_BOUND)
        # the spans against the reference, both CPU time: the run's own cost, which is never a saving beyond the
        # host's drift (spans cannot run less CPU than the same pass alone)
        assert load["compute_slowdown"] > -HOST_DRIFT_BOUND - abs(load["host_drift"]), load
        split = s["breakdown"]
        assert len(split["stages"]) == stages and split["ideal_step_s"] > 0
        for st in split["stages"]:
            assert sum(st[p] for p in PARTS) == pytest.approx(st["step_s"], rel=1e-6)   # the parts add up
            assert st["reference_s"] > 0 and st["wait_s"] >= 0
            assert st["compute_cpu_excess_s"] >= 0 >= st["host_drift_s"]          # a cost, and the host's drift
        assert split["step_s"] == pytest.approx(step, rel=0.2)           # mean vs median of the same iterations
        if load["foreign_measured"]:      # one machine: its CPU ledger (several machines have none)
            ledger = {c["name"]: c for c in split["cpu"] if not c["name"].startswith("of which")}
            assert 0.9 < sum(c["fraction"] for c in ledger.values()) < 1.1, split["cpu"]   # the machine, once
            spans_cpu = sum(st["reference_s"] + st["compute_cpu_excess_s"] + st["host_drift_s"]
                            for st in split["stages"])
            assert ledger["workers: compute (F/B spans)"]["cpu_s"] == pytest.approx(spans_cpu, rel=0.1)
        if delay_line and summary["shaper"] == "delayline" and max(lk["delay_s"] for lk in summary["stage_links"]) > 0:
            assert s["link_timing"] and all(t["packets"] > 0 for t in s["link_timing"])
            assert s["links_on_time"], s["link_timing"]
        assert s["loss_first"] > 0 and s["iterations"] >= 1
