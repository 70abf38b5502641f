"""The root of every error the testbed reports to its user (`testbed.errors` is where the testbed's code takes it
from). It lives here, in the lowest package, because `workloads/` imports nothing from `testbed/` and its own errors
(a schedule that cannot run, a broken memory budget, a deadlock, a bad --compute value) reach the user too."""

from __future__ import annotations


class TestbedError(Exception):
    """Something the user can fix: `str(exc)` is one line, the reason and then (after '; ') the fix.

    `reason` is what went wrong, `hint` what to do about it (empty where the reason already says it), and
    `exit_code` the status the command line ends with. Subclasses keep their historical second base (ValueError,
    RuntimeError, OSError) so that code catching those still does.
    """

    __test__ = False                 # not a pytest test class, whatever its name
    exit_code: int = 1
    hint: str = ""

    def __init__(self, reason: str = "", *, hint: str = "", exit_code: int | None = None) -> None:
        self.reason = reason
        if hint:
            self.hint = hint
        if exit_code is not None:
            self.exit_code = exit_code
        super().__init__(f"{reason}; {hint}" if reason and hint else reason or hint)

    def lines(self) -> list[str]:
        """What a command line shows of it (without the program's name): one line, unless a subclass carries a
        list of problems to show each on its own."""
        return [str(self)]
