"""Model fitting, the experiment report and plots, from synthetic data (no root, no network)."""

from __future__ import annotations

from pathlib import Path

import matplotlib  # noqa: F401,E402  (a broken install fails here, it does not skip)
import pytest
import torch  # noqa: F401,E402

from testbed.experiment import report  # noqa: E402
from testbed.experiment.model import StageTimes, predict  # noqa: E402
from testbed.experiment.records import ExperimentRecord, ExperimentSpec, ModelPrediction, Point  # noqa: E402
from testbed.run.summary import ScheduleSummary  # noqa: E402
from workloads.sampling import ComputeSamples  # noqa: E402
from workloads.schedule import GeoPipeSizing  # noqa: E402

TIMES = StageTimes(forward_s=[0.008, 0.009], backward_s=[0.015, 0.016], activation_bytes=131072,
                   stash_bytes=[5_000_000, 5_000_000])


def test_model_draws_from_the_measured_compute_and_charges_the_probed_message_cost() -> None:
    """With every micro-batch alike the draws change nothing; with a spread around the same means the expected
    1F1B step is longer (a slow micro-batch holds up the next stage, a fast one cannot give it back); the
    probed per-message cost is charged on every message: 2 x 32 messages cross, each pays it once."""
    flat = StageTimes(forward_s=[0.008, 0.008], backward_s=[0.016, 0.016], activation_bytes=131072,
                      stash_bytes=[1 << 20] * 2,
                      samples=ComputeSamples([[0.008] * 32] * 2, [[0.016] * 32] * 2))
    spread = StageTimes(forward_s=[0.008, 0.008], backward_s=[0.016, 0.016], activation_bytes=131072,
                        stash_bytes=[1 << 20] * 2, samples=ComputeSamples([[0.004, 0.012] * 16] * 2,
                                                                           [[0.008, 0.024] * 16] * 2))
    means = StageTimes(forward_s=[0.008, 0.008], backward_s=[0.016, 0.016], activation_bytes=131072,
                       stash_bytes=[1 << 20] * 2)
    at = predict("1f1b-prefetch", flat, 32, [0.005], [1e9])[0].iteration_s
    assert at == pytest.approx(predict("1f1b-prefetch", means, 32, [0.005], [1e9])[0].iteration_s, rel=1e-9)
    assert predict("1f1b-prefetch", spread, 32, [0.005], [1e9])[0].iteration_s > at * 1.03
    costed = StageTimes(**{**{f: getattr(flat, f) for f in flat.__dataclass_fields__}, "message_cost_s": 0.001})
    near = predict("1f1b-prefetch", costed, 32, [0.0], [1e9])[0].iteration_s
    assert near > predict("1f1b-prefetch", flat, 32, [0.0], [1e9])[0].iteration_s + 0.02
    assert StageTimes.from_json(spread.to_json()) == spread


def test_model_orders_schedules_and_budget_bounds() -> None:
    far = {s: predict(s, TIMES, 32, [0.005], [1e9])[0].mean_bubble_ratio
           for s in ("gpipe", "1f1b", "1f1b-prefetch", "geopipe")}
    assert far["geopipe"] < far["1f1b-prefetch"] < far["1f1b"] < far["gpipe"]
    tight, geo = predict("geopipe", TIMES, 32, [0.005], [1e9], memory_budget="1f1b+0")
    assert geo is not None and geo.bound[0] == "memory budget" and geo.extra_inflight[0] == 0
    assert tight.mean_bubble_ratio > far["geopipe"]
    assert tight.iteration_s == pytest.approx(predict("1f1b-prefetch", TIMES, 32, [0.005], [1e9])[0].iteration_s)


