"""The experiment report: tables and plots as Markdown (report.md) and self-contained HTML (report.html,
plots inlined), plus the terminal summary. `testbed report RUN` re-renders all of it from summary.json."""

from __future__ import annotations

import statistics
from pathlib import Path

from testbed.experiment import plots
from testbed.experiment.html_page import html_page
from testbed.experiment.records import ExperimentRecord, Point
from testbed.run.breakdown import side_by_side
from testbed.run.lateness import LATE_FLOOR_S, LATE_P99_FRACTION
from testbed.run.summary import STRETCH_FLAG
from testbed.util import table, units
from testbed.util.hostload import COMPUTE_SLOWDOWN_FLAG, FOREIGN_BOUND, HOST_DRIFT_BOUND, STEAL_BOUND

MODEL_DIVERGENCE = 0.20
PAPER_CUT = 0.7891
"""The GeoPipe paper's largest bubble cut against 1F1B (arXiv 2510.12064)."""
BLIND_MARGIN = 0.03
"""A point tests the links only where the network-blind model misses it by more than this (the model's own
agreement bound, docs/compute.md)."""


def _median_of(points: list[Point], schedule: str, value: str = "bubble") -> float | None:
    values = [getattr(p, value) if value == "bubble" else p.measured.step_time_s for p in points
              if p.schedule == schedule and p.bubble is not None]
    return statistics.median(values) if values else None


def _cut(geo: float | None, base: float | None) -> float | None:
    return None if geo is None or not base or base <= 0 else 1 - geo / base


def _fmt_cut(cut: float | None) -> str:
    return "-" if cut is None else f"{cut:.1%}"


def cut_rows(record: ExperimentRecord) -> tuple[list[str], list[list[str]]]:
    """Per distance: geopipe's bubble cut against 1f1b and against the strong baseline (1f1b-prefetch), from
    the medians over repetitions, and how far the model's step was from each schedule's measured step."""
    headers = ["distance km", "cut vs 1f1b", "cut vs 1f1b-prefetch",
               "model step error per schedule (network-blind model's)"]
    rows = []
    for km in sorted({p.distance_km for p in record.sweep("distance")}):
        pts = record.headline_points(km=km)
        geo = _median_of(pts, "geopipe")
        errors = [f"{s} {_median_error(pts, s, 'predicted_step_from_0km_s')}"
                  f" ({_median_error(pts, s, 'predicted_step_blind_s')})" for s in record.spec.schedules
                  if any(p.schedule == s and p.predicted_step_from_0km_s for p in pts)]
        rows.append([f"{km:g}", _fmt_cut(_cut(geo, _median_of(pts, "1f1b"))),
                     _fmt_cut(_cut(geo, _median_of(pts, "1f1b-prefetch"))), ", ".join(errors) or "-"])
    return headers, rows


def _median_error(points: list[Point], schedule: str, field: str) -> str:
    """The median over `schedule`'s points of the prediction in `field` against the measured step."""
    errors = [getattr(p, field) / p.measured.step_time_s - 1 for p in points
              if p.schedule == schedule and getattr(p, field) and p.measured.step_time_s]
    return f"{statistics.median(errors):+.1%}" if errors else "-"


def paper_line(record: ExperimentRecord) -> str | None:
    """Where (distance, memory budget) geopipe's cut against 1f1b reaches the paper's 78.91 %, or the largest it
    reached and where."""
    best: tuple[float, float, str] | None = None
    groups: dict[tuple[float, str], list[Point]] = {}
    for p in record.points:
        if p.sweep in ("distance", "repeat", "budget"):
            groups.setdefault((p.distance_km, p.memory_budget or record.spec.memory_budget or "none"), []).append(p)
    for (km, budget), pts in groups.items():
        base = [p for p in record.headline_points(km=km) if p.schedule == "1f1b"]
        cut = _cut(_median_of(pts, "geopipe"), _median_of(base, "1f1b"))
        if cut is not None and (best is None or cut > best[0]):
            best = (cut, km, budget)
    if best is None:
        return None
    cut, km, budget = best
    reached = cut >= PAPER_CUT
    return (f"The GeoPipe paper reports a bubble cut of up to {PAPER_CUT:.2%} against 1F1B; here geopipe's largest cut "
            f"against 1f1b is {cut:.1%} at {km:g} km under the budget {budget}"
            + (" (reached)." if reached else " (not reached at any distance and budget of this experiment).")
            + " The fill and drain of the pipeline, (p-1)/(m+p-1) of the step for every schedule, is a bubble no "
              "schedule of this family removes.")


