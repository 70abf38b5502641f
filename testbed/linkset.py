"""Change OTN link directions of a running testbed (delay, rate, jitter, loss), through its shaper."""

from __future__ import annotations

import dataclasses
from typing import Any

from testbed.backends.base import Backend, BackendError
from testbed.plan.builder import reshape
from testbed.plan.model import LinkShape
from testbed.shaping.registry import shaper_for


def set_link(backend: Backend, a: str, b: str, *, from_dc: str | None = None, **values: Any) -> list[LinkShape]:
    """Apply new values to the a<->b link (both directions, or only the one leaving `from_dc`)."""
    state = backend.state
    shapes = [s for s in state.plan["shapes"] if {s["src_dc"], s["dst_dc"]} == {a, b}]
    if not shapes:
        links = ", ".join(sorted({s["link"] for s in state.plan["shapes"]}))
        raise BackendError(f"no OTN link between {a!r} and {b!r} in {state.name}; links: {links}")
    if from_dc:
        shapes = [s for s in shapes if s["src_dc"] == from_dc]
        if not shapes:
            raise BackendError(f"--from must be {a} or {b}")
    if all(v is None for v in values.values()):
        raise BackendError("nothing to change: give a delay, rate, jitter and/or loss")
    shaper = shaper_for(backend)
    if shaper is None:
        raise BackendError(f"testbed {state.name} runs without a shaper; nothing can be changed")
    changed = []
    for old in shapes:
        try:
            new = reshape(LinkShape(**old), **values)
        except ValueError as exc:
            raise BackendError(str(exc)) from None
        shaper.set_direction(new)
        state.plan["shapes"] = [dataclasses.asdict(new) if s is old else s for s in state.plan["shapes"]]
        state.save()
        changed.append(new)
    return changed
