"""One unwinding path for SIGINT, SIGTERM and SIGHUP (Ctrl-C, `kill`/`timeout`/schedulers, a closed terminal).

Inside `unwinding()`, such a signal becomes an `Interrupted` exception where the program is, so `finally`
blocks and context managers undo what was made. Inside `cleanup()` (the undoing itself, or a step that must
happen whole, such as changing a link) signals are only acknowledged: a second Ctrl-C, or the SIGHUP that
follows a SIGTERM, never cuts teardown short; a first signal that arrives inside such a step on the normal
path is raised as soon as the step is done (it was lost before: a run that changes links often, the
experiment's distance sweep, went on to the end after a SIGTERM). A signal
whose exception was swallowed where Python ignores exceptions (an at-fork hook, a finalizer) stays pending
and `raise_if_pending()`, called at the checkpoints of long operations, raises it again.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from types import FrameType

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Interrupted(BaseException):
    """A signal asked the command to stop; everything it made is being removed."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        super().__init__(f"received {signal.Signals(signum).name}")

    @property
    def exit_code(self) -> int:
        """128 + the signal number, as shells report a command ended by it (130 for Ctrl-C)."""
        return 128 + self.signum

    def lines(self) -> list[str]:
        """What the command line says on its way out (the same interface as testbed.errors.TestbedError, which
        this is not beneath: a signal must pass `except Exception`, as KeyboardInterrupt does)."""
        return [f"{self}; everything this command created was removed"]


_depth = 0
_cleaning = 0
_pending: int | None = None
"""A signal whose exception has not yet been seen leaving an `unwinding()` block."""
_deferred = False
"""The first signal arrived inside a `cleanup()` step on the normal path: raise it when the step is done."""


def _handler(signum: int, _frame: FrameType | None) -> None:
    global _pending, _deferred
    if _cleaning:
        first = _pending is None
        if first:
            _pending, _deferred = signum, True
        with contextlib.suppress(OSError):      # the terminal may be gone (SIGHUP): carry on quietly
            os.write(2, f"testbed: {signal.Signals(signum).name} while cleaning up: "
                        f"{'stopping once this step is done' if first else 'still cleaning up'}\n".encode())
        return
    _pending = signum
    raise Interrupted(signum)


def raise_if_pending() -> None:
    """Raise the interrupt a swallowed exception lost (a checkpoint of a long operation)."""
    if _pending is not None and _depth and not _cleaning:
        raise Interrupted(_pending)


@contextlib.contextmanager
def unwinding() -> Iterator[None]:
    """Within the block, SIGINT/SIGTERM/SIGHUP raise `Interrupted` (nested blocks share that state)."""
    global _depth, _pending, _deferred
    previous = {s: signal.signal(s, _handler) for s in SIGNALS}
    _depth += 1
    try:
        yield
    finally:
        _depth -= 1
        for s, handler in previous.items():
            signal.signal(s, handler)
        if _depth == 0:
            _pending = None
            _deferred = False


@contextlib.contextmanager
def cleanup() -> Iterator[None]:
    """Undoing what was made (or a step that must happen whole): signals are acknowledged but do not interrupt
    it; a first one is raised when the outermost such step ends."""
    global _cleaning, _deferred
    _cleaning += 1
    try:
        yield
    finally:
        _cleaning -= 1
        if not _cleaning and _deferred and _depth and _pending is not None:
            _deferred = False
            raise Interrupted(_pending)
