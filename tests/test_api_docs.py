"""docs/api.md against the code (no root): every public name it mentions in backticks exists where it says, so
the document cannot drift from the API without this failing."""

from __future__ import annotations

import builtins
import re
from pathlib import Path

from testbed import api
from testbed.experiment.sweep import Experiment

DOC = Path(__file__).resolve().parents[1] / "docs" / "api.md"
OWNERS = {"tb": api.Testbed, "Testbed": api.Testbed, "ExperimentSpec": api.ExperimentSpec,
          "ExperimentResult": api.ExperimentResult, "Experiment": Experiment, "tb.link(a, b)": api.LinkControl,
          "VerifyResult": api.VerifyResult}
"""Who owns `x` in `Owner.x` as the document writes it (tb is a Testbed, tb.link(a, b) its LinkControl)."""


def _mentions() -> list[str]:
    return re.findall(r"`([^`\n]+)`", DOC.read_text())


def _attribute_paths() -> list[tuple[str, str]]:
    """(owner, attribute) of every `Owner.attribute...` the document writes (calls' arguments left out)."""
    found = []
    for text in _mentions():
        bare = re.sub(r"\([^()]*\)", "()", text)
        for owner in sorted(OWNERS, key=len, reverse=True):
            head = re.sub(r"\([^()]*\)", "()", owner)
            if bare.startswith(head + "."):
                attribute = re.match(r"[A-Za-z_]\w*", bare[len(head) + 1:])
                if attribute:
                    found.append((owner, attribute.group(0)))
                break
    return found


def test_every_owner_attribute_the_document_names_exists() -> None:
    paths = _attribute_paths()
    assert len(paths) >= 15, paths                          # the parser still finds the document's names
    missing = [f"{o}.{a}" for o, a in paths if not hasattr(OWNERS[o], a)]
    assert not missing, f"docs/api.md names what the code lacks: {missing}"


def test_every_capitalised_name_and_function_the_document_names_is_importable_from_the_api() -> None:
    names = set()
    for text in _mentions():
        match = re.fullmatch(r"([A-Z][A-Za-z_]+|[a-z_]+)(\(.*\))?", text)
        if match and (text[0].isupper() or "(" in text):
            names.add(match.group(1))
    assert {"BackendError", "RunError", "UserScheduleError", "run_experiment", "link_set"} <= names, names
    results = (api.RunResult, api.ExperimentResult, api.VerifyResult)       # `rows()`, `summary()`: their methods
    missing = sorted(n for n in names if not hasattr(api, n) and not hasattr(builtins, n) and n not in OWNERS
                     and not any(hasattr(cls, n) for cls in results)
                     and n not in ("B", "F", "RB", "RF", "SB", "SF"))    # the schedule notation's letters
    assert not missing, f"docs/api.md names what testbed.api does not export: {missing}"


def test_the_documented_exceptions_are_the_ones_raised() -> None:
    """A refused schedule of one's own raises UserScheduleError, which is not a RunError (docs/api.md says so)."""
    text = DOC.read_text()
    assert "UserScheduleError" in text
    assert not issubclass(api.UserScheduleError, api.RunError)
    assert issubclass(api.RunError, api.TestbedError) and issubclass(api.BackendError, api.TestbedError)
