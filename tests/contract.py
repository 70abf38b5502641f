"""The summary.json contract every run meets, one machine or several (DESIGN.md: results)."""

from __future__ import annotations

from typing import Any

PER_SCHEDULE = ("bubble_ratio", "bubble_ratio_per_stage", "step_time_s", "tokens_per_s", "exposed_comm_s",
                "peak_inflight_activation_bytes", "bubble_vs_reference", "reference_compute_s_per_stage",
                "span_stretch_per_stage", "budget_bytes_per_stage", "host_load")


def check_summary(summary: dict[str, Any], schedules: list[str], stages: int) -> None:
    """Assert what every run's summary.json holds, whatever ran it."""
    assert summary["topology"] and summary["shaper"] in ("delayline", "netem")
    assert summary["transport"] == "gloo-tcp" and summary["kernel"] and summary["lossless_ok"]
    assert [s["schedule"] for s in summary["schedules"]] == schedules
    assert len(summary["stages"]) == stages and len(summary["stage_links"]) == stages - 1
    for s in summary["schedules"]:
        for key in PER_SCHEDULE:
            assert s[key] is not None, key
        assert 0 < s["bubble_ratio"] < 1 and len(s["bubble_ratio_per_stage"]) == stages
        assert s["bubble_vs_reference"] < 1
        if not summary["oversubscribed"]:   # more workers than cores measure their references at once, contended
            assert s["bubble_ratio"] <= s["bubble_vs_reference"]     # spans never beat the uncontended reference
        assert s["budget_ok"] and all(p <= b for p, b in zip(s["peak_inflight_activation_bytes_per_stage"],
                                                             s["budget_bytes_per_stage"], strict=True))
        assert 0 <= s["host_load"]["steal_fraction"] < 1 and s["host_load"]["run_queue_max"] >= 1
        assert s["loss_first"] > 0 and s["iterations"] >= 1
