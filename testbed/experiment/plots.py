"""PNG plots of an experiment (matplotlib, headless): bubble ratio vs distance (measured and modelled),
one iteration as a per-stage timeline for 1f1b vs geopipe at the focus distance, the memory-budget curve."""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

import matplotlib

from testbed.experiment.records import ExperimentRecord, Point
from workloads.records import RankTrace

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

COLORS = {"gpipe": "tab:gray", "1f1b": "tab:red", "1f1b-prefetch": "tab:orange", "geopipe": "tab:blue",
          "torch-1f1b": "tab:brown", "torch-zbv": "tab:purple", "torch-interleaved-1f1b": "tab:pink",
          "torch-dualpipev": "tab:olive", "torch-gpipe": "tab:cyan"}


def render_all(exp_dir: Path) -> list[Path]:
    record = ExperimentRecord.load(exp_dir)
    out = [bubble_vs_distance(record, exp_dir / "bubble_vs_distance.png"),
           gantt(record, exp_dir / "timeline_1f1b_vs_geopipe.png"), cut_vs_distance(record, exp_dir / "bubble_cut.png")]
    if record.budget_points():
        out.append(memory_budget(record, exp_dir / "memory_budget.png"))
    if record.sweep("rate"):
        out.append(sweep_plot(record, "rate", lambda p: p.rate_bps * 1e-6, "OTN link rate (Mbit/s)",
                              exp_dir / "rate.png"))
    if record.sweep("microbatches"):
        out.append(sweep_plot(record, "microbatches", lambda p: p.microbatches, "micro-batches per iteration",
                              exp_dir / "microbatches.png"))
    return [p for p in out if p]


