"""The experiment report: tables and plots as Markdown (report.md) and self-contained HTML (report.html,
plots inlined), plus the terminal summary. `testbed report RUN` re-renders all of it from summary.json."""

from __future__ import annotations

import base64
import html
import statistics
from pathlib import Path

from testbed.experiment import plots
from testbed.experiment.records import ExperimentRecord
from testbed.util import table, units

MODEL_DIVERGENCE = 0.20


def distance_rows(record: ExperimentRecord) -> tuple[list[str], list[list[str]], list[str]]:
    """The main table (one row per distance) and the divergence notes."""
    schedules = record.spec.schedules
    kms = sorted({p.distance_km for p in record.sweep("distance")})
    headers = ["distance km", "one-way ms", "RTT ms"]
    headers += [f"bubble {s} (model)" for s in schedules]
    headers += ["reduction geopipe vs 1f1b", "step s 1f1b / geopipe", "tokens/s 1f1b / geopipe",
                "peak in-flight 1f1b / geopipe"]
    cpus = int(record.environment.get("cpus") or 0)
    rows, notes = [], []
    for km in kms:
        at_km = record.headline_points(km=km)
        pts = {p.schedule: p for p in at_km if p.sweep == "distance"}
        reps = {s: [p.bubble for p in at_km if p.schedule == s and p.bubble is not None] for s in schedules}
        any_pt = next(iter(pts.values()))
        row = [f"{km:g}", f"{any_pt.delay_s * 1e3:.2f}", f"{(any_pt.rtt_s or 0.0) * 1e3:.2f}"]
        for s in schedules:
            p = pts.get(s)
            if not p or not reps[s]:
                row.append("-")
                continue
            mean = statistics.mean(reps[s])
            cell = f"{mean:.3f}"
            if len(reps[s]) > 1:
                cell += f" [{min(reps[s]):.3f}-{max(reps[s]):.3f}]"
            if p.predicted_bubble is not None:
                cell += f" ({p.predicted_bubble:.3f})"
                if abs(p.predicted_bubble - mean) > MODEL_DIVERGENCE * mean:
                    cell += " !"
                    notes.append(divergence_note(km, s, mean, p.predicted_bubble, cpus))
            row.append(cell)
        one, geo = pts.get("1f1b"), pts.get("geopipe")
        if one and geo and reps["1f1b"] and reps["geopipe"]:
            red = 1 - statistics.mean(reps["geopipe"]) / statistics.mean(reps["1f1b"])
            m1, mg = one.measured, geo.measured
            row += [f"{red:.1%}", f"{m1.step_time_s:.3f} / {mg.step_time_s:.3f}",
                    f"{m1.tokens_per_s:.0f} / {mg.tokens_per_s:.0f}",
                    f"{units.format_size(m1.peak_inflight_activation_bytes)} / "
                    f"{units.format_size(mg.peak_inflight_activation_bytes)}"]
        else:
            row += ["-"] * 4
        rows.append(row)
    return headers, rows, notes


def _reason(schedule: str, cpus: int) -> str:
    """Why the mean-time model misses a schedule's measurement."""
    cores = f"{cpus} shared cores" if cpus else "shared cores"
    reasons = {
        "gpipe": "the per-message overhead is fitted on 1f1b's alternating traffic; gpipe sends its activations "
                 "back to back and gloo overlaps those hand-shakes, which the model charges one by one",
        "geopipe": f"the model runs on mean compute times; on {cores} F/B spans vary widely, and the resulting "
                   "stalls (stage 0 waiting for a late gradient despite the slack) are not in a mean-time model",
        "1f1b": f"compute spans stretch and jitter when workers and delay daemons share {cores}; the model uses "
                "the mean per-micro-batch times measured at 0 km",
    }
    return reasons.get(schedule.removeprefix("torch-"), reasons["1f1b"])


def divergence_note(km: float, schedule: str, measured: float, model: float, cpus: int = 0) -> str:
    return (f"{schedule} at {km:g} km: measured {measured:.3f}, model {model:.3f} "
            f"({(model - measured) / measured:+.0%}); why: {_reason(schedule, cpus)}")


def budget_rows(record: ExperimentRecord) -> tuple[list[str], list[list[str]]]:
    pts = sorted(record.sweep("budget"), key=lambda p: p.memory_budget or 0)
    rows = [[units.format_size(p.memory_budget), f"{p.bubble:.3f}" if p.bubble is not None else "-",
             "-" if p.predicted_bubble is None else f"{p.predicted_bubble:.3f}",
             units.format_size(p.measured.peak_inflight_activation_bytes),
             ", ".join(map(str, p.sizing.extra_inflight)) if p.sizing else "-",
             ", ".join(p.sizing.bound) if p.sizing else "-"]
            for p in pts]
    return ["memory budget", "bubble geopipe", "model", "peak in-flight", "extra in flight", "bound"], rows


