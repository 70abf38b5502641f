"""The congestion experiment's report: one table of the variants side by side and a plot of step time, link
throughput, buffer occupancy and pause time against time (from congestion.json, testbed/experiment/congestion.py)."""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from testbed.experiment.html_page import html_page

KIB = 1024
COLORS = {"pfc": "tab:blue", "drop": "tab:red", "queue": "tab:green"}


@dataclass(frozen=True, slots=True)
class VariantRow:
    """One variant, summed up: what the table shows."""

    variant: str
    step_before_s: float | None
    step_after_s: float | None
    step_max_after_s: float | None
    throughput_before_bps: float | None
    throughput_after_bps: float | None
    drops: int
    lossy_drops: int
    pauses: int
    pause_s: float
    buffer_peak_bytes: int
    bound_bytes: int | None
    """XOFF + headroom (PFC: the peak must stay within), or the buffer (tail drop); None: unbounded."""
    queue_delay_max_s: float
    stage_retransmits: int
    stage_loss_probes: int
    stage_timeouts: int
    background_retransmits: int


def series(samples: list[dict[str, Any]], direction: str) -> list[dict[str, float]]:
    """Per interval between consecutive readings of `direction`: its mid time, throughput into the edge (bit/s),
    the buffer's peak in it (bytes) and the share of it the upstream port sat paused."""
    mine = [s for s in samples if s["direction"] == direction]
    out = []
    for a, b in zip(mine, mine[1:], strict=False):
        dt = b["t"] - a["t"]
        if dt <= 0:
            continue
        out.append({"t": (a["t"] + b["t"]) / 2, "bps": (b["bytes_in"] - a["bytes_in"]) * 8 / dt,
                    "buffer": b.get("buffer_interval_peak_bytes", b.get("buffer_now_bytes", 0)),
                    "paused": min(1.0, max(0.0, (b["pause_s"] - a["pause_s"]) / dt))})
    return out


def _mean_between(points: list[dict[str, float]], lo: float, hi: float) -> float | None:
    values = [p["bps"] for p in points if lo <= p["t"] < hi]
    return statistics.fmean(values) if values else None


def summarize(variant: dict[str, Any], cut_iteration: int) -> VariantRow:
    """The variant's row: step times before and after the cut, the first direction's throughput and edge, and the
    hosts' TCP counters (the pipeline's hosts apart from the background's)."""
    steps = variant["steps"]
    before = [s["step_s"] for s in steps if s["iteration"] < cut_iteration]
    after = [s["step_s"] for s in steps if s["iteration"] >= cut_iteration]
    link = variant["links"][0]
    edge = link.get("edge") or {}
    direction = f"{link['src_dc']} -> {link['dst_dc']}"
    points = series(variant["samples"], direction)
    cut = variant.get("cut_s")
    end = steps[-1]["end_s"] if steps else 0.0
    background_hosts = {b["load"].split(" -> ")[0] for b in variant["background"]} | \
        {b["load"].split(" -> ")[1] for b in variant["background"]}
    stage_tcp = [v for host, v in variant["tcp"].items() if host not in background_hosts and v]
    bound = (edge.get("xoff_bytes", 0) + edge.get("headroom_bytes", 0) if edge.get("mode") == "pfc"
             else edge.get("buffer_bytes") or None)
    return VariantRow(
        variant=variant["variant"], step_before_s=statistics.median(before) if before else None,
        step_after_s=statistics.median(after) if after else None, step_max_after_s=max(after) if after else None,
        throughput_before_bps=_mean_between(points, 0.0, cut) if cut is not None else None,
        throughput_after_bps=_mean_between(points, cut + 1.0, end) if cut is not None else None,
        drops=sum(link_drops(lk) for lk in variant["links"]),
        lossy_drops=sum((lk.get("edge") or {}).get("lossy_drops", 0) for lk in variant["links"]),
        pauses=sum((lk.get("edge") or {}).get("pauses", 0) for lk in variant["links"]),
        pause_s=sum((lk.get("edge") or {}).get("pause_s", 0.0) for lk in variant["links"]),
        buffer_peak_bytes=edge.get("buffer_peak_bytes", 0), bound_bytes=bound,
        queue_delay_max_s=max((lk.get("edge") or {}).get("queue_delay_max_s", 0.0) for lk in variant["links"]),
        stage_retransmits=sum(t["retransmits"] for t in stage_tcp),
        stage_loss_probes=sum(t["loss_probes"] for t in stage_tcp),
        stage_timeouts=sum(t["timeouts"] for t in stage_tcp),
        background_retransmits=sum(b["retransmits"] for b in variant["background"]))


def link_drops(link: dict[str, Any]) -> int:
    """Every packet one direction lost during the run: its edge's lossless drops, and the rest of what the shaper
    counted (which already holds a PFC edge's drops, the unintended kind, but not a finite buffer's)."""
    edge = link.get("edge") or {}
    at_edge = edge.get("drops", 0)
    counted = link.get("drops_during_run") or 0
    return at_edge + max(0, counted - (at_edge if edge.get("mode") == "pfc" else 0))


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1e3:.0f} ms"