def _point(sweep: str, km: float, schedule: str, bubble: float, model: float, rep: int = 0,
           budget: str | None = "1f1b+1", run_dir: str = "", step: float = 1.0, peak: int | None = 11_000_000,
           sizing: GeoPipeSizing | None = None) -> Point:
    measured = ScheduleSummary(
        schedule=schedule, bubble_ratio=bubble - 0.05, bubble_ratio_per_stage=[bubble, bubble], step_time_s=step,
        step_time_spread_s=[step, step], tokens_per_s=8000.0 / step, bubble_ratio_iterations=None, exposed_comm_s=0.1,
        exposed_comm_s_per_stage=None, compute_s_per_stage=None, peak_inflight_activation_bytes=peak,
        peak_inflight_activation_bytes_per_stage=None, loss_first=3.3, loss_last=3.2, iterations=4,
        bubble_vs_reference=bubble, span_stretch_per_stage=[1.10, 1.0] if peak else None, geopipe_sizing=sizing)
    return Point(sweep=sweep, distance_km=km, delay_s=km * 5e-6, rate_bps=1e9, microbatches=32, schedule=schedule,
                 repetition=rep, memory_budget=budget, rtt_s=2 * km * 5e-6 + 1e-4, measured=measured,
                 predicted_bubble=model, predicted_step_s=1.0, run_dir=run_dir)


BOUND = GeoPipeSizing((1, 0), (0, 3), (3, 0), ("memory budget", "no link"))
HIDDEN = GeoPipeSizing((3, 0), (0, 5), (3, 0), ("hidden", "no link"))


@pytest.fixture
def experiment_dir(tmp_path: Path) -> Path:
    points = [_point("distance", 0, "1f1b", 0.20, 0.20), _point("distance", 0, "1f1b-prefetch", 0.15, 0.15),
              _point("distance", 0, "geopipe", 0.10, 0.09),
              _point("distance", 1000, "1f1b", 0.44, 0.42, step=2.0, peak=8_000_000),
              _point("distance", 1000, "1f1b-prefetch", 0.30, 0.30, step=1.5, peak=8_500_000),
              _point("distance", 1000, "geopipe", 0.08, 0.05, step=1.0, peak=12_000_000, sizing=BOUND),
              _point("distance", 1000, "torch-1f1b", 0.40, 0.40, budget=None, step=1.8, peak=None),
              _point("repeat", 1000, "1f1b", 0.42, 0.42, rep=1, step=2.2, peak=8_000_000),
              _point("repeat", 1000, "1f1b-prefetch", 0.32, 0.30, rep=1, step=1.6, peak=8_500_000),
              _point("repeat", 1000, "geopipe", 0.09, 0.05, rep=1, step=1.0, peak=12_000_000, sizing=BOUND),
              _point("repeat", 1000, "torch-1f1b", 0.40, 0.40, rep=1, budget=None, step=1.8, peak=None),
              _point("budget", 1000, "geopipe", 0.30, 0.29, budget="1f1b+0", sizing=BOUND),
              _point("budget", 1000, "geopipe", 0.09, 0.06, budget="1f1b+3", sizing=HIDDEN)]
    record = ExperimentRecord(
        id="test", spec=ExperimentSpec(schedules=["1f1b", "1f1b-prefetch", "geopipe"], focus_schedules=["torch-1f1b"],
                                       memory_budget="1f1b+1", focus_km=1000),
        environment={"shaper": "delayline", "transport": "gloo-tcp", "kernel": "k", "cpus": 2,
                     "versions": {"torch": "2.13.0"}, "seconds": 1.0},
        points=points, model_only=[ModelPrediction(distance_km=5000, schedule="geopipe", bubble=0.3, step_s=2.0)])
    record.save(tmp_path)
    return tmp_path


