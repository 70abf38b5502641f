"""GeoPipe's experiment in its regime (testbed/experiment/paper.py): the shape planner's links at a point (every
OTN hop at the distance, the spine's real rate, the profile's fabric within a DC), geopipe's cuts against the
baselines worked by hand, the optimisation point found on a curve, the report with the paper's figures beside
ours, and (root) the whole experiment on a small topology leaving a report, a plot and nothing running."""

from __future__ import annotations

import json

import pytest
from conftest import netns_with_prefix

from testbed.experiment.paper import PaperPoint, PaperSpec, run_paper
from testbed.experiment.paper_report import cuts, optimisation_point, report
from testbed.experiment.real_beside import RealBesideSpec
from testbed.plan import build_plan
from testbed.run.shapeplan import links_of_plan
from testbed.topology.loader import load_topology
from testbed.topology.profile import resolve_profile
from testbed.util.paths import resolve_topology
from workloads.shapes import ShapeOutcome


def _point(schedule: str, step: float, bubble: float, model_step: float, model_bubble: float, km: float = 1000,
           spine: float = 400) -> PaperPoint:
    planned = ShapeOutcome(schedule, 1, 1024, 256, model_step, model_bubble)
    return PaperPoint(spine_gbps=spine, distance_km=km, schedule=schedule, planned=planned, step_s=step, bubble=bubble)


def test_links_at_a_point_take_the_distance_per_hop_the_spine_and_the_profiles_fabric() -> None:
    plan = build_plan(load_topology(resolve_topology("3dc-8stages")))
    profile = resolve_profile("llama2-13b-910b-tp8")
    stages, links = links_of_plan(plan, profile, delay_s=0.015, real_rate_bps=25e9)
    assert stages == 8 and links.delay_s == [0, 0, 0.015, 0, 0, 0.015, 0]
    assert links.bytes_per_s == [profile.fabric_rate_bps / 8] * 2 + [25e9 / 8] + [profile.fabric_rate_bps / 8] * 2 \
        + [25e9 / 8] + [profile.fabric_rate_bps / 8]
    _, as_planned = links_of_plan(plan, profile)
    assert as_planned.delay_s[2] == pytest.approx(0.005) and as_planned.bytes_per_s[2] == pytest.approx(400e9 / 8)


def test_cuts_are_one_less_geopipes_over_the_baselines() -> None:
    points = [_point("1f1b", 3.0, 0.30, 2.9, 0.29), _point("geopipe", 2.4, 0.12, 2.3, 0.10),
              _point("1f1b-prefetch", 2.7, 0.2, 2.6, 0.2)]
    (row,) = cuts(points)
    assert row["bubble_cut"] == pytest.approx(1 - 0.12 / 0.30) and row["step_cut"] == pytest.approx(0.2)
    assert row["bubble_cut_model"] == pytest.approx(1 - 0.10 / 0.29)
    assert cuts(points, "1f1b-prefetch")[0]["step_cut"] == pytest.approx(1 - 2.4 / 2.7)
    assert points[1].model_error == pytest.approx(2.3 / 2.4 - 1)


def test_the_optimisation_point_is_where_a_faster_spine_stops_helping() -> None:
    curve = [{"distance_km": 1000.0, "schedule": "geopipe", "spine_gbps": g, "step_s": s}
             for g, s in ((6.25, 3.6), (12.5, 2.34), (25, 2.33), (50, 2.32))]
    assert optimisation_point(curve, 1000.0) == 12.5
    steep = [{**r, "step_s": 10 / r["spine_gbps"]} for r in curve]
    assert optimisation_point(steep, 1000.0) is None