def compute_line(record: ExperimentRecord) -> str:
    """Where the compute came from, with the F+B per micro-batch that every timing here rests on."""
    env = record.environment
    fb = env.get("fb_per_microbatch_s")
    where = ("real compute (the model's arithmetic on this host)" if record.spec.compute == "real"
             else f"compute as time ({record.spec.compute}; no arithmetic ran, the network and schedules are real)")
    return (f"Compute: {where}" + (f"; F+B {fb * 1e3:.1f} ms per micro-batch per stage (median stage)" if fb else "")
            + f"; host {env.get('hostname', '?')} with {env.get('cpus', '?')} cores.")


def focus_rows(record: ExperimentRecord) -> tuple[list[str], list[list[str]]]:
    """The headline table: every schedule at the focus distance and the headline budget, medians over the
    repetitions with [min-max], and geopipe's speed-up and memory against it."""
    f = record.focus_table()
    headers = ["schedule", "bubble vs ref", "bubble own spans", "step s", "geopipe speed-up", "tokens/s",
               "peak in-flight", "geopipe memory x", "stretch", "runs (repeated)"]
    rows = []
    for schedule in record.spec.headline_schedules:
        m = f["medians"].get(schedule)
        if not m:
            continue
        against = f.get("against", {}).get(schedule, {})
        rows.append([
            schedule, f"{m['bubble']:.3f} [{m['bubble_range'][0]:.3f}-{m['bubble_range'][1]:.3f}]",
            "-" if m["bubble_own"] is None else f"{m['bubble_own']:.3f}",
            f"{m['step_s']:.3f} [{m['step_range'][0]:.3f}-{m['step_range'][1]:.3f}]",
            f"{against['speedup']:.2f}x" if against else "-", f"{m['tokens_per_s']:.0f}",
            units.format_size(m["peak_bytes"]) if m["peak_bytes"] else "not measured",
            f"{against['memory_multiple']:.2f}x" if against.get("memory_multiple") else "-",
            "-" if m["stretch"] is None else f"{m['stretch']:.2f}" + (" !" if m["stretch"] > STRETCH_FLAG else ""),
            f"{m['runs']} ({m['repeated']})" + (f", {m['disturbed']} disturbed" if m["disturbed"] else "")
            + (f", {m['late']} late" if m.get("late") else "")])
    return headers, rows


def distance_rows(record: ExperimentRecord) -> tuple[list[str], list[list[str]], list[str]]:
    """One row per distance: each schedule's bubble vs reference (median over repetitions) and model, step
    times, and the divergence notes."""
    schedules = record.spec.schedules
    kms = sorted({p.distance_km for p in record.sweep("distance")})
    headers = ["distance km", "one-way ms", "RTT ms"]
    headers += [f"bubble {s} (model)" for s in schedules]
    headers += [f"step s {' / '.join(schedules)}"]
    cpus = int(record.environment.get("cpus") or 0)
    rows, notes = [], []
    for km in kms:
        at_km = record.headline_points(km=km)
        any_pt = next(p for p in at_km if p.sweep == "distance")
        row = [f"{km:g}", f"{any_pt.delay_s * 1e3:.2f}", f"{(any_pt.rtt_s or 0.0) * 1e3:.2f}"]
        steps = []
        for s in schedules:
            pts = [p for p in at_km if p.schedule == s and p.bubble is not None]
            if not pts:
                row.append("-")
                steps.append("-")
                continue
            values = [p.bubble for p in pts if p.bubble is not None]
            med = statistics.median(values)
            cell = f"{med:.3f}" + (f" [{min(values):.3f}-{max(values):.3f}]" if len(values) > 1 else "")
            model = next((p.predicted_bubble for p in pts if p.predicted_bubble is not None), None)
            if model is not None:
                cell += f" ({model:.3f})"
                if abs(model - med) > MODEL_DIVERGENCE * med:
                    cell += " !"
                    notes.append(divergence_note(km, s, med, model, cpus))
            row.append(cell)
            steps.append(f"{statistics.median(p.measured.step_time_s for p in pts):.3f}")
        rows.append([*row, " / ".join(steps)])
    return headers, rows, notes


