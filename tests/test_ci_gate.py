"""Under CI=true a tier that ran no test, or (with CI_ALLOWED_SKIPS) skipped one for a reason its runner's list does
not name, fails (tests/conftest.py's CiGate): pytest run in a child process on tiny generated test files."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

TESTS = {
    "all_skipped": "import pytest\n\ndef test_a():\n    pytest.skip('needs a machine we lack')\n\n"
                   "@pytest.mark.skip(reason='not here')\ndef test_b():\n    pass\n",
    "one_ran": "import pytest\n\ndef test_a():\n    pass\n\ndef test_b():\n    pytest.skip('runs inside the VM')\n",
    "xfail_ran": "import pytest\n\n@pytest.mark.xfail(reason='known')\ndef test_a():\n    assert False\n",
    "failing": "def test_a():\n    assert False\n",
}


def _pytest(tmp_path: Path, test: str, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / f"test_{test}.py").write_text(TESTS[test])
    child_env = {k: v for k, v in os.environ.items() if k not in ("CI", "CI_ALLOWED_SKIPS", "PYTEST_ADDOPTS")}
    child_env.update(env, PYTHONPATH=str(REPO / "tests"))
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "conftest", "-p", "no:cacheprovider", "-q", "-rs",
                           *args, f"test_{test}.py"], cwd=tmp_path, env=child_env, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize(("test", "env", "code"), [
    ("all_skipped", {}, 0),                      # outside CI a skipped tier is only reported
    ("all_skipped", {"CI": "true"}, 1),          # under CI it fails
    ("one_ran", {"CI": "true"}, 0),
    ("xfail_ran", {"CI": "true"}, 0),            # an expected failure ran
    ("failing", {"CI": "true"}, 1),              # a failure stays a failure
])
def test_under_ci_a_tier_that_ran_nothing_fails(tmp_path: Path, test: str, env: dict[str, str], code: int) -> None:
    result = _pytest(tmp_path, test, env)
    assert result.returncode == code, result.stdout + result.stderr
    if test == "all_skipped" and code:
        assert "CI=true: no test ran (2 skipped)" in result.stdout


def test_collecting_only_runs_nothing_and_is_not_a_tier(tmp_path: Path) -> None:
    assert _pytest(tmp_path, "one_ran", {"CI": "true"}, "--collect-only").returncode == 0


def test_a_skip_reason_outside_the_runners_list_fails(tmp_path: Path) -> None:
    allowed = tmp_path / "allowed-skips.txt"
    allowed.write_text("# comment lines and blank lines are not patterns\n\n^runs inside the VM\n")
    ok = _pytest(tmp_path, "one_ran", {"CI": "true", "CI_ALLOWED_SKIPS": str(allowed)})
    assert ok.returncode == 0, ok.stdout + ok.stderr
    allowed.write_text("^needs root\n")
    bad = _pytest(tmp_path, "one_ran", {"CI": "true", "CI_ALLOWED_SKIPS": str(allowed)})
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert f"test_one_ran.py::test_b skipped: 'runs inside the VM' is not in {allowed}" in bad.stdout
    missing = _pytest(tmp_path, "one_ran", {"CI": "true", "CI_ALLOWED_SKIPS": str(tmp_path / "nowhere.txt")})
    assert missing.returncode == 1 and "cannot read it" in missing.stdout
    # the list is read only under CI
    assert _pytest(tmp_path, "one_ran", {"CI_ALLOWED_SKIPS": str(allowed)}).returncode == 0


def test_the_guest_gets_ci_and_the_allowed_list(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """virtme-ng passes no environment to the guest: without this, `make vm-test` under CI=true applied no rule."""
    from testbed.backends import vm

    monkeypatch.delenv("CI", raising=False)
    monkeypatch.delenv("CI_ALLOWED_SKIPS", raising=False)
    assert "CI=" not in vm.guest_script("pytest", tmp_path)
    monkeypatch.setenv("CI", "true")
    monkeypatch.setenv("CI_ALLOWED_SKIPS", ".github/allowed skips/vm.txt")
    script = vm.guest_script("pytest -m vm", tmp_path)
    exported = script.split(" && export ", 1)[1].split(" && ", 1)[0]
    assert " CI=true " in f" {exported} " and " CI_ALLOWED_SKIPS='.github/allowed skips/vm.txt'" in exported
    assert script.endswith(" && pytest -m vm")