def test_the_report_puts_the_papers_figures_beside_the_largest_cut() -> None:
    points = [_point("1f1b", 3.0, 0.30, 2.9, 0.29), _point("geopipe", 2.4, 0.12, 2.3, 0.10),
              _point("1f1b", 2.5, 0.10, 2.5, 0.10, km=0), _point("geopipe", 2.45, 0.09, 2.45, 0.09, km=0)]
    text = report(PaperSpec(distances_km=[0, 1000]), points, [])
    assert "Largest cut against 1F1B: 400 Gb/s, 1000 km: bubble 60.0% lower" in text
    assert "78.91%" in text and "9.1%" in text and "| 400 | 1000 | geopipe | 1 x 1024, 256 |" in text
    assert json.loads(json.dumps(points[0].to_json()))["planned"]["step_s"] == 2.9


@pytest.mark.root
@pytest.mark.slow
def test_the_experiment_on_two_dcs_leaves_its_report_and_nothing_running(tmp_path) -> None:
    spec = PaperSpec(topology="2dc-1000km", profile="gpt-7b-h100", tokens=2**15, spines_gbps=[400.0],
                     distances_km=[1000.0], schedules=("1f1b", "geopipe"), iterations=1, seq_lens=(4096,),
                     microbatch_sizes=(1, 2), model_spines_gbps=[100.0, 400.0], results=str(tmp_path),
                     real_beside=RealBesideSpec(stages=2, iterations=2))
    out = run_paper(spec, log=lambda _m: None)
    summary = json.loads((out / "summary.json").read_text())
    assert [p["schedule"] for p in summary["points"]] == ["1f1b", "geopipe"]
    for p in summary["points"]:
        assert p["step_s"] > 0 and p["links_on_time"] is not False and p["dilation"] >= 1
        assert abs(p["planned"]["step_s"] / p["step_s"] - 1) < 0.10, p      # the model within 10 % on 2 stages
    assert (out / "paper.png").stat().st_size > 10_000 and "geopipe's cut" in (out / "report.md").read_text()
    real = summary["real_beside"]                 # the small GPT for real on the same links: as one process trains
    assert [r["schedule"] for r in real] == ["1f1b", "geopipe"] and all(r["ok"] for r in real), real
    assert all(r["loss_last"] < r["loss_first"] and r["gradient_gap"] < 1e-3 for r in real)
    assert "real arithmetic (this host's regime)" in (out / "report.md").read_text()
    assert netns_with_prefix("tb-pp") == []


def test_the_network_blind_model_is_the_same_shape_at_0_km_and_far_from_a_long_links_step() -> None:
    """At 3000 km 1F1B's step pays the spans; the blind model does not, so the points that far can tell a right
    link from a wrong one. At 0 km the two are one model."""
    from testbed.experiment.paper import blind_step
    from testbed.run.shapeplan import profile_costs
    from workloads.shapes import ShapeSpace, plan_shapes

    spec = PaperSpec(spines_gbps=[400], distances_km=[3000], real_beside=None)
    plan = build_plan(load_topology(resolve_topology("3dc-8stages")))
    profile = resolve_profile(spec.profile)
    stages, far = links_of_plan(plan, profile, delay_s=3000 * 5e-6, real_rate_bps=400e9)
    shape = plan_shapes("1f1b", spec.tokens, profile_costs(profile, stages), far, ShapeSpace((8,), (1024,))).best
    assert shape is not None
    blind = blind_step(plan, profile, spec.tokens, "1f1b", shape)
    assert blind is not None and blind < 0.9 * shape.step_s
    point = PaperPoint(spine_gbps=400, distance_km=3000, schedule="1f1b", planned=shape, step_s=shape.step_s,
                       blind_step_s=blind)
    assert point.blind_error == pytest.approx(blind / shape.step_s - 1) and point.blind_error < -0.1
    _, near = links_of_plan(plan, profile, delay_s=0.0)
    at_zero = plan_shapes("1f1b", spec.tokens, profile_costs(profile, stages), near, ShapeSpace((8,), (1024,))).best
    assert at_zero is not None and blind == pytest.approx(at_zero.step_s)
