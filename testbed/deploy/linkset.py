"""Change OTN link directions of a running testbed (delay, rate, jitter, loss), through its shaper."""

from __future__ import annotations

from testbed.backends.base import Backend, BackendError
from testbed.plan.builder import reshape
from testbed.plan.model import LinkDirection
from testbed.shaping.registry import shaper_for
from testbed.util.interrupts import cleanup


def set_link(backend: Backend, a: str, b: str, *, from_dc: str | None = None, delay_s: float | None = None,
             rate_bps: float | None = None, jitter_s: float | None = None,
             loss: float | None = None, real_rate_bps: float | None = None,
             edge_rate_bps: float | None = None) -> list[LinkDirection]:
    """Apply new values to the a<->b link (both directions, or only the one leaving `from_dc`); `real_rate_bps`
    restates the deployment's rate the emulated one stands for (recorded in the plan, nothing to shape);
    `edge_rate_bps` is the receiving OTN edge's DC-side port rate (a spine port cut)."""
    state = backend.state
    directions = [d for d in state.plan.directions if {d.src_dc, d.dst_dc} == {a, b}]
    if not directions:
        links = ", ".join(sorted({d.link for d in state.plan.directions}))
        raise BackendError(f"no OTN link between {a!r} and {b!r} in {state.name}; links: {links}")
    if from_dc:
        directions = [d for d in directions if d.src_dc == from_dc]
        if not directions:
            raise BackendError(f"--from must be {a} or {b}")
    if all(v is None for v in (delay_s, rate_bps, jitter_s, loss, real_rate_bps, edge_rate_bps)):
        raise BackendError("nothing to change: give a delay, rate, jitter, loss and/or edge rate")
    shaper = shaper_for(backend)
    if shaper is None:
        raise BackendError(f"testbed {state.name} runs without a shaper; nothing can be changed")
    changed = []
    for old in directions:
        new = reshape(old, delay_s=delay_s, rate_bps=rate_bps, jitter_s=jitter_s, loss=loss, real_rate_bps=real_rate_bps,
                      edge_rate_bps=edge_rate_bps)
        with cleanup():                  # a direction changes whole, or not at all, whatever signal arrives
            shaper.set_direction(new)
            state.plan = state.plan.replace_direction(new)
            state.save()
        changed.append(new)
    return changed
