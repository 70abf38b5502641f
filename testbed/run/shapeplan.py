"""The shape planner on a topology (workloads/shapes.py): a deployment profile's stages placed on the topology's
hosts as a run places them, each stage link at its deployment rate (the topology's `real_rate` across DCs, the
profile's fabric within one) and configured delay, every schedule's shape searched at one token budget.
Nothing runs: the plan and the profile are the only inputs, so the choice can be printed before a run and
recorded beside its measurement."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from testbed.plan import build_plan
from testbed.run.compute import rate_scales
from testbed.run.runner import RunOptions, stage_links
from testbed.topology.loader import load_topology
from testbed.topology.profile import DeploymentProfile, resolve_profile
from workloads.shapes import PLANNED, Links, ShapePlan, ShapeSpace, plan_shapes


@dataclass(frozen=True, slots=True)
class ShapePlans:
    """Every planned schedule's search on one topology, profile and token budget."""

    topology: str
    profile: str
    tokens: int
    stages: int
    links: Links
    plans: tuple[ShapePlan, ...]

    def plan(self, schedule: str) -> ShapePlan:
        return next(p for p in self.plans if p.schedule == schedule)

    def to_json(self) -> dict[str, Any]:
        return {"topology": self.topology, "profile": self.profile, "tokens": self.tokens, "stages": self.stages,
                "link_delay_s": self.links.delay_s, "link_bytes_per_s": self.links.bytes_per_s,
                "plans": [p.to_json() for p in self.plans]}


def deployment_links(topology: str, profile: DeploymentProfile, stages: int | None = None,
                     placement: str = "spread") -> tuple[int, Links]:
    """The stage count (the topology's hosts where not given) and each stage link in the deployment's units."""
    plan = build_plan(load_topology(topology))
    options = RunOptions(schedules=["1f1b"], stages=stages or len(plan.hosts), placement=placement)
    hosts = options.hosts(plan)
    links = stage_links(plan, hosts)
    scales = rate_scales(links, profile, topology)
    return len(hosts), Links([lk.delay_s for lk in links], [lk.rate_bps * k / 8 for lk, k in zip(links, scales,
                                                                                                  strict=True)])


def plan_topology_shapes(topology: str, compute: str, tokens: int, schedules: tuple[str, ...] = PLANNED,
                         stages: int | None = None, space: ShapeSpace | None = None) -> ShapePlans:
    """Each of `schedules` searched over `space` at `tokens` per step on `topology` with profile `compute`."""
    profile = resolve_profile(compute)
    count, links = deployment_links(topology, profile, stages)
    plans = tuple(plan_shapes(s, tokens, lambda b, q: profile.table(count, [], b, q), links, space)
                  for s in schedules)
    return ShapePlans(topology, profile.label, tokens, count, links, plans)


def render_shape_plans(result: ShapePlans) -> str:
    """One block per schedule: its choice, the runner-up, and how long the search took."""
    lines = [f"shape plan: {result.profile} on {Path(result.topology).stem}, {result.stages} stages, {result.tokens} tokens "
             "per step; modelled from the profile and the plan (workloads/shapes.py)"]
    for p in result.plans:
        best, second = p.best, p.runner_up
        if best is None:
            lines.append(f"  {p.schedule:14} no shape fits: " + "; ".join(sorted({o.why for o in p.outcomes})))
            continue
        extra = f", dN {list(best.extra)}" if best.extra else ""
        lines.append(f"  {p.schedule:14} {best.shape_text}: step {best.step_s:.3f} s, bubble {best.bubble:.3f}{extra}"
                     f", peak {best.peak_bytes / 2**30:.0f} GiB of the node's HBM"
                     + (f"; runner-up {second.shape_text} {second.step_s:.3f} s" if second else "")
                     + f" ({len(p.outcomes)} shapes, {p.seconds:.1f} s)")
    return "\n".join(lines)
