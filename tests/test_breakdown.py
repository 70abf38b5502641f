"""The breakdown of a step (testbed/run/breakdown.py) from hand-made rank traces: the parts add up to the step,
each fault lands in its own part, and the CPU ledger accounts for the machine."""

from __future__ import annotations

import pytest

from testbed.run.breakdown import Breakdown, breakdown
from workloads.hostcpu import HostWindow
from workloads.records import IterationRecord, RankTrace, Span, WorkerConfig
from workloads.schedule import build
from workloads.threadclock import ThreadUsage

M = 4
F, B = 0.010, 0.020


def _trace(rank: int, *, runq: float = 0.0, cpu_factor: float = 1.0, wait: float = 0.0, gap: float = 0.0,
           reference: float = M * (F + B), reference_waited: float = 0.0) -> RankTrace:
    """Two steady iterations of 1f1b-prefetch on 2 stages: F/B spans back to back (each `gap` apart), every
    span `runq` on the run queue and running `cpu_factor` x its nominal CPU, and one wait of `wait`; the
    reference pass ran `reference` seconds of CPU and waited `reference_waited` more for its core."""
    its = []
    for i in range(3):
        t = 100.0 * i
        start, spans = t, []
        if wait:
            spans.append(Span("wait-F", 0, t, t + wait, 0.0, 0.0))
            t += wait
        for mb in range(M):
            for kind, nominal in (("F", F), ("B", B)):
                cpu = nominal * cpu_factor
                spans.append(Span(kind, mb, t, t + cpu + runq, cpu, runq))
                t += cpu + runq + gap
        its.append(IterationRecord(iteration=i, warmup=i == 0, start=start, end=t, spans=spans,
                                   compute_s=sum(s.seconds for s in spans if s.kind in "FB"),
                                   wait_s=wait, forward_s=F * cpu_factor + runq, backward_s=B * cpu_factor + runq,
                                   main_cpu_s=sum(s.cpu_s or 0 for s in spans) + gap * 2 * M,
                                   main_runq_s=sum(s.runq_s or 0 for s in spans),
                                   threads=[ThreadUsage("main", 1, 0.0, 0.0), ThreadUsage("gloo_tcp_loop", 1, 0.01, 0.002)],
                                   host=HostWindow(wall_s=t - start, cpus=3,      # a third core: room for idle
                                                   states={"idle": 3 * (t - start) - 2 * (sum(s.cpu_s or 0 for s in spans)
                                                                                         + gap * 2 * M + 0.01) - 0.025,
                                                           "iowait": 0.0, "steal": 0.0, "softirq": 0.01},
                                                   groups={"delay daemons": 0.02, "runner": 0.001})))
    cfg = WorkerConfig(rank=rank, world=2, master_addr="x", master_port=1, schedules=["1f1b-prefetch"], microbatches=M)
    actions = [str(a) for a in build("1f1b-prefetch", 2, M)[rank]]
    return RankTrace(config=cfg, schedule="1f1b-prefetch", rank=rank, iterations=its, actions=actions,
                     activation_bytes=131072, reference_compute_s=[reference + reference_waited] * 2,
                     reference_cpu_s=[reference, reference])


def _split(**faults: float) -> Breakdown:
    result = breakdown([_trace(0, **faults), _trace(1, **faults)], [0.0], [1e9])
    assert result is not None
    return result


def test_the_parts_add_up_to_the_step_exactly() -> None:
    split = _split(runq=0.001, cpu_factor=1.1, wait=0.05, gap=0.002)
    for st in split.stages:
        total = (st.reference_s + st.compute_cpu_excess_s + st.host_drift_s + st.compute_preempted_s
                 + st.compute_blocked_s + st.wait_s + st.executor_s + st.skew_s)
        assert total == pytest.approx(st.step_s, abs=1e-9)