def _reason(schedule: str, cpus: int, model_above: bool) -> str:
    """Why the model (fed by the 0 km 1f1b run, fitted to nothing) misses a schedule's measurement."""
    cores = f"{cpus} shared cores" if cpus else "shared cores"
    if model_above:
        return (f"this run computed faster than the 0 km 1f1b run the model draws its compute from (the host's speed "
                f"on {cores} drifts by 10-30 % over minutes; the run's breakdown shows its compute against its own "
                "reference)")
    return (f"the testbed's own cost grew beyond what the 0 km run had: the delay daemons and gloo's I/O threads "
            f"preempt the compute on {cores} (the run's breakdown: 'compute preempted', 'waiting beyond the ideal "
            "pipeline')")


def divergence_note(km: float, schedule: str, measured: float, model: float, cpus: int = 0) -> str:
    return (f"{schedule} at {km:g} km: measured {measured:.3f}, model {model:.3f} "
            f"({(model - measured) / measured:+.0%}); why: {_reason(schedule, cpus, model > measured)}")


def budget_rows(record: ExperimentRecord) -> tuple[list[str], list[list[str]]]:
    """geopipe at each budget of the sweep: what it was allowed, wanted, held, and the bubble it reached."""
    one = record.focus_table()["medians"].get("1f1b")
    rows = []
    for p in record.budget_points():
        m, sizing = p.measured, p.sizing
        allowed = max(m.budget_bytes_per_stage) if m.budget_bytes_per_stage else None
        peak = m.peak_inflight_activation_bytes
        rows.append([p.memory_budget or "none", units.format_size(allowed) if allowed else "-",
                     f"{p.bubble:.3f}" if p.bubble is not None else "-",
                     "-" if p.predicted_bubble is None else f"{p.predicted_bubble:.3f}", f"{m.step_time_s:.3f}",
                     units.format_size(peak) if peak else "-",
                     f"{peak / one['peak_bytes']:.2f}x" if peak and one and one["peak_bytes"] else "-",
                     ", ".join(map(str, sizing.extra_inflight)) if sizing else "-",
                     ", ".join(map(str, sizing.wanted_extra)) if sizing else "-",
                     ", ".join(sizing.bound) if sizing else "-"])
    return ["budget", "bytes (stage 0)", "bubble vs ref", "model", "step s", "peak in-flight", "x 1f1b",
            "extra in flight", "wanted", "bound"], rows


def breakdown_rows(record: ExperimentRecord) -> tuple[list[str], list[list[str]]]:
    """Where the step went at 0 km and at the focus distance, per schedule of the sweep: the ideal pipeline and
    the testbed's own cost part by part (testbed/run/breakdown.py), medians over the runs."""
    columns = []
    for km in sorted({0.0, record.spec.focus_km} & {p.distance_km for p in record.sweep("distance")}):
        for schedule in record.spec.schedules:
            splits = [p.measured.breakdown for p in record.headline_points(schedule, km) if p.measured.breakdown]
            if splits:
                columns.append((f"{schedule} @{km:g} km", splits))
    return side_by_side(columns) if columns else ([], [])


