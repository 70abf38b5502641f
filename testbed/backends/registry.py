"""Backends picked by name from a plain registry."""

from __future__ import annotations

from testbed.backends.base import Backend, BackendError
from testbed.backends.mininet import MininetBackend
from testbed.backends.netns import NetnsBackend
from testbed.state.store import TestbedState

BACKENDS: dict[str, type[Backend]] = {
    NetnsBackend.name: NetnsBackend,
    MininetBackend.name: MininetBackend,
}


def backend_for(state: TestbedState) -> Backend:
    """The backend that built (or will build) this testbed."""
    try:
        return BACKENDS[state.backend](state)
    except KeyError:
        raise BackendError(f"unknown backend {state.backend!r}; choose one of: {', '.join(BACKENDS)}") from None
