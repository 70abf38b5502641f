"""The post-run steps one machine and several share (testbed/run/runner.py, called by playbooks/cycle.py)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

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


@pytest.mark.parametrize("name", ["check_budget", "write_run", "compute_drift", "link_timing", "measure"])
def test_the_remote_cycle_calls_the_single_machine_post_run_steps(name: str) -> None:
    """Not a copy: playbooks/cycle.py calls the runner's own functions for these steps."""
    tree = ast.parse((ROOT / "playbooks" / "cycle.py").read_text())
    called = {n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
    assert name in called
