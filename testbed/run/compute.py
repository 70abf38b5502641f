"""A run's compute (`--compute`, workloads/compute.py): the cost table the workers replay, from a saved
table or a deployment profile with each stage link's rate scale; None where the workers compute for real
or profile this host themselves (`replay`)."""

from __future__ import annotations

from testbed.run.summary import StageLink
from testbed.topology.profile import DeploymentProfile, resolve_profile
from workloads.compute import PROFILE, REAL, ComputeError, ComputeMode, CostTable


def rate_scales(links: list[StageLink], profile: DeploymentProfile, topology: str) -> list[float]:
    """Per stage link, the deployment's rate over the emulated one: the topology's `real_rate` across DCs, the
    profile's fabric rate within one."""
    scales = []
    for s, lk in enumerate(links):
        real = lk.real_rate_bps if lk.crosses_dc else profile.fabric_rate_bps
        if real is None:
            raise ComputeError(f"topology {topology}: the OTN path between stage {s} and {s + 1} has a link without "
                               "real_rate; add real_rate: 400G (the deployment's rate) to every link in the file, so "
                               f"the profile {profile.label}'s messages can be scaled to the emulated rate")
        scales.append(real / lk.rate_bps)
    return scales


def run_table(mode: ComputeMode, links: list[StageLink], topology: str,
              shape: tuple[int, int] | None = None) -> CostTable | None:
    """The table the workers replay for `mode` on these stage links, a profile's at micro-batch `shape` (b, s;
    None: its default) (None: real compute, or `replay` profiled by the workers at the start of the run)."""
    stages = len(links) + 1
    if mode.kind == REAL or not mode.source:
        return None
    if mode.kind == PROFILE:
        profile = resolve_profile(mode.source)
        return profile.table(stages, rate_scales(links, profile, topology), *(shape or (None, None)))
    table = CostTable.load(mode.source)
    if len(table.stages) != stages:
        raise ComputeError(f"{mode.source}: the table has {len(table.stages)} stages, this run {stages}; replay it "
                           f"with --stages {len(table.stages)}, or profile this run's stages with --compute replay")
    return table
