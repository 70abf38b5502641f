"""One unwinding path for SIGINT, SIGTERM and SIGHUP (Ctrl-C, `kill`/`timeout`/schedulers, a closed terminal).

The first such signal becomes an `Interrupted` exception where the program is, so `finally` blocks and
context managers undo what was made. Signals that arrive while that unwinding runs are acknowledged and
otherwise ignored: cleanup is never cut short by a second Ctrl-C or by the SIGHUP that follows a SIGTERM.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager
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
_unwinding: int | None = None


def _handler(signum: int, _frame: FrameType | None) -> None:
    global _unwinding
    if _unwinding is not None:
        with contextlib.suppress(OSError):      # the terminal may be gone (SIGHUP): carry on quietly
            os.write(2, f"testbed: {signal.Signals(signum).name} while cleaning up: still cleaning up\n".encode())
        return
    _unwinding = signum
    raise Interrupted(signum)


@contextmanager
def unwinding() -> Iterator[None]:
    """Within the block, SIGINT/SIGTERM/SIGHUP raise `Interrupted` once (nested blocks share that state)."""
    global _depth, _unwinding
    previous = {s: signal.signal(s, _handler) for s in SIGNALS}
    _depth += 1
    try:
        yield
    finally:
        _depth -= 1
        for s, handler in previous.items():
            signal.signal(s, handler)
        if _depth == 0:
            _unwinding = None