def repro_rows(record: ExperimentRecord) -> tuple[list[str], list[list[str]], str]:
    """The focus distance, repetition by repetition (each one launch running every schedule interleaved):
    geopipe's step-time speed-up over each baseline of the same run, its plan, and the spread."""
    by_rep: dict[int, dict[str, Point]] = {}
    for p in record.headline_points(km=record.spec.focus_km):
        by_rep.setdefault(p.repetition, {})[p.schedule] = p
    bases = [s for s in record.spec.headline_schedules if s != "geopipe"]
    rows, speedups = [], {b: [] for b in bases}
    for rep, points in sorted(by_rep.items()):
        geo = points.get("geopipe")
        if geo is None:
            continue
        row = [str(rep + 1)]
        for b in bases:
            base = points.get(b)
            value = base.measured.step_time_s / geo.measured.step_time_s if base else None
            if value is not None:
                speedups[b].append(value)
            row.append("-" if value is None else f"{value:.3f}x")
        row.append("/".join(map(str, geo.sizing.extra_inflight)) if geo.sizing else "-")
        rows.append(row)
    spread = []
    for b, values in speedups.items():
        if len(values) > 1:
            med = statistics.median(values)
            spread.append(f"over {b} {med:.3f}x, each repetition within {max(abs(v / med - 1) for v in values):.1%} "
                          "of the median")
    return ["repetition", *(f"speed-up over {b}" for b in bases), "geopipe plan"], rows, "; ".join(spread)


def least_hiding_budget(record: ExperimentRecord) -> str | None:
    """The smallest budget of the sweep under which the plan hid every link (no stage bound by memory)."""
    for p in record.budget_points():
        if p.sizing and "memory budget" not in p.sizing.bound:
            return p.memory_budget
    return None


def rate_rows(record: ExperimentRecord) -> tuple[list[str], list[list[str]]]:
    """The rate sweep (bandwidth-bound by default): where one transfer outlasts a micro-batch's compute,
    overlap stops paying; the model beside each figure."""
    rows = []
    act = record.model_inputs.activation_bytes if record.model_inputs else None
    compute = (statistics.mean(f + b for f, b in zip(record.model_inputs.forward_s, record.model_inputs.backward_s,
                                                      strict=True)) if record.model_inputs else None)
    for rate in sorted({p.rate_bps for p in record.sweep("rate")}):
        pts = {p.schedule: p for p in record.sweep("rate") if p.rate_bps == rate}
        transfer = act * 8 / rate if act else None
        cells = [f"{rate / 1e6:g}", "-" if transfer is None else f"{transfer * 1e3:.1f}",
                 "-" if compute is None else f"{compute * 1e3:.1f}"]
        for s in ("1f1b-prefetch", "geopipe"):
            p = pts.get(s)
            cells.append("-" if p is None or p.bubble is None else
                         f"{p.bubble:.3f}" + (f" ({p.predicted_bubble:.3f})" if p.predicted_bubble is not None else ""))
            cells.append("-" if p is None else f"{p.measured.step_time_s:.3f}"
                         + (f" ({p.predicted_step_s:.3f})" if p.predicted_step_s is not None else ""))
        rows.append(cells)
    return ["rate Mbit/s", "one transfer ms", "F+B per micro-batch ms", "bubble 1f1b-prefetch (model)",
            "step s 1f1b-prefetch (model)", "bubble geopipe (model)", "step s geopipe (model)"], rows


def transport_rows(record: ExperimentRecord) -> tuple[list[str], list[list[str]]]:
    """The transport sweep: each of our schedules over gloo's TCP and over RDMA on the same link, the model told
    which transport ran (receiver-driven TCP pays a round trip per just-in-time receive, RDMA does not)."""
    rows = []
    for p in record.sweep("transport"):
        m = p.measured
        rows.append([p.schedule, p.transport, "-" if p.bubble is None else f"{p.bubble:.3f}",
                     "-" if p.predicted_bubble is None else f"{p.predicted_bubble:.3f}", f"{m.step_time_s:.3f}",
                     "-" if p.predicted_step_s is None else f"{p.predicted_step_s:.3f}", f"{m.tokens_per_s:.0f}"])
    return ["schedule", "transport", "bubble vs ref", "model bubble", "step s", "model step s", "tokens/s"], rows