def test_each_fault_lands_in_its_own_part() -> None:
    """Preemption (run-queue wait inside spans), slower compute (more CPU per span than the reference), the
    executor's gaps and a wait each show up where they belong, hand-computed for 4 micro-batches."""
    clean = _split()
    assert all(abs(v) < 1e-9 for v in (clean.stages[0].compute_preempted_s, clean.stages[0].compute_cpu_excess_s,
                                       clean.stages[0].executor_s))
    preempted = _split(runq=0.001)
    assert preempted.stages[0].compute_preempted_s == pytest.approx(2 * M * 0.001)
    assert preempted.stages[0].compute_cpu_excess_s == pytest.approx(0.0, abs=1e-9)
    slower = _split(cpu_factor=1.25)
    assert slower.stages[0].compute_cpu_excess_s == pytest.approx(0.25 * M * (F + B))
    assert slower.stages[0].compute_preempted_s == pytest.approx(0.0)
    gaps = _split(gap=0.002)
    assert gaps.stages[0].executor_s == pytest.approx(2 * M * 0.002)
    assert gaps.stages[0].executor_cpu_s == pytest.approx(2 * M * 0.002)
    waited = _split(wait=0.05)
    assert waited.stages[0].wait_s == pytest.approx(0.05)
    assert dict(waited.ranked())["wait_beyond_ideal_s"] > 0


def test_a_reference_that_waited_for_its_core_lends_the_run_no_saving() -> None:
    """The reference pass waited 30 % of its CPU time on the run queue (its wall 1.3x its CPU), the run's spans
    ran exactly the reference's CPU: nothing was saved and nothing cost more, so every part beyond the ideal
    pipeline is as in the clean run and the ideal step is the clean one (against the reference's wall time the compute would
    come out 36 ms per step cheaper than alone, and the ideal step 30 % longer than the step)."""
    clean, waited = _split(), _split(reference_waited=0.3 * M * (F + B))
    for st in waited.stages:
        assert st.reference_s == pytest.approx(M * (F + B)) and st.reference_wall_s == pytest.approx(1.3 * M * (F + B))
        assert st.compute_cpu_excess_s == 0.0 and st.host_drift_s == 0.0
    assert waited.ideal_step_s == pytest.approx(clean.ideal_step_s, rel=1e-9)
    assert dict(waited.ranked()) == pytest.approx(dict(clean.ranked()))


def test_a_host_faster_than_at_its_reference_is_drift_not_a_saving() -> None:
    """Spans that ran 20 % less CPU than the reference: the host's drift, reported apart and never as a negative
    cost among the parts beyond the ideal pipeline; a slower host the other way round."""
    faster = _split(cpu_factor=0.8)
    for st in faster.stages:
        assert st.host_drift_s == pytest.approx(-0.2 * M * (F + B)) and st.compute_cpu_excess_s == 0.0
    assert dict(faster.ranked())["compute_cpu_excess_s"] == 0.0
    slower = _split(cpu_factor=1.2)
    assert all(st.host_drift_s == 0.0 for st in slower.stages)


def test_ideal_step_is_the_simulated_pipeline_on_the_reference_compute() -> None:
    """Hand-computed for 2 stages, 4 micro-batches of F 10 ms + B 20 ms, 128 KiB messages at 1 Gbit/s (T = 1.05
    ms each): stage 0 runs 5 x (F + B) worth of time (fill and drain add one F+B of the other stage) and waits
    for two message crossings twice (after F1 and after F3): 150 + 4 T = 154.19 ms."""
    split = _split()
    transfer = 131072 * 8 / 1e9
    assert split.ideal_step_s is not None and split.overhead_s is not None
    assert split.ideal_step_s == pytest.approx((M + 1) * (F + B) + 4 * transfer, abs=1e-6)


def test_cpu_ledger_accounts_for_the_machine_and_survives_json() -> None:
    split = _split(runq=0.001)
    names = {c.name for c in split.cpu}
    assert {"workers: compute (F/B spans)", "workers: gloo_tcp_loop threads", "delay daemons", "runner", "idle"} <= names
    compute = next(c for c in split.cpu if c.name.startswith("workers: compute"))
    assert compute.runq_s == pytest.approx(2 * 2 * M * 0.001)          # both ranks' spans waited
    whole = sum(c.fraction for c in split.cpu if not c.name.startswith("of which"))
    assert whole == pytest.approx(1.0, abs=0.02)        # the machine accounted for once, whatever the iterations
    assert Breakdown.from_json(split.to_json()).to_json() == split.to_json()


def test_traces_without_per_span_clocks_have_no_breakdown() -> None:
    old = [_trace(0), _trace(1)]
    for t in old:
        for it in t.iterations:
            it.spans = [Span(s.kind, s.mb, s.start, s.end) for s in it.spans]
    assert breakdown(old, [0.0], [1e9]) is None


