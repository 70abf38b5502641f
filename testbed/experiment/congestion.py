"""The GeoPipe paper's congestion test, scaled to one machine (`testbed congestion`, `make congestion`).

One training run in compute as time per variant of the OTN edge, on the same topology with the same background
traffic, and the same event: the receiving edges' DC-side (spine) port cut to half its rate (400 -> 200 Gbit/s
real) at the start of a set iteration, until the run ends:
- `pfc`: the topology's finite buffer with pause (XOFF/XON from the headroom);
- `drop`: the same buffer without pause: what does not fit is dropped (tail drop);
- `queue`: a deep queue that holds everything (today's `lossless: true`).
Each variant's edges are sampled through the run (testbed/experiment/edge_sampler.py) and written beside its step
times, drops, pauses and every host's TCP counters to congestion.json; congestion_report.py draws the plot and
writes the report.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from testbed.backends.base import Backend
from testbed.deploy import lifecycle
from testbed.errors import TestbedError
from testbed.experiment.edge_sampler import EdgeSampler
from testbed.run.breakdown import step_of
from testbed.run.events import At, LinkChange
from testbed.run.runner import RunOptions, run_schedules
from testbed.shaping.registry import shaper_for
from testbed.topology import load_topology
from testbed.util.paths import resolve_topology
from workloads.records import RankTrace

VARIANTS = ("pfc", "drop", "queue")
SAMPLE_LEAD_S = 1.0
"""Edge samples kept from this long before the run's first iteration (the warm-up's) to as long after its last."""
EDGE_KEYS = ("lossless", "buffer", "xoff", "xon")


class CongestionError(TestbedError, ValueError):
    """A congestion experiment that cannot run as asked; the message says what would."""


@dataclass(frozen=True, slots=True)
class CongestionSpec:
    """What `testbed congestion` runs (every field has the command line's default)."""

    topology: str = "2dc-congestion"
    """A topology with a PFC edge and background traffic on its first link."""
    variants: tuple[str, ...] = VARIANTS
    cut: float = 0.5
    """The edge's DC-side rate after the cut, as a fraction of before (the paper: 400 -> 200 Gbit/s)."""
    cut_iteration: int = 3
    iterations: int = 6
    microbatches: int = 8
    schedule: str = "1f1b"
    compute: str = "gpt-7b-h100"
    results: str = "results"

    def check(self) -> None:
        unknown = [v for v in self.variants if v not in VARIANTS]
        if unknown or not self.variants:
            raise CongestionError(f"variants {', '.join(unknown) or '(none)'}: choose from {', '.join(VARIANTS)}")
        if not 0 < self.cut <= 1:
            raise CongestionError(f"cut {self.cut:g}: give the rate after the cut as a fraction in (0, 1], e.g. 0.5")
        if not 1 <= self.cut_iteration <= self.iterations:
            raise CongestionError(f"cut at iteration {self.cut_iteration}: the run's timed iterations are "
                                  f"1..{self.iterations}")


@dataclass(slots=True)
class VariantResult:
    """One variant's run, as congestion.json records it (times in seconds from its first iteration's start)."""

    variant: str
    run_dir: str
    steps: list[dict[str, float]] = field(default_factory=list)
    """Per timed iteration: its number, start, end and step time."""
    cut_s: float | None = None
    samples: list[dict[str, Any]] = field(default_factory=list)
    links: list[dict[str, Any]] = field(default_factory=list)
    """summary.json's links: drops during the run and each direction's edge (pauses, pause time, buffer peak)."""
    tcp: dict[str, Any] = field(default_factory=dict)
    background: list[dict[str, Any]] = field(default_factory=list)
    fb_per_microbatch_s: float | None = None


def variant_topology(source: Path, variant: str, out: Path) -> Path:
    """The topology file with its first link's edge made `variant` (the same buffer size for `drop` as the PFC
    edge's), written to `out`."""
    topology = load_topology(source)
    link = topology.links[0] if topology.links else None
    if link is None or link.edge is None or link.edge.mode != "pfc" or not topology.background:
        raise CongestionError(f"{source}: the congestion test needs a first link with 'lossless: pfc' and "
                              "'background:' traffic (see topologies/2dc-congestion.yaml)")
    raw = yaml.safe_load(source.read_text())
    spec = raw["links"][0]
    pfc = {k: spec[k] for k in EDGE_KEYS if k in spec}
    for key in EDGE_KEYS:
        spec.pop(key, None)
    if variant == "pfc":
        spec.update(pfc)
    elif variant == "drop":
        from testbed.plan.builder import build_plan

        buffer = build_plan(topology).directions[0].edge.buffer_bytes      # type: ignore[union-attr]
        spec.update({"lossless": False, "buffer": f"{buffer}B"})
    else:
        spec["lossless"] = "queue"
    raw["name"] = f"{raw['name'][:20]}-{variant}"
    out.write_text(yaml.safe_dump(raw, sort_keys=False))
    return out


def run_congestion(spec: CongestionSpec, log: Callable[[str], None] = print) -> Path:
    """Every variant on a testbed of its own, one after the other; returns the experiment's folder (with
    congestion.json, congestion.png and report.md)."""
    from testbed.experiment.congestion_report import write_report

    spec.check()
    source = resolve_topology(spec.topology)
    out = Path(spec.results) / f"congestion-{time.strftime('%Y%m%d-%H%M%S')}"
    out.mkdir(parents=True, exist_ok=True)
    record: dict[str, Any] = {"spec": asdict(spec), "topology": str(source), "variants": []}
    for variant in spec.variants:
        path = variant_topology(source, variant, out / f"topology-{variant}.yaml")
        log(f"{variant}: bringing up {path.name} ...")
        with lifecycle.testbed_for(str(path), name=f"cg-{variant}", log=lambda _m: None) as backend:
            result = run_variant(backend, spec, variant, out, log)
        record["variants"].append(asdict(result))
        (out / "congestion.json").write_text(json.dumps(record, indent=1))    # what is measured is kept at once
    report = write_report(out)
    log(f"report: {report}")
    return out


def run_variant(backend: Backend, spec: CongestionSpec, variant: str, out: Path,
                log: Callable[[str], None]) -> VariantResult:
    """One training run with the cut at `spec.cut_iteration`, its edges sampled throughout."""
    direction = backend.state.plan.directions[0]
    assert direction.edge is not None
    cut = At(spec.cut_iteration, LinkChange(direction.src_dc, direction.dst_dc,
                                            edge_rate_bps=direction.edge.drain_rate_bps * spec.cut))
    options = RunOptions(schedules=[spec.schedule], microbatches=spec.microbatches, iterations=spec.iterations,
                         compute=spec.compute, events=[cut], transport="tcp")
    with EdgeSampler(shaper_for(backend)) as sampler:
        run_dir, summary = run_schedules(backend, options, out, run_id=variant, log=lambda m: log(f"  {m}"))
    data = json.loads((run_dir / "summary.json").read_text())
    origin, steps = iteration_steps(run_dir / spec.schedule)
    events = data.get("events") or []
    end = steps[-1]["end_s"] if steps else 0.0
    kept = [s.to_json(origin) for s in sampler.samples]         # the kept launch's (a repeated one's fall outside)
    if sampler.error:
        log(f"  edge sampling stopped early: {sampler.error}")
    return VariantResult(variant=variant, run_dir=str(run_dir), steps=steps,
                         cut_s=events[0]["start_s"] if events else None,
                         samples=[s for s in kept if -SAMPLE_LEAD_S <= s["t"] <= end + SAMPLE_LEAD_S],
                         links=data["links"],
                         tcp=data.get("tcp", {}), background=data.get("background", []),
                         fb_per_microbatch_s=summary.fb_per_microbatch_s)


def iteration_steps(folder: Path) -> tuple[float, list[dict[str, float]]]:
    """The run's time origin (its first iteration's start, as the events are placed) and each timed iteration's
    start and end, and its step as the summary counts it (`breakdown.step_of`)."""
    ranks = sorted((RankTrace.from_json(json.loads(p.read_text())) for p in folder.glob("rank-*.json")
                    if not p.name.endswith(".dilated.json")), key=lambda r: r.rank)
    origin = min(it.start for r in ranks for it in r.iterations)
    steps = []
    for number in sorted({it.iteration for it in ranks[0].iterations if not it.warmup}):
        its = [next(it for it in r.iterations if it.iteration == number) for r in ranks]
        step = step_of(its)
        steps.append({"iteration": number, "start_s": its[0].start - origin, "end_s": its[0].start + step - origin,
                      "step_s": step})
    return origin, steps