def _mbit(value: float | None) -> str:
    return "-" if value is None else f"{value / 1e6:.1f}"


def table(rows: list[VariantRow]) -> list[str]:
    """The variants side by side, as Markdown lines."""
    lines = ["| edge | step before cut | step after (median / max) | link in, Mbit/s (before / after) | drops "
             "(lossless / lossy) | pauses (time) | buffer peak / bound | longest wait in buffer | pipeline TCP "
             "retransmits (probes, timeouts) | background TCP retransmits |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        bound = f"{r.bound_bytes / KIB:.0f} KiB" if r.bound_bytes else "unbounded"
        lines.append(
            f"| {r.variant} | {_ms(r.step_before_s)} | {_ms(r.step_after_s)} / {_ms(r.step_max_after_s)} | "
            f"{_mbit(r.throughput_before_bps)} / {_mbit(r.throughput_after_bps)} | {r.drops} / {r.lossy_drops} | "
            f"{r.pauses} ({r.pause_s:.2f} s) | {r.buffer_peak_bytes / KIB:.0f} KiB / {bound} | "
            f"{_ms(r.queue_delay_max_s)} | {r.stage_retransmits} ({r.stage_loss_probes}, {r.stage_timeouts}) | "
            f"{r.background_retransmits} |")
    return lines


def plot(record: dict[str, Any], path: Path) -> Path:
    """Step time, link throughput, buffer occupancy and pause share against time, one colour per variant."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(4, 1, figsize=(9, 10), sharex=True)
    for variant in record["variants"]:
        color = COLORS.get(variant["variant"])
        link = variant["links"][0]
        points = series(variant["samples"], f"{link['src_dc']} -> {link['dst_dc']}")
        for s in variant["steps"]:
            axes[0].plot([s["start_s"], s["end_s"]], [s["step_s"]] * 2, color=color, lw=3)
        axes[0].plot([], [], color=color, lw=3, label=variant["variant"])
        axes[1].plot([p["t"] for p in points], [p["bps"] / 1e6 for p in points], color=color)
        axes[2].plot([p["t"] for p in points], [p["buffer"] / KIB for p in points], color=color)
        axes[3].plot([p["t"] for p in points], [p["paused"] * 100 for p in points], color=color)
        if variant.get("cut_s") is not None:
            for ax in axes:
                ax.axvline(variant["cut_s"], color=color, ls="--", lw=0.8)
    labels = ["step time (s)", f"{_first_direction(record)}\ninto the edge (Mbit/s)", "edge buffer peak\n(KiB per 0.5 s)",
              "upstream port\npaused (%)"]
    for ax, label in zip(axes, labels, strict=True):
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[0].legend(loc="upper left")
    axes[-1].set_xlabel("seconds from the first iteration (dashed: the spine port cut to half)")
    fig.suptitle("Congestion on the OTN edge: PFC, tail drop and a deep queue")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _first_direction(record: dict[str, Any]) -> str:
    link = record["variants"][0]["links"][0] if record["variants"] else {"src_dc": "?", "dst_dc": "?"}
    return f"{link['src_dc']} -> {link['dst_dc']}"


def write_report(out: Path) -> Path:
    """report.md (and congestion.png) in the experiment's folder, from its congestion.json."""
    record = json.loads((out / "congestion.json").read_text())
    spec = record["spec"]
    rows = [summarize(v, spec["cut_iteration"]) for v in record["variants"]]
    image = plot(record, out / "congestion.png")
    fb = next((v["fb_per_microbatch_s"] for v in record["variants"] if v.get("fb_per_microbatch_s")), None)
    lines = [f"# Congestion on the OTN edge ({Path(record['topology']).name})", "",
             f"{spec['schedule']}, {spec['microbatches']} micro-batches, {spec['iterations']} timed iterations, "
             f"compute as time from `{spec['compute']}` (F+B per micro-batch per stage: {_ms(fb)}); the edges' "
             f"DC-side port cut to {spec['cut'] * 100:g} % at the start of iteration {spec['cut_iteration']}. "
             "Buffer and throughput are the first direction's; drops and pauses count both.", "",
             *table(rows), "", f"![step time, throughput, buffer and pause against time]({image.name})", "",
             "pfc: a finite buffer whose XOFF pauses the upstream port (every flow behind it waits: head-of-line "
             "blocking). drop: the same buffer without pause. queue: a deep queue that holds everything. TCP's "
             "retransmits count tail-loss probes too (sent when a flight's ACK is two round trips late, lost or not); "
             "timeouts are retransmission timeouts."]
    path = out / "report.md"
    path.write_text("\n".join(lines) + "\n")
    (out / "report.html").write_text(html_page(lines, out, "Congestion on the OTN edge"))
    return path