def _loaded(factor: float, **faults: float) -> Breakdown:
    """Like _split, each stage's loaded reference (compute with the step's messages alongside) `factor` x its
    reference."""
    ranks = [_trace(0, **faults), _trace(1, **faults)]
    for r in ranks:
        r.reference_loaded_s = [factor * M * (F + B), 1.4 * factor * M * (F + B)]      # the least counts
    result = breakdown(ranks, [0.0], [1e9])
    assert result is not None
    return result


def test_the_cores_share_is_the_ideal_pipeline_on_the_loaded_compute() -> None:
    """Compute 10 % slower with the messages alongside: the ideal pipeline on these cores is the same schedule
    simulated with every F and B 10 % longer; its excess over the ideal step is the cores' share of the own
    cost, the rest is the testbed's, and the two add up to the own cost."""
    from workloads.schedule import Action, posting_order
    from workloads.simulate import Costs, simulate

    split = _loaded(1.1, runq=0.01, gap=0.002)
    ranks = [_trace(0), _trace(1)]
    schedule = [posting_order([Action.parse(a) for a in r.actions], False) for r in ranks]
    f, b = [], []
    for _ in ranks:                                   # the spans' F:B split, as the breakdown takes it
        share = (F + 0.01) / (F + B + 0.02)
        f.append(1.1 * (F + B) * share)
        b.append(1.1 * (F + B) * (1 - share))
    expected = simulate(schedule, Costs(f, b, [0.0], [1e9 / 8], 131072, 0, 0.0, None, start_s=[0.0, 0.0]))
    assert split.cores_ideal_step_s == pytest.approx(expected.iteration_s, abs=1e-9)
    assert split.ideal_step_s is not None and split.cores_ideal_step_s > split.ideal_step_s + 0.01
    assert split.cores_cannot_lose_s == pytest.approx(split.cores_ideal_step_s - split.ideal_step_s, abs=1e-9)
    assert split.overhead_s is not None and split.own_beyond_cores_s is not None
    assert split.cores_cannot_lose_s + split.own_beyond_cores_s == pytest.approx(split.overhead_s, abs=1e-9)
    assert Breakdown.from_json(split.to_json()).cores_ideal_step_s == split.cores_ideal_step_s


def test_the_cores_share_never_exceeds_the_own_cost_nor_goes_negative() -> None:
    """A run with a small own cost whose loaded compute was 30 % slower: the schedule served the messages in
    its idle time, so the cores' share is the own cost, not the 45 ms the loaded ideal step is longer; a loaded
    reference faster than the clean one: no share, the own cost is all the testbed's."""
    small = _loaded(1.3, wait=0.04, gap=0.001)
    assert small.overhead_s is not None and 0 < small.overhead_s < 0.02
    assert small.cores_cannot_lose_s == pytest.approx(small.overhead_s) and small.own_beyond_cores_s == pytest.approx(0.0)
    faster = _loaded(0.9, runq=0.004)
    assert faster.cores_cannot_lose_s == 0.0 and faster.own_beyond_cores_s == faster.overhead_s


def test_without_a_loaded_reference_there_is_no_cores_share() -> None:
    split = _split(runq=0.004)
    assert split.cores_ideal_step_s is None and split.cores_cannot_lose_s is None and split.own_beyond_cores_s is None


def test_the_cores_share_compares_wall_with_wall() -> None:
    """A clean reference that waited 30 % beyond its CPU for its core (wall 1.3x CPU) and a loaded reference of
    that same wall time: the messages cost the compute nothing, so the cores' share is 0 (against the ideal
    step's CPU reference it would come out at 30 % of the compute)."""
    wall = 1.3 * M * (F + B)
    ranks = [_trace(r, runq=0.01, reference_waited=0.3 * M * (F + B)) for r in (0, 1)]
    for r in ranks:
        r.reference_loaded_s = [wall, 1.2 * wall]
    split = breakdown(ranks, [0.0], [1e9])
    assert split is not None and split.overhead_s is not None and split.overhead_s > 0.03
    assert split.cores_ideal_step_s == pytest.approx(split.cores_base_step_s, abs=1e-9)
    assert split.cores_cannot_lose_s == 0.0 and split.own_beyond_cores_s == pytest.approx(split.overhead_s)
