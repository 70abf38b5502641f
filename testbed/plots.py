"""PNG plots of an experiment (matplotlib, headless): bubble ratio vs distance (measured and modelled),
one iteration as a per-stage timeline for 1f1b vs geopipe at the focus distance, the memory-budget curve."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

COLORS = {"gpipe": "tab:gray", "1f1b": "tab:red", "geopipe": "tab:blue"}


def render_all(exp_dir: Path) -> list[Path]:
    doc = json.loads((exp_dir / "summary.json").read_text())
    out = [bubble_vs_distance(doc, exp_dir / "bubble_vs_distance.png"),
           gantt(doc, exp_dir / "timeline_1f1b_vs_geopipe.png")]
    if any(p["sweep"] == "budget" for p in doc["points"]):
        out.append(memory_budget(doc, exp_dir / "memory_budget.png"))
    if any(p["sweep"] == "rate" for p in doc["points"]):
        out.append(sweep_plot(doc, "rate", "rate_bps", 1e-6, "OTN link rate (Mbit/s)", exp_dir / "rate.png"))
    if any(p["sweep"] == "microbatches" for p in doc["points"]):
        out.append(sweep_plot(doc, "microbatches", "microbatches", 1, "micro-batches per iteration",
                              exp_dir / "microbatches.png"))
    return [p for p in out if p]


def bubble_vs_distance(doc: dict[str, Any], path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    budget = doc["spec"]["memory_budget"]
    for schedule in doc["spec"]["schedules"]:
        pts = [p for p in doc["points"] if p["schedule"] == schedule and p["sweep"] in ("distance", "repeat")
               and p["memory_budget"] == budget]
        by_km: dict[float, list[float]] = {}
        model: dict[float, float] = {}
        for p in pts:
            by_km.setdefault(p["distance_km"], []).append(p["measured"]["bubble_ratio"])
            if p["predicted_bubble"] is not None:
                model[p["distance_km"]] = p["predicted_bubble"]
        for m in doc.get("model_only", []):
            if m["schedule"] == schedule:
                model[m["distance_km"]] = m["bubble"]
        kms = sorted(by_km)
        means = [statistics.mean(by_km[k]) for k in kms]
        lo = [means[i] - min(by_km[k]) for i, k in enumerate(kms)]
        hi = [max(by_km[k]) - means[i] for i, k in enumerate(kms)]
        color = COLORS.get(schedule)
        ax.errorbar(kms, means, yerr=[lo, hi], fmt="o-", color=color, capsize=3, label=f"{schedule} (measured)")
        if model:
            mk = sorted(model)
            ax.plot(mk, [model[k] for k in mk], "--", color=color, alpha=0.7, label=f"{schedule} (model)")
    ax.set_xlabel("cross-DC distance (km of fibre; one-way delay = 5 us/km)")
    ax.set_ylabel("computation bubble ratio (mean over stages)")
    ax.set_ylim(bottom=0)
    ax.set_title("Bubble ratio vs distance, 2 pipeline stages in 2 DCs")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _focus_run(doc: dict[str, Any], schedule: str) -> Path | None:
    focus = doc["spec"]["focus_km"]
    for p in doc["points"]:
        if p["sweep"] in ("distance", "repeat") and p["schedule"] == schedule and p["distance_km"] == focus:
            return Path(p["run_dir"]) / schedule
    return None


def gantt(doc: dict[str, Any], path: Path) -> Path | None:
    runs = {s: _focus_run(doc, s) for s in ("1f1b", "geopipe")}
    runs = {s: d for s, d in runs.items() if d and d.exists()}
    if not runs:
        return None
    fig, axes = plt.subplots(len(runs), 1, figsize=(10, 1.6 + 1.3 * len(runs)), sharex=True)
    axes = [axes] if len(runs) == 1 else list(axes)
    longest = 0.0
    for ax, (schedule, run_dir) in zip(axes, runs.items(), strict=True):
        ranks = [json.loads(p.read_text()) for p in sorted(run_dir.glob("rank-*.json"))]
        index = next(i for i, it in enumerate(ranks[0]["iterations"]) if not it["warmup"])
        origin = min(r["iterations"][index]["start"] for r in ranks)
        for r in ranks:
            it = r["iterations"][index]
            y = r["rank"]
            for span in it["spans"]:
                start, width = (span["start"] - origin) * 1e3, (span["end"] - span["start"]) * 1e3
                color = {"F": "tab:blue", "B": "tab:orange"}.get(span["kind"], "lightgray")
                ax.barh(y, width, left=start, color=color, edgecolor="none", height=0.6)
            longest = max(longest, (it["end"] - origin) * 1e3)
        ax.set_yticks(range(len(ranks)), [f"stage {r['rank']}" for r in ranks])
        ax.invert_yaxis()
        ax.set_title(f"{schedule} at {doc['spec']['focus_km']:g} km: one steady iteration", fontsize=10)
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in ("tab:blue", "tab:orange", "lightgray")]
    fig.legend(handles, ["forward", "backward", "waiting for a receive / send"], fontsize=8, loc="upper center",
               ncol=3, frameon=False)
    axes[-1].set_xlabel("time since the iteration started (ms)")
    axes[-1].set_xlim(0, longest * 1.02)
    fig.tight_layout(rect=(0, 0, 1, 0.93))
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def memory_budget(doc: dict[str, Any], path: Path) -> Path:
    pts = sorted((p for p in doc["points"] if p["sweep"] == "budget"), key=lambda p: p["memory_budget"])
    fig, ax = plt.subplots(figsize=(7, 4.2))
    mib = [p["memory_budget"] / 2**20 for p in pts]
    ax.plot(mib, [p["measured"]["bubble_ratio"] for p in pts], "o-", color=COLORS["geopipe"],
            label="geopipe (measured)")
    if all(p["predicted_bubble"] is not None for p in pts):
        ax.plot(mib, [p["predicted_bubble"] for p in pts], "--", color=COLORS["geopipe"], alpha=0.7,
                label="geopipe (model)")
    focus = doc["spec"]["focus_km"]
    one = [p["measured"]["bubble_ratio"] for p in doc["points"] if p["schedule"] == "1f1b"
           and p["distance_km"] == focus and p["sweep"] in ("distance", "repeat")]
    if one:
        ax.axhline(statistics.mean(one), color=COLORS["1f1b"], ls=":", label="1f1b (measured)")
    for p, x in zip(pts, mib, strict=True):
        peak = p["measured"]["peak_inflight_activation_bytes"] / 2**20
        ax.annotate(f"peak {peak:.1f} MiB", (x, p["measured"]["bubble_ratio"]), textcoords="offset points",
                    xytext=(0, 8), ha="center", fontsize=7)
    ax.set_title(f"The HBM trade-off at {focus:g} km")
    return _finish(fig, ax, "memory budget: in-flight activation bytes per stage (MiB)", path)


def sweep_plot(doc: dict[str, Any], sweep: str, key: str, scale: float, xlabel: str, path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for schedule in ("1f1b", "geopipe"):
        pts = sorted((p for p in doc["points"] if p["sweep"] == sweep and p["schedule"] == schedule),
                     key=lambda p: p[key])
        xs = [p[key] * scale for p in pts]
        ax.plot(xs, [p["measured"]["bubble_ratio"] for p in pts], "o-", color=COLORS[schedule],
                label=f"{schedule} (measured)")
        ax.plot(xs, [p["predicted_bubble"] for p in pts], "--", color=COLORS[schedule], alpha=0.7,
                label=f"{schedule} (model)")
    return _finish(fig, ax, xlabel, path)


def _finish(fig: Any, ax: Any, xlabel: str, path: Path) -> Path:
    """Axes, grid and legend of a bubble-ratio plot; write the PNG and free the figure."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel("computation bubble ratio")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
