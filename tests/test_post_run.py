"""The post-run steps one machine and several share (testbed/run/runner.py, called by playbooks/cycle.py)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from paperlab import paper_inventory

from testbed.run.runner import RunError, check_budget
from testbed.run.summary import ScheduleSummary

ROOT = Path(__file__).resolve().parent.parent


def _measured(budget_ok: bool) -> ScheduleSummary:
    return ScheduleSummary(
        schedule="geopipe", bubble_ratio=0.1, bubble_ratio_per_stage=[0.1, 0.1], step_time_s=1.0,
        step_time_spread_s=[0.9, 1.1], tokens_per_s=100.0, bubble_ratio_iterations=[[0.1], [0.1]], exposed_comm_s=0.0,
        exposed_comm_s_per_stage=[0.0, 0.0], compute_s_per_stage=[0.9, 0.9], peak_inflight_activation_bytes=12,
        peak_inflight_activation_bytes_per_stage=[12, 0], loss_first=4.0, loss_last=3.0, iterations=2,
        budget_bytes_per_stage=[10, 10], budget_ok=budget_ok)


def test_a_peak_over_the_budget_fails_the_run_with_both_figures() -> None:
    check_budget("geopipe", _measured(True))
    with pytest.raises(RunError, match=r"geopipe: in-flight peak \[12, 0\] B over its budget \[10, 10\] B"):
        check_budget("geopipe", _measured(False))


@pytest.mark.parametrize("name", ["check_budget", "write_run", "compute_slowdown", "host_drift", "link_timing",
                                  "measure", "best_attempt"])
def test_the_remote_cycle_calls_the_single_machine_post_run_steps(name: str) -> None:
    """Not a copy: playbooks/cycle.py calls the runner's own functions for these steps."""
    tree = ast.parse((ROOT / "playbooks" / "cycle.py").read_text())
    called = {n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
    assert name in called


# -- the remote cycle's run loop, driven by scripted attempts (no SSH: the machines' answers are faked) --------


def _late(error_s: float) -> list:
    from testbed.run.summary import LinkTiming
    return [LinkTiming(direction="dc-a -> dc-b", configured_delay_s=4e-3, packets=400, mean_error_s=error_s,
                       tolerance_s=0.2e-3)]


def _remote_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, attempts: list[tuple[bool, float]]):
    """Cycle.run of one schedule whose attempts are scripted as (budget_ok, link error): what it kept and logged."""
    from playbooks import cycle as cycle_module
    from testbed.remote.inventory import load_inventory
    from testbed.run.attempts import Attempt
    from testbed.run.runner import RunOptions
    from testbed.util.hostload import HostLoad

    inventory = paper_inventory(tmp_path)
    logged: list[str] = []
    made: list[Path] = []

    def measure(self, schedule, options, chosen, links, plan, where, run_id, baseline, table=None):
        budget_ok, error_s = attempts[len(made)]
        made.append(where)
        (where / schedule).mkdir(parents=True)
        measured = _measured(budget_ok)
        measured.host_load = HostLoad(wall_s=1.0, steal_fraction=0.0, run_queue_mean=1.0, run_queue_max=1,
                                      daemon_cpu_fraction=None, disturbed=False, foreign_measured=False)
        measured.link_timing = _late(error_s)
        return Attempt(([], measured), measured.host_load, measured.link_timing, where)

    monkeypatch.setattr(cycle_module.Cycle, "_measure", measure)
    monkeypatch.setattr(cycle_module.readings, "counters", lambda *_a: ({}, {}))
    monkeypatch.setattr(cycle_module.readings, "baseline_lateness", lambda *_a: {})
    monkeypatch.setattr(cycle_module.metrics, "pool_references", lambda _s: None)
    monkeypatch.setattr(cycle_module, "remote_summary", lambda _c, _id, _p, _ch, _l, summaries, *_a: summaries)
    monkeypatch.setattr(cycle_module, "write_run", lambda *_a: None)
    cycle = cycle_module.Cycle(load_inventory(inventory), "t", tmp_path / "results", log=logged.append)
    run_dir, summaries = cycle.run(RunOptions(schedules=["geopipe"], memory_budget="1f1b+1"), run_id="r")
    return run_dir, summaries, made, logged


def test_the_remote_run_repeats_an_attempt_with_late_links_as_one_machine_does(tmp_path, monkeypatch) -> None:
    run_dir, summaries, made, logged = _remote_run(tmp_path, monkeypatch, [(True, 0.45e-3), (True, 0.02e-3)])
    assert made == [run_dir, run_dir / "repeat1"] and summaries[0].repeated == 1
    assert summaries[0].link_timing[0].ok and "measuring again" in " ".join(logged)
    assert (run_dir / "geopipe").is_dir() and (run_dir / "geopipe-set-aside").is_dir()   # the kept one in place


def test_the_remote_run_fails_a_budget_overrun_as_one_machine_does(tmp_path, monkeypatch) -> None:
    with pytest.raises(RunError, match=r"geopipe: in-flight peak \[12, 0\] B over its budget"):
        _remote_run(tmp_path, monkeypatch, [(False, 0.0)])
