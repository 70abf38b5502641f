"""The experiment report: tables and plots as Markdown (report.md) and self-contained HTML (report.html,
plots inlined), plus the terminal summary. `testbed report RUN` re-renders all of it from summary.json."""

from __future__ import annotations

import base64
import html
import json
import statistics
from pathlib import Path
from typing import Any

from testbed import table, units

MODEL_DIVERGENCE = 0.20


def distance_rows(doc: dict[str, Any]) -> tuple[list[str], list[list[str]], list[str]]:
    """The main table (one row per distance) and the divergence notes."""
    schedules = doc["spec"]["schedules"]
    budget = doc["spec"]["memory_budget"]
    kms = sorted({p["distance_km"] for p in doc["points"] if p["sweep"] == "distance"})
    headers = ["distance km", "one-way ms", "RTT ms"]
    headers += [f"bubble {s} (model)" for s in schedules]
    headers += ["reduction geopipe vs 1f1b", "step s 1f1b / geopipe", "tokens/s 1f1b / geopipe",
                "peak in-flight 1f1b / geopipe"]
    rows, notes = [], []
    for km in kms:
        pts = {p["schedule"]: p for p in doc["points"] if p["distance_km"] == km and p["sweep"] == "distance"
               and p["memory_budget"] == budget}
        reps = {s: [p["measured"]["bubble_ratio"] for p in doc["points"] if p["distance_km"] == km
                    and p["schedule"] == s and p["sweep"] in ("distance", "repeat") and p["memory_budget"] == budget]
                for s in schedules}
        any_pt = next(iter(pts.values()))
        row = [f"{km:g}", f"{any_pt['delay_s'] * 1e3:.2f}", f"{any_pt['rtt_s'] * 1e3:.2f}"]
        for s in schedules:
            p = pts.get(s)
            if not p:
                row.append("-")
                continue
            mean = statistics.mean(reps[s])
            cell = f"{mean:.3f}"
            if len(reps[s]) > 1:
                cell += f" [{min(reps[s]):.3f}-{max(reps[s]):.3f}]"
            if p["predicted_bubble"] is not None:
                cell += f" ({p['predicted_bubble']:.3f})"
                if abs(p["predicted_bubble"] - mean) > MODEL_DIVERGENCE * mean:
                    cell += " !"
                    notes.append(divergence_note(km, s, mean, p["predicted_bubble"]))
            row.append(cell)
        one, geo = pts.get("1f1b"), pts.get("geopipe")
        if one and geo:
            red = 1 - statistics.mean(reps["geopipe"]) / statistics.mean(reps["1f1b"])
            row += [f"{red:.1%}", f"{one['measured']['step_time_s']:.3f} / {geo['measured']['step_time_s']:.3f}",
                    f"{one['measured']['tokens_per_s']:.0f} / {geo['measured']['tokens_per_s']:.0f}",
                    f"{units.format_size(one['measured']['peak_inflight_activation_bytes'])} / "
                    f"{units.format_size(geo['measured']['peak_inflight_activation_bytes'])}"]
        else:
            row += ["-"] * 4
        rows.append(row)
    return headers, rows, notes


REASONS = {
    "gpipe": "the per-message overhead is fitted on 1f1b's alternating traffic; gpipe sends its activations back "
             "to back and gloo overlaps those hand-shakes, which the model charges one by one",
    "geopipe": "the model runs on mean compute times; on 2 shared cores F/B spans vary by about +-50 %, and the "
               "resulting stalls (stage 0 waiting for a late gradient despite the slack) are not in a mean-time model",
    "1f1b": "compute spans stretch and jitter when workers and delay daemons share 2 cores; the model uses the mean "
            "per-micro-batch times measured at 0 km",
}


def divergence_note(km: float, schedule: str, measured: float, model: float) -> str:
    why = REASONS.get(schedule.removeprefix("torch-"), REASONS["1f1b"])
    return (f"{schedule} at {km:g} km: measured {measured:.3f}, model {model:.3f} "
            f"({(model - measured) / measured:+.0%}); why: {why}")


