"""One unwinding path for SIGINT, SIGTERM and SIGHUP (Ctrl-C, `kill`/`timeout`/schedulers, a closed terminal).

Inside `unwinding()`, such a signal becomes an `Interrupted` exception where the program is, so `finally`
blocks and context managers undo what was made. Inside `cleanup()` (the undoing itself) signals are only
acknowledged: a second Ctrl-C, or the SIGHUP that follows a SIGTERM, never cuts teardown short. A signal
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


_depth = 0
_cleaning = 0
_pending: int | None = None
"""A signal whose exception has not yet been seen leaving an `unwinding()` block."""


def _handler(signum: int, _frame: FrameType | None) -> None:
    global _pending
    if _cleaning:
        with contextlib.suppress(OSError):      # the terminal may be gone (SIGHUP): carry on quietly
            os.write(2, f"testbed: {signal.Signals(signum).name} while cleaning up: still cleaning up\n".encode())
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
    global _depth, _pending
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


@contextlib.contextmanager
def cleanup() -> Iterator[None]:
    """Undoing what was made: signals are acknowledged but do not interrupt it."""
    global _cleaning
    _cleaning += 1
    try:
        yield
    finally:
        _cleaning -= 1