def headline(record: ExperimentRecord) -> list[str]:
    f = record.focus_table()
    lines = []
    if record.partial:
        lines.append(f"PARTIAL: stopped ({record.stopped or 'unknown'}) with {len(record.points)} of "
                     f"{len(record.points) + len(record.missing)} runs measured; missing: {', '.join(record.missing)}. "
                     f"Complete it with: testbed experiment --resume <this folder>.")
    elif record.resumed:
        lines.append(f"Completed after {record.resumed} resume(s) of a stopped run.")
    med, against = f["medians"], f.get("against", {})
    geo = med.get("geopipe")
    budget = record.spec.memory_budget or "none"
    if geo:
        sizing = next((p.sizing for p in record.headline_points("geopipe", f["distance_km"]) if p.sizing), None)
        binds = sizing is not None and "memory budget" in sizing.bound
        lines.append(
            f"At {f['distance_km']:g} km under the memory budget {budget} ("
            + ("it binds: geopipe wanted " + "/".join(map(str, sizing.wanted_extra)) + " extra micro-batches per stage, "
               "held " + "/".join(map(str, sizing.extra_inflight)) if binds and sizing else "it did not bind")
            + f"), medians over {f['repetitions']} interleaved repetitions; bubble = 1 - uncontended compute / "
              "step time:")
        for base, vs in against.items():
            b = med[base]
            cut = "-" if vs["bubble_cut"] is None else f"{vs['bubble_cut']:.1%}"
            lines.append(f"geopipe vs {base}: bubble {b['bubble']:.3f} -> {geo['bubble']:.3f} (cut {cut}), "
                         f"step {b['step_s']:.3f} -> {geo['step_s']:.3f} s (speed-up {vs['speedup']:.2f}x)"
                         + (f", memory {vs['memory_multiple']:.2f}x" if vs["memory_multiple"] else ""))
    if "early_posting_share" in f:
        one, pre = med["1f1b"], med["1f1b-prefetch"]
        lines.append(f"Of geopipe's cut against 1f1b ({one['bubble']:.3f} -> {geo['bubble']:.3f}), posting receives "
                     f"early accounts for {f['early_posting_share']:.0%} (1f1b-prefetch: {pre['bubble']:.3f}) and "
                     f"overlap under the budget for {f['overlap_share']:.0%}. The GeoPipe paper reports up to 78.91 % "
                     f"against 1F1B; here the fair figure, against 1f1b-prefetch, is "
                     f"{against['1f1b-prefetch']['bubble_cut']:.1%}.")
    least = least_hiding_budget(record)
    if record.budget_points():
        lines.append(f"Least budget of the sweep under which the plan hid the link: {least or 'none of them'}.")
    stretched = [s for s, m in med.items() if m["stretch"] and m["stretch"] > STRETCH_FLAG]
    if stretched:
        lines.append(f"Own F/B spans stretched more than {STRETCH_FLAG:.2f}x over the uncontended reference for "
                     f"{', '.join(stretched)}: their own-span bubble ratios are flattered; the figures above use the "
                     "reference.")
    unbudgeted = [s for s in record.spec.headline_schedules if s not in ("1f1b", "1f1b-prefetch", "geopipe")]
    if unbudgeted and record.spec.memory_budget:
        lines.append(f"{', '.join(unbudgeted)} ran without the budget (not instrumented for memory, or unable to "
                     "fit it).")
    _, repro, spread = repro_rows(record)
    if spread:
        lines.append(f"Reproducibility at {record.spec.focus_km:g} km ({len(repro)} repetitions, each one launch running "
                     f"the schedules interleaved): geopipe's step-time speed-up {spread}.")
    repeated = sum(p.measured.repeated for p in record.points)
    disturbed = sum(1 for p in record.points if p.measured.host_load and p.measured.host_load.disturbed)
    drifted = sorted({p.run_dir for p in record.points if p.measured.host_load and p.measured.host_load.drifted})
    slowed = sorted({p.run_dir for p in record.points if p.measured.host_load and p.measured.host_load.slowed})
    launches = len({p.run_dir for p in record.points})
    lines.append(f"Host: {repeated} run(s) measured again because the host was disturbed (CPU steal > "
                 f"{STEAL_BOUND:.0%}, other processes > {FOREIGN_BOUND:.0%} of the CPU, or its speed changed: the "
                 f"reference after the run more than {HOST_DRIFT_BOUND:.0%} off the one before), {disturbed} kept "
                 f"disturbed, {len(drifted)} of {launches} launches kept with the host's speed changed; in "
                 f"{len(slowed)} of {launches} launches the compute ran more than {COMPUTE_SLOWDOWN_FLAG:.0%} more "
                 "CPU than alone: that is the run's own cost (cores shared with the emulator and gloo), shown in "
                 "its breakdown, not the host's speed.")
    late = lateness_line(record)
    if late:
        lines.append(late)
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
    if env.get("dilation"):
        lines.append(f"Time dilation: {env['dilation']}.")
    if record.model_inputs is not None:
        lines.append(f"Model (fitted to nothing) from inputs independent of the links it predicts (each launch's "
                     f"compute, the 0 km 1f1b launch's host costs, per-message cost {record.message_overhead_s * 1e3:.2f} ms, "
                     f"and the plan's delays and rates): step time "
                     f"{_model_error(record, 'predicted_step_from_0km_s')}. The network-blind model (every delay 0): "
                     f"{_model_error(record, 'predicted_step_blind_s')}; only points where it is far off test the "
                     f"links ({_discriminating(record)}). Fed each launch's own lags, start offsets and probe (which "
                     f"absorb a wrong link; named so): {_model_error(record, 'predicted_step_s')}.")
        excess = link_excess_line(record)
        if excess:
            lines.append(excess)
    for m in record.model_only:
        lines.append(f"Model only (not emulated): {m.schedule} at {m.distance_km:g} km -> bubble "
                     f"{m.bubble:.3f}, step {m.step_s:.3f} s.")
    return lines


