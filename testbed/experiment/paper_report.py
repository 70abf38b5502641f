"""The paper experiment's report (Markdown) and plot: every point measured beside the model, geopipe's cuts
against 1F1B and 1F1B with early receives, the optimisation point, and the paper's own figures beside ours."""

from __future__ import annotations

import platform
import time
from pathlib import Path
from typing import Any

OPTIMUM_GAIN = 0.01
"""The optimisation point: the lowest spine rate past which the next one modelled shortens geopipe's step by
under 1 %."""
PAPER_BUBBLE_CUT = 0.7891
PAPER_ITERATION_CUT = 0.091
BUBBLE_DEFINITION = (
    "bubble = 1 - a stage's compute / the step, the mean over the stages, where compute is what the profile states "
    "for the step's m micro-batches (F + B each) and the step is the measured iteration time (the model: its "
    "predicted one). The paper's \"computation bubble\" is the share of a device's time it does not compute; its "
    "exact averaging over devices is not given in the reading note.")


def _f(x: float | None, fmt: str = ".3f") -> str:
    return "-" if x is None else format(x, fmt)


def _cut(new: float | None, old: float | None) -> float | None:
    return None if new is None or not old else 1 - new / old


def cuts(points: list[Any], against: str = "1f1b") -> list[dict[str, Any]]:
    """Per spine rate and distance: geopipe's bubble and step cut against `against`, measured and modelled."""
    by = {(p.spine_gbps, p.distance_km, p.schedule): p for p in points}
    rows = []
    for (spine, km, schedule), geo in sorted(by.items()):
        base = by.get((spine, km, against))
        if schedule != "geopipe" or base is None:
            continue
        rows.append({"spine_gbps": spine, "distance_km": km, "against": against,
                     "bubble_cut": _cut(geo.bubble, base.bubble), "bubble_cut_model": _cut(geo.planned.bubble,
                                                                                           base.planned.bubble),
                     "step_cut": _cut(geo.step_s, base.step_s), "step_cut_model": _cut(geo.planned.step_s,
                                                                                       base.planned.step_s)})
    return rows


def report(spec: Any, points: list[Any], curve: list[dict[str, Any]]) -> str:
    """The whole report as Markdown."""
    lines = [f"# GeoPipe's experiment in its regime: {spec.profile} on {spec.topology}",
             "", f"Measured {time.strftime('%Y-%m-%d %H:%M')} on {platform.node()} ({platform.release()}); compute as "
             f"time from the profile, {spec.tokens} tokens per step, {spec.iterations} timed iterations per run. "
             "Every schedule runs at the shape the planner chose for it at that point (workloads/shapes.py).",
             "", BUBBLE_DEFINITION, "", "## Points", "",
             "The network-blind model is the same schedule and shape with every OTN span at 0 km: a point where its "
             "error is near the model's cannot tell a right link from a wrong one.", "",
             "| spine Gb/s | km | schedule | b x s, m | dN planned / run | F+B ms | step s (model, error) "
             "| network-blind model (error) | bubble (model) | links |", "|---|---|---|---|---|---|---|---|---|---|"]
    for p in points:
        o = p.planned
        lines.append(f"| {p.spine_gbps:g} | {p.distance_km:g} | {p.schedule} | {o.microbatch_size} x {o.seq_len}, "
                     f"{o.microbatches} | {list(o.extra) or '-'} / {p.extra_run or '-'} | {_f(p.fb_ms, '.1f')} | "
                     f"{_f(p.step_s)} ({_f(o.step_s)}, {_f(p.model_error, '+.1%')}) | "
                     f"{_f(p.blind_step_s)} ({_f(p.blind_error, '+.1%')}) | {_f(p.bubble)} ({_f(o.bubble)}) "
                     f"| {'-' if p.links_on_time is None else ('on time' if p.links_on_time else 'LATE')} |")
    lines += ["", "## geopipe's cut", "", "| spine Gb/s | km | against | bubble cut (model) | iteration cut (model) |",
              "|---|---|---|---|---|"]
    all_cuts = cuts(points) + cuts(points, "1f1b-prefetch")
    for c in all_cuts:
        lines.append(f"| {c['spine_gbps']:g} | {c['distance_km']:g} | {c['against']} | {_f(c['bubble_cut'], '.1%')} "
                     f"({_f(c['bubble_cut_model'], '.1%')}) | {_f(c['step_cut'], '.1%')} "
                     f"({_f(c['step_cut_model'], '.1%')}) |")
    lines += ["", _largest(all_cuts), "", "## The optimisation point (model)", ""]
    for km in spec.distances_km:
        at = optimisation_point(curve, km)
        lines.append(f"- {km:g} km: " + (f"past {at:g} Gb/s the next spine rate modelled shortens geopipe's step by "
                                        "under 1 %" if at else "no point in the modelled range: more rate still helps"))
    return "\n".join(lines) + "\n"


