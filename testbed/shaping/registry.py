"""Link shapers behind one interface, picked by name (or `auto`: netem where the kernel has it)."""

from __future__ import annotations

from testbed.backends.base import Backend
from testbed.backends.capabilities import kernel_shaper
from testbed.shaping.base import DirectionDrops, Health, Shaper, ShaperError
from testbed.shaping.delayline_shaper import DelaylineShaper
from testbed.shaping.netem_shaper import NetemShaper

SHAPERS: dict[str, type[Shaper]] = {DelaylineShaper.name: DelaylineShaper, NetemShaper.name: NetemShaper}
CHOICES = ["auto", "none", *SHAPERS]


def resolve(choice: str) -> str:
    """`auto` -> `netem` if the kernel has it, else `delayline` if NFQUEUE works; otherwise an error."""
    if choice != "auto":
        if choice not in CHOICES:
            raise ShaperError(f"unknown shaper {choice!r}; choose one of: {', '.join(CHOICES)}")
        return choice
    shaper = kernel_shaper()
    if shaper == "none":
        raise ShaperError("no shaper works on this kernel (no netem, no NFQUEUE+HTB): delays cannot be emulated; "
                          "run 'testbed doctor', or use --shaper none to run without delay (named in every report)")
    return shaper


def shaper_for(backend: Backend, name: str | None = None) -> Shaper | None:
    """The shaper a testbed uses (from its state unless named); None for `none`."""
    name = name or backend.state.shaper_name
    if name == "none":
        return None
    return SHAPERS[name](backend)


__all__ = ["CHOICES", "SHAPERS", "DirectionDrops", "Health", "Shaper", "ShaperError", "resolve", "shaper_for"]
