"""How late compute as time's spans really ended, per stage, and the bound beyond which a run is late.

A timed span ends at a deadline on its stage's device timeline (workloads/stagecompute.py); its lateness is its
actual end less that deadline. A late span does not push the device's next deadline, but its message leaves no
earlier than its actual end, and the spans whose deadlines passed meanwhile end late too. A run whose p99 lateness
on some stage is beyond `bound_s` is measured again like a disturbed run (testbed/run/attempts.py) and, late
again, kept and flagged (`ScheduleSummary.lateness_ok`).
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass
from typing import Any

from workloads.records import IterationRecord
from workloads.sizing import quantile

LATE_P99_FRACTION = 0.05
"""A stage's timed spans are late when their p99 lateness exceeds this fraction of its median span (or
LATE_FLOOR_S, if larger). A late span's message leaves late by its lateness: at 5 % of a span, a critical path
whose every hop were that late would be at most 5 % longer, and at the p99 one hop in a hundred is. A sleep to
a deadline on the project's 2-core VMs under load is late by a p99 of 0.15-1.5 ms (and rare outliers of 3-8 ms,
which no setting removes: the p99 leaves them out): such a host fails with 7 ms spans (bound 0.35 ms) and passes
with 60 ms ones (bound 3 ms)."""
LATE_FLOOR_S = 0.3e-3
"""The bound's least value: twice the lowest p99 measured there (0.15 ms), so that a quiet host is not late on
short spans (3 ms spans: 5 % is 0.15 ms)."""
P99 = 0.99


@dataclass(frozen=True, slots=True)
class SpanLateness:
    """One stage's timed F/B spans over the steady iterations: how late they ended (seconds)."""

    spans: int
    median_s: float
    p99_s: float
    """Linear-interpolated 99th percentile (workloads.sizing.quantile)."""
    worst_s: float
    span_median_s: float
    """The stage's median planned span (what the bound is a fraction of)."""

    @property
    def bound_s(self) -> float:
        return max(LATE_FLOOR_S, LATE_P99_FRACTION * self.span_median_s)

    @property
    def ok(self) -> bool:
        """The p99 lateness is within the bound."""
        return self.p99_s <= self.bound_s

    def describe(self) -> str:
        return (f"p99 {self.p99_s * 1e3:.2f} ms > bound {self.bound_s * 1e3:.2f} ms "
                f"(median {self.median_s * 1e6:.0f} us, worst {self.worst_s * 1e3:.2f} ms, {self.spans} spans)")

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "bound_s": self.bound_s, "ok": self.ok}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SpanLateness:
        return cls(**{k: v for k, v in data.items() if k not in ("bound_s", "ok")})


def span_lateness(its: list[IterationRecord]) -> SpanLateness | None:
    """The lateness of the F/B spans of `its` (one stage's steady iterations); None where none is timed."""
    spans = [s for it in its for s in it.spans if s.kind in ("F", "B") and s.lateness_s is not None]
    if not spans:
        return None
    late = [s.lateness_s or 0.0 for s in spans]
    return SpanLateness(spans=len(late), median_s=statistics.median(late), p99_s=quantile(late, P99),
                        worst_s=max(late), span_median_s=statistics.median(s.seconds for s in spans))
