"""The shape planner on a topology (workloads/shapes.py): a deployment profile's stages placed on the topology's
hosts as a run places them, each stage link at its deployment rate (the topology's `real_rate` across DCs, the
profile's fabric within one) and configured delay, every schedule's shape searched at one token budget.
Nothing runs: the plan and the profile are the only inputs, so the choice can be printed before a run and
recorded beside its measurement."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from testbed.plan import build_plan
from testbed.plan.model import Plan
from testbed.run.runner import RunOptions
from testbed.topology.loader import load_topology
from testbed.topology.profile import DeploymentProfile, resolve_profile
from workloads.compute import ComputeError, CostTable
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


def links_of_plan(plan: Plan, profile: DeploymentProfile, stages: int | None = None, *, delay_s: float | None = None,
                  real_rate_bps: float | None = None) -> tuple[int, Links]:
    """The stage count (the plan's hosts where not given) and each stage link in the deployment's units: across
    DCs the OTN hops' delays (`delay_s` per hop where given) and their real rate (`real_rate_bps` where given),
    within a DC the profile's fabric."""
    hosts = RunOptions(schedules=["1f1b"], stages=stages or len(plan.hosts)).hosts(plan)
    delays, rates = [], []
    for a, b in zip(hosts, hosts[1:], strict=False):
        if a.dc == b.dc:
            delays.append(0.0)
            rates.append(profile.fabric_rate_bps / 8)
            continue
        hops = plan.hops(a.dc, b.dc)
        reals = [real_rate_bps or h.real_rate_bps for h in hops]
        if None in reals:
            raise ComputeError(f"topology {plan.topology}: the OTN path {a.dc} -> {b.dc} has a link without real_rate; "
                               "add real_rate: 400G (the deployment's rate) to every link in the file")
        delays.append(sum(h.delay_s if delay_s is None else delay_s for h in hops))
        rates.append(min(r for r in reals if r is not None) / 8)
    return len(hosts), Links(delays, rates)


def profile_costs(profile: DeploymentProfile, stages: int) -> Callable[[int, int], CostTable]:
    """The profile's cost table at shape (b, s), unscaled (the deployment's own bytes)."""
    return lambda b, s: profile.table(stages, [], b, s)


def plan_topology_shapes(topology: str, compute: str, tokens: int, schedules: tuple[str, ...] = PLANNED,
                         stages: int | None = None, space: ShapeSpace | None = None) -> ShapePlans:
    """Each of `schedules` searched over `space` at `tokens` per step on `topology` with profile `compute`."""
    profile = resolve_profile(compute)
    count, links = links_of_plan(build_plan(load_topology(topology)), profile, stages)
    plans = tuple(plan_shapes(s, tokens, profile_costs(profile, count), links, space) for s in schedules)
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
