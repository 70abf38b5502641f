"""The one root of the testbed's errors: every error a user can reach derives from `TestbedError` (a one-line
reason, a `hint` naming the fix, an `exit_code`), and `testbed.cli.main` handles them all in one place.

The class is defined in `workloads.errors` (workloads/ imports nothing from here, and its errors derive from it
too); this module is where the testbed's own code takes it from. `testbed.util.interrupts.Interrupted` is the one
deliberate exception: a signal, like KeyboardInterrupt, must pass through `except Exception`, so it derives from
BaseException and only shares the interface (`exit_code`, `lines()`).

The lowest layer: imports nothing from the rest of `testbed`.
"""

from __future__ import annotations

from workloads.errors import TestbedError

__all__ = ["TestbedError"]