def headline(record: ExperimentRecord) -> list[str]:
    f = record.focus_table()
    lines = []
    if record.partial:
        lines.append(f"PARTIAL: stopped ({record.stopped or 'unknown'}) with {len(record.points)} of "
                     f"{len(record.points) + len(record.missing)} runs measured; missing: {', '.join(record.missing)}. "
                     f"Complete it with: testbed experiment --resume <this folder>.")
    elif record.resumed:
        lines.append(f"Completed after {record.resumed} resume(s) of a stopped run.")
    if "reduction_mean" in f:
        one, geo = f["bubbles"]["1f1b"], f["bubbles"]["geopipe"]
        lines.append(f"At {f['distance_km']:g} km, over {f['repetitions']} repetitions: 1f1b bubble "
                     f"{statistics.mean(one):.3f} [{min(one):.3f}-{max(one):.3f}], geopipe {statistics.mean(geo):.3f} "
                     f"[{min(geo):.3f}-{max(geo):.3f}]: geopipe cuts the bubble ratio by {f['reduction_mean']:.1%} "
                     f"(spread {f['reduction_min']:.1%}-{f['reduction_max']:.1%}; GeoPipe paper: up to 78.91 %).")
    lossy = [p for p in record.points if not p.lossless_ok]
    if lossy:
        lines.append(f"NOT LOSSLESS: {len(lossy)} run(s) lost packets on a lossless link ("
                     + ", ".join(f"{p.label}: {p.lost_packets} packets, {p.daemon_restarts} daemon restart(s)"
                                 for p in lossy) + "); their figures include TCP's recovery.")
    env = record.environment
    backend = env.get("backend", "netns")
    if env.get("mininet"):
        backend += f" ({env['mininet']['switch']} switches, Mininet {env['mininet']['version']})"
    lines.append(f"Backend {backend}, shaper {env['shaper']}, transport {env['transport']}, kernel {env['kernel']}, "
                 f"{env['cpus']} CPUs, torch {env['versions'].get('torch', '?')}; experiment took {env['seconds']:.0f} s.")
    for m in record.model_only:
        lines.append(f"Model only (not emulated): {m.schedule} at {m.distance_km:g} km -> bubble "
                     f"{m.bubble:.3f}, step {m.step_s:.3f} s.")
    return lines


def terminal_summary(exp_dir: Path) -> str:
    record = ExperimentRecord.load(exp_dir)
    headers, rows, notes = distance_rows(record)
    out = [table.render(headers, rows, "bubble ratio per schedule: measured mean [min-max] (model), ! = >20 % apart")]
    bh, br = budget_rows(record)
    if br:
        out.append(table.render(bh, br, f"\nmemory budget at {record.spec.focus_km:g} km"))
    out += ["", *headline(record)]
    out += [f"model divergence: {n}" for n in notes]
    return "\n".join(out)


def _md_table(headers: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def write_report(exp_dir: Path) -> tuple[Path, Path]:
    record = ExperimentRecord.load(exp_dir)
    headers, rows, notes = distance_rows(record)
    bh, br = budget_rows(record)
    images = sorted(p.name for p in exp_dir.glob("*.png"))
    parts = [f"# GeoPipe experiment {record.id}", "", *[f"- {line}" for line in headline(record)], "",
             "## Bubble ratio vs distance", "", "Measured mean [min-max over repetitions] (model); `!` marks a "
             "model more than 20 % off the measurement.", "", _md_table(headers, rows), ""]
    if notes:
        parts += ["Where the model diverges, and why:", "", *[f"- {n}" for n in notes], ""]
    if br:
        parts += [f"## Memory budget at {record.spec.focus_km:g} km", "", _md_table(bh, br), ""]
    parts += ["## Plots", "", *[f"![{name}]({name})" for name in images], "",
              "Files: `summary.json` (everything), `points.csv`, `topology.yaml`, `plan.json`, `environment.json`, "
              "`model_inputs.json`, `runs/*/summary.json` and `runs/*/trace.json` (chrome://tracing, Perfetto)."]
    md = exp_dir / "report.md"
    md.write_text("\n".join(parts) + "\n")
    body = []
    for line in parts:
        if line.startswith("!["):
            name = line[line.index("(") + 1:-1]
            data = base64.b64encode((exp_dir / name).read_bytes()).decode()
            body.append(f'<p><img alt="{html.escape(name)}" src="data:image/png;base64,{data}"></p>')
        elif line.startswith("# "):
            body.append(f"<h1>{html.escape(line[2:])}</h1>")
        elif line.startswith("## "):
            body.append(f"<h2>{html.escape(line[3:])}</h2>")
        elif line.startswith("- "):
            body.append(f"<li>{html.escape(line[2:])}</li>")
        elif line.startswith("|"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            if set("".join(cells)) <= {"-"}:
                continue
            body.append("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + "</tr>")
        elif line:
            body.append(f"<p>{html.escape(line)}</p>")
    page = ("<!doctype html><meta charset='utf-8'><title>GeoPipe experiment</title><style>body{font-family:sans-serif;"
            "max-width:1100px;margin:2em auto}td{border:1px solid #ccc;padding:3px 6px;font-size:13px}"
            "table{border-collapse:collapse}img{max-width:100%}</style>" + _wrap_tables(body))
    page_path = exp_dir / "report.html"
    page_path.write_text(page)
    return md, page_path


def _wrap_tables(body: list[str]) -> str:
    out, inside = [], False
    for item in body:
        if item.startswith("<tr>") and not inside:
            out.append("<table>")
            inside = True
        elif not item.startswith("<tr>") and inside:
            out.append("</table>")
            inside = False
        out.append(item)
    if inside:
        out.append("</table>")
    return "\n".join(out)


def rerender(exp_dir: Path) -> str:
    """Plots, report.md, report.html again from summary.json; returns the terminal summary."""
    plots.render_all(exp_dir)
    write_report(exp_dir)
    return terminal_summary(exp_dir)
