"""Validation errors that name the file, the key path, what is wrong and what would be right."""

from __future__ import annotations

from dataclasses import dataclass

from testbed.errors import TestbedError


@dataclass(frozen=True, slots=True)
class Problem:
    """One thing wrong with a topology file."""

    path: str
    """Key path inside the file, e.g. `links[2].b`."""
    problem: str
    """What is wrong."""
    fix: str
    """What would be right."""

    def render(self, source: str) -> str:
        where = f"{source}: {self.path}" if self.path else source
        return f"{where}: {self.problem}; {self.fix}"


class TopologyError(TestbedError, ValueError):
    """A topology file is invalid. Carries every problem found, each with file, key path and fix."""

    exit_code = 2
    what = "topology"
    """What kind of file `source` is, as the command line names it."""

    def __init__(self, source: str, problems: list[Problem]) -> None:
        self.source = source
        self.problems = list(problems)
        super().__init__("\n".join(p.render(source) for p in self.problems))

    def lines(self) -> list[str]:
        """One line for one problem; else a headline and every problem (all of them, at once) on its own line."""
        if len(self.problems) == 1:
            return [f"invalid {self.what}: {self.problems[0].render(self.source)}"]
        return [f"invalid {self.what} {self.source} ({len(self.problems)} problems)",
                *(f"  {p.render(self.source)}" for p in self.problems)]