def bubble_vs_distance(record: ExperimentRecord, path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for schedule in record.spec.headline_schedules:
        by_km: dict[float, list[float]] = {}
        model: dict[float, float] = {}
        for p in record.headline_points(schedule):
            if p.bubble is None:
                continue
            by_km.setdefault(p.distance_km, []).append(p.bubble)
            if p.predicted_bubble is not None:
                model[p.distance_km] = p.predicted_bubble
        for m in record.model_only:
            if m.schedule == schedule:
                model[m.distance_km] = m.bubble
        kms = sorted(by_km)
        if not kms:
            continue
        means = [statistics.median(by_km[k]) for k in kms]            # medians, as the tables
        lo = [means[i] - min(by_km[k]) for i, k in enumerate(kms)]
        hi = [max(by_km[k]) - means[i] for i, k in enumerate(kms)]
        color = COLORS.get(schedule)
        ax.errorbar(kms, means, yerr=[lo, hi], fmt="o-", color=color, capsize=3, label=f"{schedule} (measured)")
        if model:
            mk = sorted(model)
            ax.plot(mk, [model[k] for k in mk], "--", color=color, alpha=0.7, label=f"{schedule} (model)")
    ax.set_xlabel("cross-DC distance (km of fibre; one-way delay = 5 us/km)")
    ax.set_ylabel("bubble ratio: 1 - uncontended compute / step time")
    ax.set_ylim(bottom=0)
    stages = next((len(p.measured.bubble_ratio_per_stage or []) for p in record.points), 0) or "?"
    world = "real compute" if record.spec.compute == "real" else f"compute as time: {record.spec.compute}"
    ax.set_title(f"Bubble ratio vs distance, {stages} pipeline stages ({world})")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def cut_vs_distance(record: ExperimentRecord, path: Path) -> Path | None:
    """geopipe's bubble cut against 1f1b and against 1f1b-prefetch per distance, beside the paper's 78.91 %."""
    kms = sorted({p.distance_km for p in record.sweep("distance")})
    series: dict[str, list[tuple[float, float]]] = {"1f1b": [], "1f1b-prefetch": []}
    for km in kms:
        pts = record.headline_points(km=km)
        geo = [p.bubble for p in pts if p.schedule == "geopipe" and p.bubble is not None]
        for base in series:
            ref = [p.bubble for p in pts if p.schedule == base and p.bubble is not None]
            if geo and ref and statistics.median(ref) > 0:
                series[base].append((km, 1 - statistics.median(geo) / statistics.median(ref)))
    if not any(series.values()):
        return None
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for base, values in series.items():
        if values:
            ax.plot([k for k, _ in values], [100 * c for _, c in values], "o-", color=COLORS[base],
                    label=f"geopipe vs {base}")
    ax.axhline(78.91, color="black", linestyle=":", label="GeoPipe paper: up to 78.91 % vs 1F1B")
    ax.set_title(f"GeoPipe's bubble cut ({record.spec.compute} compute)")
    return _finish(fig, ax, "cross-DC distance (km)", path, "bubble cut: 1 - geopipe's bubble / the baseline's (%)")


def _focus_run(record: ExperimentRecord, schedule: str) -> Path | None:
    pts = record.headline_points(schedule, record.spec.focus_km)
    return Path(pts[0].run_dir) / schedule if pts else None


def gantt(record: ExperimentRecord, path: Path) -> Path | None:
    runs = {s: _focus_run(record, s) for s in ("1f1b", "1f1b-prefetch", "geopipe")}
    runs = {s: d for s, d in runs.items() if d and d.exists()}
    if not runs:
        return None
    fig, axes = plt.subplots(len(runs), 1, figsize=(10, 1.6 + 1.3 * len(runs)), sharex=True)
    axes = [axes] if len(runs) == 1 else list(axes)
    longest = 0.0
    for ax, (schedule, run_dir) in zip(axes, runs.items(), strict=True):
        ranks = [RankTrace.from_json(json.loads(p.read_text())) for p in sorted(run_dir.glob("rank-*.json"))
                 if not p.name.endswith(".dilated.json")]
        index = next(i for i, it in enumerate(ranks[0].iterations) if not it.warmup)
        origin = min(r.iterations[index].start for r in ranks)
        for r in ranks:
            it = r.iterations[index]
            for span in it.spans:
                color = {"F": "tab:blue", "B": "tab:orange"}.get(span.kind, "lightgray")
                ax.barh(r.rank, span.seconds * 1e3, left=(span.start - origin) * 1e3, color=color, edgecolor="none",
                        height=0.6)
            longest = max(longest, (it.end - origin) * 1e3)
        ax.set_yticks(range(len(ranks)), [f"stage {r.rank}" for r in ranks])
        ax.invert_yaxis()
        ax.set_title(f"{schedule} at {record.spec.focus_km:g} km: one steady iteration", fontsize=10)
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in ("tab:blue", "tab:orange", "lightgray")]
    fig.legend(handles, ["forward", "backward", "waiting for a receive / send"], fontsize=8, loc="upper center",
               ncol=3, frameon=False)
    axes[-1].set_xlabel("time since the iteration started (ms)")
    axes[-1].set_xlim(0, longest * 1.02)
    fig.tight_layout(rect=(0, 0, 1, 0.93))
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def memory_budget(record: ExperimentRecord, path: Path) -> Path:
    pts = record.budget_points()
    fig, ax = plt.subplots(figsize=(7, 4.2))
    xs = list(range(len(pts)))
    ax.plot(xs, [p.bubble for p in pts], "o-", color=COLORS["geopipe"], label="geopipe (measured)")
    if all(p.predicted_bubble is not None for p in pts):
        ax.plot(xs, [p.predicted_bubble for p in pts], "--", color=COLORS["geopipe"], alpha=0.7,
                label="geopipe (model)")
    focus = record.spec.focus_km
    for base in ("1f1b", "1f1b-prefetch"):
        values = [p.bubble for p in record.headline_points(base, focus) if p.bubble is not None]
        if values:
            ax.axhline(statistics.median(values), color=COLORS[base], ls=":", label=f"{base} (measured)")
    for p, x in zip(pts, xs, strict=True):
        peak = (p.measured.peak_inflight_activation_bytes or 0) / 2**20
        ax.annotate(f"peak {peak:.1f} MiB", (x, p.bubble), textcoords="offset points", xytext=(0, 8), ha="center",
                    fontsize=7)
    ax.set_xticks(xs, [p.memory_budget or "none" for p in pts])
    ax.set_title(f"The HBM trade-off at {focus:g} km")
    return _finish(fig, ax, "memory budget per stage (1f1b+N: 1F1B's in-flight memory plus N micro-batches)", path)


def sweep_plot(record: ExperimentRecord, sweep: str, x_of: Callable[[Point], float], xlabel: str, path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for schedule in ("1f1b-prefetch", "geopipe"):
        pts = sorted(record.sweep(sweep, schedule), key=x_of)
        xs = [x_of(p) for p in pts]
        ax.plot(xs, [p.bubble for p in pts], "o-", color=COLORS[schedule], label=f"{schedule} (measured)")
        ax.plot(xs, [p.predicted_bubble for p in pts], "--", color=COLORS[schedule], alpha=0.7,
                label=f"{schedule} (model)")
    return _finish(fig, ax, xlabel, path)


def _finish(fig: Any, ax: Any, xlabel: str, path: Path,
            ylabel: str = "bubble ratio: 1 - uncontended compute / step time") -> Path:
    """Axes, grid and legend of a bubble-ratio plot; write the PNG and free the figure."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