def lateness_line(record: ExperimentRecord) -> str | None:
    """Compute as time: the spans' p99 lateness over the runs (the worst stage of each) against the bound, and
    the runs kept beyond it; None where no run was timed."""
    worst = [max(x.p99_s for x in p.measured.span_lateness_per_stage) for p in record.points
             if p.measured.span_lateness_per_stage]
    if not worst:
        return None
    late = [f"{p.schedule} @{p.distance_km:g} km #{p.repetition}" for p in record.points if not p.measured.lateness_ok]
    return (f"Timed spans: p99 lateness {statistics.median(worst) * 1e6:.0f} us median over the runs (worst stage; "
            f"{min(worst) * 1e6:.0f}-{max(worst) * 1e6:.0f} us); bound {LATE_P99_FRACTION:.0%} of the stage's median "
            f"span, at least {LATE_FLOOR_S * 1e3:.1f} ms; a run beyond it is measured again like a disturbed one: "
            + (f"{len(late)} kept late ({', '.join(late)}), their figures carry the lateness." if late
               else "none was kept late."))


def _discriminating(record: ExperimentRecord) -> str:
    """How many points the network-blind model misses by more than BLIND_MARGIN (those that can catch a link)."""
    pts = [p for p in record.points if p.predicted_step_blind_s and p.measured.step_time_s]
    far = [p for p in pts if abs(p.predicted_step_blind_s / p.measured.step_time_s - 1) > BLIND_MARGIN]
    return f"{len(far)} of {len(pts)} points beyond {BLIND_MARGIN:.0%}"