def test_report_tables_flag_divergence_and_state_spread(experiment_dir: Path) -> None:
    doc = ExperimentRecord.load(experiment_dir)
    headers, rows, notes = report.distance_rows(doc)
    row = rows[1]
    assert row[0] == "1000" and "[0.420-0.440]" in row[headers.index("bubble 1f1b (model)")]
    assert row[headers.index("bubble geopipe (model)")].endswith("!")          # 0.05 vs 0.085: flagged
    assert any("geopipe at 1000 km" in n for n in notes)
    fh, fr = report.focus_rows(doc)
    by = {r[0]: r for r in fr}
    assert by["1f1b"][fh.index("geopipe speed-up")] == "2.10x"               # median step 2.1 s vs 1.0 s
    assert by["1f1b-prefetch"][fh.index("geopipe speed-up")] == "1.55x"
    assert by["1f1b"][fh.index("geopipe memory x")] == "1.50x"                # 12 MB vs 8 MB
    assert by["torch-1f1b"][fh.index("peak in-flight")] == "not measured"
    assert by["geopipe"][fh.index("stretch")] == "1.10 !"
    lines = "\n".join(report.headline(doc))
    assert "it binds: geopipe wanted 3/0 extra micro-batches per stage, held 1/0" in lines
    assert "geopipe vs 1f1b: bubble 0.430 -> 0.085 (cut 80.2%)" in lines
    # (0.43 - 0.31) / (0.43 - 0.085) of the cut is early posting, the rest overlap
    assert "early accounts for 35% (1f1b-prefetch: 0.310) and overlap under the budget for 65%" in lines
    assert "the fair figure, against 1f1b-prefetch, is 72.6%" in lines
    assert "Least budget of the sweep under which the plan hid the link: 1f1b+3" in lines
    assert "torch-1f1b ran without the budget" in lines


def test_plots_and_reports_are_written(experiment_dir: Path) -> None:
    summary = report.rerender(experiment_dir)
    assert "memory budget at 1000 km" in summary and "at 1000 km, budget 1f1b+1" in summary
    for name in ("bubble_vs_distance.png", "memory_budget.png", "bubble_cut.png"):
        png = experiment_dir / name
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    html = (experiment_dir / "report.html").read_text()
    assert html.count("data:image/png;base64,") == 3 and "<table>" in html
    assert "GeoPipe paper reports a bubble cut of up to 78.91% against 1F1B" in summary
    assert "![bubble_vs_distance.png](bubble_vs_distance.png)" in (experiment_dir / "report.md").read_text()


def test_every_schedule_is_judged_by_one_yardstick_per_layout() -> None:
    """The bubble's yardstick must not vary with the schedule: one per stage layout, the median of the
    references of the schedules that share it (in a run they are interleaved and share one measurement)."""
    from testbed.run.metrics import pool_references

    def summary(schedule: str, reference: list[float], step: float) -> ScheduleSummary:
        s = _point("distance", 1000, schedule, 0.5, 0.5, step=step).measured
        s.reference_compute_s_per_stage, s.compute_s_per_stage = reference, [0.8, 0.8]
        return s

    one, geo = summary("1f1b", [0.5, 0.6], 2.0), summary("geopipe", [0.4, 0.7], 1.0)
    pre, zbv = summary("1f1b-prefetch", [0.45, 0.8], 1.5), summary("torch-zbv", [0.9, 0.9], 1.5)
    pool_references([one, geo, pre, zbv])
    assert one.reference_yardstick_s_per_stage == geo.reference_yardstick_s_per_stage == pytest.approx([0.45, 0.7])
    assert one.reference_pooled_runs == 3 and zbv.reference_pooled_runs == 1          # another layout: its own
    assert one.bubble_vs_reference == pytest.approx(1 - (0.45 + 0.7) / 2 / 2.0)
    assert geo.bubble_vs_reference == pytest.approx(1 - (0.45 + 0.7) / 2 / 1.0)
    assert geo.span_stretch_per_stage == pytest.approx([0.8 / 0.45, 0.8 / 0.7])


