"""Link shapers behind one interface, picked by name (or `auto`: netem where the kernel has it).

Adding a shaper is one module and one line here:

1. `testbed/shaping/<name>_shaper.py` with a `Shaper` subclass (testbed/shaping/base.py) whose `name` is the
   `--shaper` value. It implements `apply`, `set_direction`, `health` and `drops`; every other capability is
   optional and has a neutral default on the base: `hold_counters`, `restarts`, `daemon_stats` (a shaper with
   daemons of its own), `calibration` (read from its record), and for the remote wing `egress_leaf` (the leaf
   under each destination's HTB class on a machine's NIC: netem options, or a pfifo) and `delays_ingress` (a
   delay line on the receiver, installed through testbed/shaping/delayline_install.py).
2. Its class in `SHAPERS` below. The CLI's choices, `shaper_for`, the remote agent's `--mode` and the checks
   and runs that read counters all take it from there; none of them names a shaper's class or mode.

`kernel_shaper` (testbed/backends/capabilities.py) decides what `auto` picks.
"""

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


def machine_shaper(choice: str) -> type[Shaper]:
    """The shaper a remote machine's agent installs: `auto` -> what this machine's kernel allows."""
    name = kernel_shaper() if choice == "auto" else choice
    if name in SHAPERS:
        return SHAPERS[name]
    if choice == "auto":
        raise ShaperError(f"this kernel can emulate no delay (shaper {name!r}): it needs sch_netem or NFQUEUE + HTB")
    raise ShaperError(f"unknown shaper {choice!r}; choose auto or one of: {', '.join(SHAPERS)}")


def daemon_roles() -> set[str]:
    """The roles under which the shapers record their daemons (testbed state's processes)."""
    return {cls.daemon_role for cls in SHAPERS.values() if cls.daemon_role}


def runs_daemons(name: str | None) -> bool:
    """Whether the shaper of this name runs daemons of its own (a remote machine's, as its facts name it)."""
    cls = SHAPERS.get(name or "")
    return cls is not None and cls.daemon_role is not None


def shaper_for(backend: Backend, name: str | None = None) -> Shaper | None:
    """The shaper a testbed uses (from its state unless named); None for `none`."""
    name = name or backend.state.shaper_name
    if name == "none":
        return None
    return SHAPERS[name](backend)


__all__ = ["CHOICES", "SHAPERS", "DirectionDrops", "Health", "Shaper", "ShaperError", "machine_shaper", "resolve",
           "shaper_for"]
