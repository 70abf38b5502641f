"""Time dilation (testbed/run/dilation.py): k from the caps, traces back in undilated time, the cgroup layout
on v1 and v2 (a scratch folder standing in for /sys/fs/cgroup), and on this machine's own cgroups a cap that
really throttles (root)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from testbed.backends import cgroups
from testbed.run.dilation import OFF, RESERVE_CORES, DilationError, plan_dilation, undilate
from workloads.records import IterationRecord, RankTrace, Span, WorkerConfig
from workloads.schedule import GeoPipeSizing


def test_k_follows_from_the_caps() -> None:
    auto = plan_dilation("auto", workers=2, cpus=2)
    assert auto.worker_cores == pytest.approx((2 - RESERVE_CORES) / 2)
    assert auto.factor == pytest.approx(2 / (2 - RESERVE_CORES)) and "k = 2 / (2 - 0.3)" in auto.reason
    assert plan_dilation("auto", workers=2, cpus=4).factor == 1.0          # cores to spare: nothing competes
    assert plan_dilation("off", 2, 2) == OFF and plan_dilation("1", 2, 2) == OFF
    asked = plan_dilation("1.5", 2, 2)
    assert asked.worker_cores == pytest.approx(2 / 3) and asked.reserve_cores == pytest.approx(2 - 4 / 3)
    with pytest.raises(DilationError, match="leaving nothing to the rest"):
        plan_dilation("1.0001", 2, 2)
    with pytest.raises(DilationError, match="use off, auto or a factor"):
        plan_dilation("fast", 2, 2)
    with pytest.raises(DilationError, match="at least 1"):
        plan_dilation("0.5", 2, 2)


def test_undilate_divides_wall_times_and_keeps_the_parts_adding_up() -> None:
    """A span of 25 ms wall (k = 1.25) with 16 ms CPU and 8 ms on the run queue (the throttled part
    included) and 1 ms asleep is, undilated, 20 ms: 16 ms CPU, 0.8 ms asleep, the rest (3.2 ms) waiting."""
    span = Span("F", 0, 1.0, 1.025, 0.016, 0.008)
    it = IterationRecord(iteration=1, warmup=False, start=1.0, end=1.025, spans=[span], compute_s=0.025,
                         wait_s=0.0, forward_s=0.025, main_cpu_s=0.016, main_runq_s=0.008)
    trace = RankTrace(config=WorkerConfig(rank=0, world=2, master_addr="x", master_port=1, schedules=["geopipe"]),
                      schedule="geopipe", rank=0, iterations=[it], reference_compute_s=[2.5, 2.4],
                      reference_loaded_s=[3.0, 2.75],
                      geopipe_sizing=GeoPipeSizing((1, 0), (0, 3), (1, 0), ("hidden", "no link"), (0.0125, 0.0)))
    out = undilate(trace, 1.25)
    s = out.iterations[0].spans[0]
    assert (s.start, s.end, s.cpu_s) == pytest.approx((0.8, 0.82, 0.016))
    assert s.seconds - s.cpu_s - s.runq_s == pytest.approx(0.001 / 1.25)
    assert out.reference_compute_s == pytest.approx([2.0, 1.92]) and out.dilation == 1.25
    assert out.reference_loaded_s == pytest.approx([2.4, 2.2])
    assert out.iterations[0].compute_s == pytest.approx(0.02) and out.iterations[0].forward_s == pytest.approx(0.02)
    assert out.geopipe_sizing is not None and out.geopipe_sizing.cover_s == pytest.approx((0.01, 0.0))
    assert RankTrace.from_json(out.to_json()).dilation == 1.25



def test_undilate_divides_a_timed_spans_actual_times_too() -> None:
    """A timed span keeps its plan and when it really woke and ended: all wall-clock times, divided alike."""
    span = Span("F", 0, 1.0, 1.025, 0.0, 0.0, late_s=0.005, woke=1.029, actual_end=1.030)
    it = IterationRecord(iteration=1, warmup=False, start=1.0, end=1.03, spans=[span])
    trace = RankTrace(config=WorkerConfig(rank=0, world=2, master_addr="x", master_port=1, schedules=["1f1b"],
                                          compute="replay"), schedule="1f1b", rank=0, iterations=[it])
    s = undilate(trace, 1.25).iterations[0].spans[0]
    assert (s.start, s.end, s.woke, s.actual_end, s.late_s) == pytest.approx((0.8, 0.82, 0.8232, 0.824, 0.004))
    assert s.lateness_s == pytest.approx(0.004)

def _fake_v1(root: Path) -> None:
    (root / "cpu").mkdir(parents=True)
    for name in ("cpu.cfs_quota_us", "cpu.cfs_period_us", "tasks", "cgroup.procs"):
        (root / "cpu" / name).write_text("")


def test_v1_layout_caps_the_worker_and_frees_its_threads(tmp_path: Path) -> None:
    _fake_v1(tmp_path)
    controller = cgroups.cpu_controller(tmp_path)
    assert controller.version == 1
    cap = cgroups.create_worker_cap(controller, "testbed-x-w0", 0.85, 0.005)
    assert (cap.group / "cpu.cfs_period_us").read_text() == "5000"
    assert (cap.group / "cpu.cfs_quota_us").read_text() == "4250"
    assert cap.procs == cap.group / "cgroup.procs" and cap.threads == tmp_path / "cpu" / "tasks"


def test_v2_layout_is_a_threaded_subtree(tmp_path: Path) -> None:
    (tmp_path / "cgroup.controllers").write_text("cpuset cpu io memory pids")
    (tmp_path / "cgroup.subtree_control").write_text("cpu")
    controller = cgroups.cpu_controller(tmp_path)
    assert controller.version == 2
    cap = cgroups.create_worker_cap(controller, "testbed-x-w1", 0.5, 0.01)
    assert (cap.group / "compute" / "cpu.max").read_text() == "5000 10000"
    assert (cap.group / "compute" / "cgroup.type").read_text() == "threaded"
    assert cap.threads == cap.group / "comm" / "cgroup.threads" and cap.procs == cap.group / "compute" / "cgroup.procs"


def test_no_cpu_controller_says_what_is_missing(tmp_path: Path) -> None:
    with pytest.raises(cgroups.CgroupError, match="no cgroup cpu controller.*run without --dilation"):
        cgroups.cpu_controller(tmp_path)


@pytest.mark.root
def test_a_cap_really_throttles_and_is_removed() -> None:
    """On this machine's cgroups: a busy loop of 1.5 s wall time capped at 0.3 core gets 0.2-0.4 of a core
    (its own CPU time over its wall time), the cgroup's throttled time grows, and the cgroup is gone after."""
    try:
        controller = cgroups.cpu_controller()
    except cgroups.CgroupError as exc:
        pytest.skip(str(exc))
    cap = cgroups.create_worker_cap(controller, f"testbed-pytest-{os.getpid()}", 0.3, 0.005)
    proc = subprocess.Popen([sys.executable, "-c", "import sys, time\nsys.stdin.read(1)\nt = time.monotonic()\n"
                             "while time.monotonic() - t < 1.5: pass"], stdin=subprocess.PIPE)
    try:
        cap.procs.write_text(str(proc.pid))
        assert proc.stdin is not None
        proc.stdin.write(b"x")
        proc.stdin.close()
        start = time.monotonic()
        _, _, usage = os.wait4(proc.pid, 0)
        wall = time.monotonic() - start
        throttled = cgroups.throttled_s(cap.group)
    finally:
        if proc.poll() is None and proc.returncode is None:
            proc.kill()
        cgroups.remove(cap.group)
    share = (usage.ru_utime + usage.ru_stime) / wall
    assert 0.2 < share < 0.4, share
    assert throttled is not None and throttled > 0.5
    assert not cap.group.exists()