def link_excess_line(record: ExperimentRecord) -> str | None:
    """The message probe beyond the 0 km launch's, per stage link: the links' own error against the plan. Judged
    against verify's one-way tolerance within the 0 km launch (the host's costs the same); in other launches
    shown, and the links judged by each run's own one-way check. None where no launch has a probe."""
    judged = [(e, b, p) for p in record.points if p.link_excess_s and p.link_excess_bound_s
              for e, b in zip(p.link_excess_s, p.link_excess_bound_s, strict=True)]
    other = [(e, p) for p in record.points if p.link_excess_s and not p.link_excess_bound_s for e in p.link_excess_s]
    late = sorted({p.label or f"{p.schedule} @{p.distance_km:g} km" for p in record.points
                   if p.links_on_plan is False})
    if not judged and not other:
        return None
    text = "Link error (the message probe beyond the 0 km launch's, per stage link; not fed to the model): "
    if judged:
        worst = max(judged, key=lambda r: abs(r[0]) / r[1])
        beyond = sorted({f"{p.schedule} @{p.distance_km:g} km" for e, b, p in judged if abs(e) > b})
        text += (f"in the 0 km launch largest {worst[0] * 1e3:+.3f} ms against verify's tolerance "
                 f"{worst[1] * 1e3:.3f} ms ({worst[2].schedule} at {worst[2].distance_km:g} km), "
                 + (f"BEYOND it: {', '.join(beyond)}; " if beyond else "every link within it; "))
    if other:
        e, p = max(other, key=lambda r: abs(r[0]))
        text += (f"in other launches (the host's drift between launches included) largest {e * 1e3:+.3f} ms "
                 f"({p.schedule} at {p.distance_km:g} km #{p.repetition}); ")
    return text + (f"each run's own one-way check: {len(late)} run(s) with a link off its plan ({', '.join(late)})."
                   if late else "each run's own one-way check: every link on its plan.")


def _model_error(record: ExperimentRecord, field: str) -> str:
    """The model's step-time error over every point it predicted (the prediction in `field`), the largest in
    words (its sweep, distance, schedule and budget)."""
    errors = [(getattr(p, field) / p.measured.step_time_s - 1, p) for p in record.points if getattr(p, field)]
    if not errors:
        return "no prediction"
    worst, at = max(errors, key=lambda e: abs(e[0]))
    return (f"within {abs(worst):.1%} of the measurement at every point ({len(errors)} points; the largest in the "
            f"{at.sweep} sweep at {at.distance_km:g} km, {at.schedule}, budget {at.memory_budget})")


def terminal_summary(exp_dir: Path) -> str:
    record = ExperimentRecord.load(exp_dir)
    fh, fr = focus_rows(record)
    out = [table.render(fh, fr, f"at {record.spec.focus_km:g} km, budget {record.spec.memory_budget or 'none'}: "
                                "medians [min-max] over repetitions; ! = spans stretched over the reference")]
    headers, rows, notes = distance_rows(record)
    out.append(table.render(headers, rows, "\nbubble vs reference per distance: median [min-max] (model), "
                                           "! = >20 % apart"))
    bh, br = budget_rows(record)
    if br:
        out.append(table.render(bh, br, f"\nmemory budget at {record.spec.focus_km:g} km (geopipe)"))
    rh, rr = rate_rows(record)
    if rr:
        out.append(table.render(rh, rr, f"\nlink rate at {record.spec.focus_km:g} km"))
    dh, dr = breakdown_rows(record)
    if dr:
        out.append(table.render(dh, dr, "\nwhere the step went: the ideal pipeline and the testbed's own cost"))
    ph, pr, _ = repro_rows(record)
    if len(pr) > 1:
        out.append(table.render(ph, pr, f"\nat {record.spec.focus_km:g} km, repetition by repetition"))
    ch, cr = cut_rows(record)
    out.append(table.render(ch, cr, "\ngeopipe's bubble cut per distance (medians), and the model's step against the run"))
    out += ["", compute_line(record), *headline(record)]
    paper = paper_line(record)
    if paper:
        out.append(paper)
    out += [f"model divergence: {n}" for n in notes]
    return "\n".join(out)