def test_link_error_is_each_launchs_probe_beyond_the_0km_launchs_judged_against_verifys_tolerance() -> None:
    from testbed.experiment.sweep import link_excess
    base = StageTimes(forward_s=[0.0, 0.0], backward_s=[0.0, 0.0], activation_bytes=0, stash_bytes=[0, 0],
                      probed_cost_per_link_s=[0.4e-3, -0.1e-3])
    launch = StageTimes(forward_s=[0.0, 0.0], backward_s=[0.0, 0.0], activation_bytes=0, stash_bytes=[0, 0],
                        probed_cost_per_link_s=[0.45e-3, 0.4e-3])
    excess, bound = link_excess(launch, base, [0.0, 10e-3])
    assert excess == [pytest.approx(0.05e-3), pytest.approx(0.5e-3)]
    assert bound == [pytest.approx(0.1e-3), pytest.approx(0.3e-3)]     # the floor at 0 km, 3 % of 10 ms
    noisy = StageTimes(forward_s=[0.0, 0.0], backward_s=[0.0, 0.0], activation_bytes=0, stash_bytes=[0, 0],
                       probed_cost_per_link_s=[0.8e-3, 0.4e-3])
    _, bound = link_excess(noisy, base, [0.0, 10e-3])                  # the unswept link read 0.4 ms of noise
    assert bound == [pytest.approx(0.4e-3), pytest.approx(0.4e-3)]
    assert link_excess(launch, StageTimes([0.0], [0.0], 0, [0]), [0.0, 10e-3]) == (None, None)


def test_the_report_judges_the_independent_model_and_shows_the_blind_one_and_the_link_error(tmp_path: Path) -> None:
    right, slow = _point("distance", 0, "1f1b", 0.2, 0.2, step=1.0), _point("distance", 2000, "1f1b", 0.5, 0.5, step=2.0)
    right.predicted_step_from_0km_s, right.predicted_step_blind_s = 1.01, 1.01
    slow.predicted_step_from_0km_s, slow.predicted_step_blind_s = 1.96, 1.0
    right.link_excess_s, right.link_excess_bound_s = [0.02e-3], [0.1e-3]
    slow.link_excess_s, slow.link_excess_bound_s = [0.6e-3], [0.3e-3]
    record = ExperimentRecord(id="t", spec=ExperimentSpec(schedules=["1f1b"]), points=[right, slow],
                              environment={"shaper": "delayline", "transport": "gloo-tcp", "kernel": "k", "cpus": 2,
                                           "versions": {}, "seconds": 1.0}, model_inputs=TIMES)
    lines = "\n".join(report.headline(record))
    assert "from inputs independent of the links it predicts" in lines
    assert "step time within 2.0% of the measurement at every point (2 points" in lines
    assert "The network-blind model (every delay 0): within 50.0%" in lines and "1 of 2 points beyond 3%" in lines
    assert ("in the 0 km launch largest +0.600 ms against verify's tolerance 0.300 ms (1f1b at 2000 km), BEYOND it: "
            "1f1b @2000 km; each run's own one-way check: every link on its plan.") in lines
    slow.link_excess_bound_s, slow.links_on_plan = None, False          # another launch: shown, not judged
    lines = "\n".join(report.headline(record))
    assert "in other launches (the host's drift between launches included) largest +0.600 ms (1f1b at 2000 km" in lines
    assert "every link within it" in lines and "1 run(s) with a link off its plan" in lines
    headers, rows = report.cut_rows(record)
    assert rows[1][headers.index("model step error per schedule (network-blind model's)")] == "1f1b -2.0% (-50.0%)"


def test_the_independent_model_takes_the_launchs_compute_and_the_calibration_launchs_host_costs() -> None:
    from testbed.experiment.sweep import with_compute_of
    host = StageTimes(forward_s=[0.01], backward_s=[0.02], activation_bytes=1, stash_bytes=[1], message_cost_s=3e-4,
                      send_lag_s=[1e-4], recv_lag_s=[2e-4], start_offset_s=[0.0], reference_s=[0.03])
    launch = StageTimes(forward_s=[0.012], backward_s=[0.025], activation_bytes=1, stash_bytes=[1], message_cost_s=9e-4,
                        send_lag_s=[7e-4], recv_lag_s=[8e-4], start_offset_s=[5e-3], reference_s=[0.037])
    mixed = with_compute_of(host, launch)
    assert (mixed.forward_s, mixed.backward_s, mixed.reference_s) == ([0.012], [0.025], [0.037])
    assert (mixed.message_cost_s, mixed.send_lag_s, mixed.recv_lag_s, mixed.start_offset_s) == (3e-4, [1e-4], [2e-4],
                                                                                                [0.0])
