"""One verified property (`Check`), a run of them (`VerifyReport`), and their table and JSON forms."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from testbed.util import table


@dataclass(frozen=True, slots=True)
class Check:
    """One verified property: what was expected, what was measured, pass or fail."""

    kind: str
    subject: str
    expected: str
    measured: str
    ok: bool
    key: str = ""
    """What it is about, for code to match on (a direction's label, a DC pair): never parsed from `subject`."""
    value: float | None = None
    """The measured figure in SI units (seconds, bits/s) where there is one."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(slots=True)
class VerifyReport:
    """All checks of one verify run."""

    testbed: str
    checks: list[Check] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    def failures(self) -> list[Check]:
        return [c for c in self.checks if not c.ok]

    def to_json(self) -> dict[str, Any]:
        return {"testbed": self.testbed, "ok": self.ok, "checks": [c.to_json() for c in self.checks]}

    def render(self, show_all: bool = False) -> str:
        """The checks as a table; host pairs and routes that passed are counted, not listed, unless `show_all`."""
        rows = [(c.kind, c.subject, c.expected, c.measured, "pass" if c.ok else "FAIL") for c in self.checks
                if show_all or not c.ok or c.kind not in ("reach", "route")]
        n_reach = sum(1 for c in self.checks if c.kind == "reach")
        n_route = sum(1 for c in self.checks if c.kind == "route")
        hidden = "" if show_all else (f" ({n_reach} host pairs and {n_route} routes passed are not listed; --all "
                                      "lists them)")
        return (table.render(["check", "subject", "expected", "measured", "result"], rows)
                + f"\n{sum(c.ok for c in self.checks)}/{len(self.checks)} checks passed{hidden}")