def budget_rows(doc: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    pts = sorted((p for p in doc["points"] if p["sweep"] == "budget"), key=lambda p: p["memory_budget"])
    rows = [[units.format_size(p["memory_budget"]), f"{p['measured']['bubble_ratio']:.3f}",
             "-" if p["predicted_bubble"] is None else f"{p['predicted_bubble']:.3f}",
             units.format_size(p["measured"]["peak_inflight_activation_bytes"]),
             str((p["geo_plan"] or {}).get("extra_inflight")), str((p["geo_plan"] or {}).get("bound"))] for p in pts]
    return ["memory budget", "bubble geopipe", "model", "peak in-flight", "extra in flight", "bound"], rows


def headline(doc: dict[str, Any]) -> list[str]:
    from testbed.experiment import focus_table

    f = focus_table(doc)
    lines = []
    if "reduction_mean" in f:
        one, geo = f["bubbles"]["1f1b"], f["bubbles"]["geopipe"]
        lines.append(f"At {f['distance_km']:g} km, over {f['repetitions']} repetitions: 1f1b bubble "
                     f"{statistics.mean(one):.3f} [{min(one):.3f}-{max(one):.3f}], geopipe {statistics.mean(geo):.3f} "
                     f"[{min(geo):.3f}-{max(geo):.3f}]: geopipe cuts the bubble ratio by {f['reduction_mean']:.1%} "
                     f"(spread {f['reduction_min']:.1%}-{f['reduction_max']:.1%}; GeoPipe paper: up to 78.91 %).")
    env = doc["environment"]
    backend = env.get("backend", "netns")
    if env.get("mininet"):
        backend += f" ({env['mininet']['switch']} switches, Mininet {env['mininet']['version']})"
    lines.append(f"Backend {backend}, shaper {env['shaper']}, transport {env['transport']}, kernel {env['kernel']}, "
                 f"{env['cpus']} CPUs, torch {env['versions'].get('torch', '?')}; experiment took {env['seconds']:.0f} s.")
    for m in doc.get("model_only", []):
        lines.append(f"Model only (not emulated): {m['schedule']} at {m['distance_km']:g} km -> bubble "
                     f"{m['bubble']:.3f}, step {m['step_s']:.3f} s.")
    return lines


def terminal_summary(exp_dir: Path) -> str:
    doc = json.loads((exp_dir / "summary.json").read_text())
    headers, rows, notes = distance_rows(doc)
    out = [table.render(headers, rows, "bubble ratio per schedule: measured mean [min-max] (model), ! = >20 % apart")]
    bh, br = budget_rows(doc)
    if br:
        out.append(table.render(bh, br, f"\nmemory budget at {doc['spec']['focus_km']:g} km"))
    out += ["", *headline(doc)]
    out += [f"model divergence: {n}" for n in notes]
    return "\n".join(out)


def _md_table(headers: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def write_report(exp_dir: Path) -> tuple[Path, Path]:
    doc = json.loads((exp_dir / "summary.json").read_text())
    headers, rows, notes = distance_rows(doc)
    bh, br = budget_rows(doc)
    images = sorted(p.name for p in exp_dir.glob("*.png"))
    parts = [f"# GeoPipe experiment {doc['id']}", "", *[f"- {line}" for line in headline(doc)], "",
             "## Bubble ratio vs distance", "", "Measured mean [min-max over repetitions] (model); `!` marks a "
             "model more than 20 % off the measurement.", "", _md_table(headers, rows), ""]
    if notes:
        parts += ["Where the model diverges, and why:", "", *[f"- {n}" for n in notes], ""]
    if br:
        parts += [f"## Memory budget at {doc['spec']['focus_km']:g} km", "", _md_table(bh, br), ""]
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
    from testbed import plots

    plots.render_all(exp_dir)
    write_report(exp_dir)
    return terminal_summary(exp_dir)