def _largest(rows: list[dict[str, Any]]) -> str:
    """The point of largest measured bubble cut against 1F1B, beside the paper's figures."""
    own = [r for r in rows if r["against"] == "1f1b" and r["bubble_cut"] is not None]
    if not own:
        return "No point has both geopipe and 1F1B measured."
    top = max(own, key=lambda r: r["bubble_cut"])
    return (f"Largest cut against 1F1B: {top['spine_gbps']:g} Gb/s, {top['distance_km']:g} km: bubble "
            f"{top['bubble_cut']:.1%} lower (model {_f(top['bubble_cut_model'], '.1%')}), iteration "
            f"{_f(top['step_cut'], '.1%')} shorter (model {_f(top['step_cut_model'], '.1%')}). The paper reports up "
            f"to {PAPER_BUBBLE_CUT:.2%} lower bubble and {PAPER_ITERATION_CUT:.1%} shorter iterations on average.")


def optimisation_point(curve: list[dict[str, Any]], km: float, schedule: str = "geopipe") -> float | None:
    """The lowest spine rate past which the next one shortens `schedule`'s modelled step by under OPTIMUM_GAIN."""
    rows = sorted((r for r in curve if r["distance_km"] == km and r["schedule"] == schedule and r["step_s"]),
                  key=lambda r: r["spine_gbps"])
    for a, b in zip(rows, rows[1:], strict=False):
        if 1 - b["step_s"] / a["step_s"] < OPTIMUM_GAIN:
            return a["spine_gbps"]
    return None


def plot(path: Path, spec: Any, points: list[Any], curve: list[dict[str, Any]]) -> None:
    """Step time and bubble against the spine rate: the model's curves, the runs as markers, per distance."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    colors = {"1f1b": "tab:red", "1f1b-prefetch": "tab:orange", "geopipe": "tab:blue"}
    styles = ["-", "--", ":", "-."]
    for i, km in enumerate(spec.distances_km):
        for schedule in spec.schedules:
            rows = sorted((r for r in curve if r["distance_km"] == km and r["schedule"] == schedule and r["step_s"]),
                          key=lambda r: r["spine_gbps"])
            for ax, key in zip(axes, ("step_s", "bubble"), strict=True):
                ax.plot([r["spine_gbps"] for r in rows], [r[key] for r in rows], styles[i % 4],
                        color=colors.get(schedule), alpha=0.6, label=f"{schedule}, {km:g} km (model)")
            mine = [p for p in points if p.distance_km == km and p.schedule == schedule and p.step_s]
            axes[0].plot([p.spine_gbps for p in mine], [p.step_s for p in mine], "o", color=colors.get(schedule))
            axes[1].plot([p.spine_gbps for p in mine], [p.bubble for p in mine], "o", color=colors.get(schedule))
    for ax, label in zip(axes, ("iteration time, s", "bubble"), strict=True):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("spine rate, Gb/s")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle(f"{spec.profile} on {spec.topology}, {spec.tokens} tokens per step: lines the model, dots measured")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
