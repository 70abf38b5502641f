"""A time series of every OTN edge during a run: a thread that reads the shaper's edge counters as the delay
daemons write them (every 0.5 s) and keeps each new reading with the monotonic time it was read."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

from testbed.shaping.base import Shaper
from testbed.shaping.otn_edge import EdgeCounters

POLL_S = 0.1
"""How often the statistics files are read (a reading is kept when it differs from the last: a new write)."""


@dataclass(frozen=True, slots=True)
class EdgeSample:
    """One direction's edge counters as read at `t` (monotonic seconds)."""

    t: float
    direction: str
    counters: EdgeCounters

    def to_json(self, origin: float = 0.0) -> dict[str, Any]:
        return {"t": round(self.t - origin, 4), "direction": self.direction, **self.counters.to_json()}


@dataclass(slots=True)
class EdgeSampler:
    """Samples `shaper`'s edges from `start()` until `stop()` (use as a context manager)."""

    shaper: Shaper
    samples: list[EdgeSample] = field(default_factory=list)
    error: str = ""
    """Why sampling stopped early (empty: it did not)."""
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> EdgeSampler:
        self._thread = threading.Thread(target=self._loop, name="edge-sampler", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _loop(self) -> None:
        last: dict[str, EdgeCounters] = {}
        while not self._stop.is_set():
            try:
                readings = self.shaper.edge_counters()
            except (OSError, ValueError):            # a statistics file being replaced: read it next time
                readings = {}
            except Exception as exc:                 # noqa: BLE001 - said in the record, the run goes on
                self.error = f"{type(exc).__name__}: {exc}"
                return
            now = time.monotonic()
            for direction, counters in readings.items():
                if counters != last.get(direction):
                    last[direction] = counters
                    self.samples.append(EdgeSample(counters.at_s or now, direction, counters))   # when written
            self._stop.wait(POLL_S)