def _md_table(headers: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def write_report(exp_dir: Path) -> tuple[Path, Path]:
    record = ExperimentRecord.load(exp_dir)
    fh, fr = focus_rows(record)
    headers, rows, notes = distance_rows(record)
    bh, br = budget_rows(record)
    rh, rr = rate_rows(record)
    th, tr = transport_rows(record)
    dh, dr = breakdown_rows(record)
    ph, pr, spread = repro_rows(record)
    ch, cr = cut_rows(record)
    paper = paper_line(record)
    images = sorted(p.name for p in exp_dir.glob("*.png"))
    parts = [f"# GeoPipe experiment {record.id}", "", f"- {compute_line(record)}",
             *[f"- {line}" for line in headline(record)], *([f"- {paper}"] if paper else []), "",
             f"## At {record.spec.focus_km:g} km, budget {record.spec.memory_budget or 'none'}", "",
             "Medians [min-max] over interleaved repetitions. Bubble vs ref = 1 - the stage's uncontended compute / "
             "step time (the headline's); own spans = 1 - its F/B spans / step time. Stretch = own spans / reference "
             f"(`!` above {STRETCH_FLAG:.2f}).", "", _md_table(fh, fr), "",
             "## Bubble ratio vs distance", "", "Bubble vs reference, median [min-max over repetitions] (model); `!` "
             "marks a model more than 20 % off the measurement.", "", _md_table(headers, rows), ""]
    if notes:
        parts += ["Where the model diverges, and why:", "", *[f"- {n}" for n in notes], ""]
    parts += ["## GeoPipe's bubble cut per distance", "", "Medians over repetitions; the model's step error is the "
              "analytical model (fed the run's own compute and each link's probed per-message cost) against the "
              "measured step, per schedule.", "", _md_table(ch, cr), ""]
    if dr:
        parts += ["## Where the step went", "", "Each step split into the ideal pipeline (the stage's uncontended compute "
                  "on the configured links, simulated with no per-message cost) and the testbed's own cost, part by "
                  "part, from the kernel's clocks of every span (CPU, run-queue wait) and the machine's CPU ledger "
                  "(testbed/run/breakdown.py; each run's summary.json has it per stage).", "", _md_table(dh, dr), ""]
    if len(pr) > 1:
        parts += [f"## Reproducibility at {record.spec.focus_km:g} km", "", "Each repetition is one launch running every "
                  "schedule interleaved iteration by iteration, so a speed-up compares iterations seconds apart. "
                  + (f"Speed-up {spread}." if spread else ""), "", _md_table(ph, pr), ""]
    if br:
        parts += [f"## Memory budget at {record.spec.focus_km:g} km", "", _md_table(bh, br), ""]
    if rr:
        parts += [f"## Link rate at {record.spec.focus_km:g} km", "", "Where one transfer outlasts a micro-batch's "
                  "compute, the link is the bottleneck and overlap cannot pay.", "", _md_table(rh, rr), ""]
    if tr:
        parts += [f"## Transport at {record.spec.focus_km:g} km", "", "The same schedules over gloo's TCP (a send "
                  "waits for the receive) and over RDMA (RC writes into the receiver's slots), one after the other on "
                  "the same link; the model is told which transport ran.", "", _md_table(th, tr), ""]
    parts += ["## Plots", "", *[f"![{name}]({name})" for name in images], "",
              "Files: `summary.json` (everything), `points.csv`, `topology.yaml`, `plan.json`, `environment.json`, "
              "`model_inputs.json`, `runs/*/summary.json` and `runs/*/trace.json` (chrome://tracing, Perfetto)."]
    md = exp_dir / "report.md"
    md.write_text("\n".join(parts) + "\n")
    page = html_page(parts, exp_dir, "GeoPipe experiment")
    page_path = exp_dir / "report.html"
    page_path.write_text(page)
    return md, page_path


def rerender(exp_dir: Path) -> str:
    """Plots, report.md, report.html again from summary.json (records of 0.2 get the common yardstick);
    returns the terminal summary."""
    record = ExperimentRecord.load(exp_dir)
    record.pool_references()
    record.save(exp_dir)
    plots.render_all(exp_dir)
    write_report(exp_dir)
    return terminal_summary(exp_dir)