def test_compute_as_time_is_slowed_down_not_capped() -> None:
    """A timed span takes no CPU: k is slow motion (every span, delay and transfer k times longer) with no worker
    capped, so 8 workers on 2 cores may run at k = 4 where capped ones would need 4.21."""
    auto = plan_dilation("auto", workers=8, cpus=2, timed=True)
    assert auto.factor == 4.0 and auto.worker_cores == 1.0 and "slow motion" in auto.reason
    assert plan_dilation("3", 8, 2, timed=True).factor == 3.0
    with pytest.raises(DilationError, match="leaving nothing to the rest"):
        plan_dilation("3", 8, 2)                                         # capped: 8 x 1/3 core > 2 cores
    assert plan_dilation("auto", 2, 4, timed=True) == OFF               # cores to spare
    with pytest.raises(DilationError, match="at least 1"):
        plan_dilation("0.5", 8, 2, timed=True)


def test_a_slowed_table_stretches_every_span_and_keeps_the_bytes() -> None:
    from workloads.compute import CostTable, PhaseCost, StageCost

    table = CostTable("t", "", [StageCost(PhaseCost(0.01, 0.009, 0.011, 3), PhaseCost.stated(0.02), 100)], 64, 1,
                      [400.0], 1000, 10, 1024)
    slow = table.slowed(4)
    assert slow.stages[0].forward == PhaseCost(0.04, 0.036, 0.044, 3) and slow.stages[0].backward.median_s == 0.08
    assert (slow.activation_bytes, slow.stages[0].stash_bytes, slow.rate_scale) == (64, 100, [400.0])


def test_undilate_scales_the_lags_and_the_probed_message_cost() -> None:
    it = IterationRecord(iteration=1, warmup=False, start=4.0, end=8.0, send_lag_s=[0.004, 0.008], recv_lag_s=[0.002])
    trace = RankTrace(config=WorkerConfig(rank=0, world=2, master_addr="x", master_port=1, schedules=["1f1b"]),
                      schedule="1f1b", rank=0, iterations=[it], message_cost_s=[0.0004])
    back = undilate(trace, 4.0)
    assert back.iterations[0].send_lag_s == [0.001, 0.002] and back.iterations[0].recv_lag_s == [0.0005]
    assert back.message_cost_s == [0.0001]
