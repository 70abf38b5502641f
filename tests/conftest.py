"""Shared fixtures. Tiers: unit (no root), `root` (namespaces), `vm`, `mininet`, `multihost`, `slow`."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from terminal import terminal  # noqa: F401 - the real-terminal fixture, for every tier

REPO = Path(__file__).resolve().parent.parent
IS_ROOT = os.geteuid() == 0


def mininet_problem() -> str | None:
    """Why the mininet tier cannot run here (None: it can): root, the package, and Python importing it (Ubuntu
    24.04's mininet imports distutils, gone from its Python 3.12; 22.04's is built for 3.10, not the venv's 3.11)."""
    if not IS_ROOT:
        return "needs root"
    if shutil.which("mnexec") is None:
        return "the distribution's mininet package is not installed"
    try:
        import mininet.net  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - any import failure is the reason
        return f"mininet does not import in Python {sys.version.split()[0]}: {type(exc).__name__}: {exc}"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    mininet = mininet_problem() if any("mininet" in item.keywords for item in items) else None
    for item in items:
        if "root" in item.keywords and not IS_ROOT:
            item.add_marker(pytest.mark.skip(reason="needs root for network namespaces"))
        if "mininet" in item.keywords and mininet:
            item.add_marker(pytest.mark.skip(reason=mininet))
        if "multihost" in item.keywords and (not IS_ROOT or not os.path.exists("/usr/sbin/sshd")):
            item.add_marker(pytest.mark.skip(reason="needs root and Debian's openssh-server (make install adds it)"))


@pytest.fixture(autouse=True)
def _private_state_dir(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests keep their state files apart from a user's /run/testbed."""
    monkeypatch.setenv("TESTBED_STATE_DIR", str(tmp_path_factory.getbasetemp() / "state"))


@pytest.fixture
def testbed_cli() -> list[str]:
    return [sys.executable, "-m", "testbed"]


def run_cli(*args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run the CLI as a user would, in a child process."""
    result = subprocess.run([sys.executable, "-m", "testbed", *args], capture_output=True, text=True,
                            timeout=timeout, cwd=REPO, env=os.environ.copy())
    if check and result.returncode != 0:
        raise AssertionError(f"testbed {' '.join(args)} exited {result.returncode}:\n{result.stdout}\n{result.stderr}")
    return result


def fixture_expectation(path: Path) -> tuple[str, str, str]:
    """A bad fixture's first line: `# expect: KEYPATH | PROBLEM | FIX` (the error it must produce)."""
    first = path.read_text().splitlines()[0]
    assert first.startswith("# expect:"), f"{path} must start with '# expect: KEYPATH | PROBLEM | FIX'"
    key, problem, fix = (part.strip() for part in first.removeprefix("# expect:").split("|"))
    return key, problem, fix


def assert_precise_error(path: Path, load: object, error: type) -> None:
    """Loading a bad fixture raises `error` with the problem its first line expects (file, key path, fix)."""
    key, problem, fix = fixture_expectation(path)
    with pytest.raises(error) as err:
        load(path)  # type: ignore[operator]
    matching = [p for p in err.value.problems if p.path == key and problem in p.problem and fix in p.fix]
    assert matching, f"wanted {key!r}: ...{problem}...; ...{fix}...\ngot:\n{err.value}"
    assert str(path) in str(err.value)


def no_rdma_here(topology: Path) -> list[str]:
    """`--rdma none` for a topology that asks for SoftRoCE on a kernel where rxe cannot run in namespaces (its
    namespaces, links and routes are still tested; tests/test_vm_rdma.py covers the devices)."""
    from testbed.rdma.support import rxe_in_namespaces
    from testbed.topology import load_topology

    return ["--rdma", "none"] if load_topology(topology).rdma != "none" and not rxe_in_namespaces().ok else []


def netns_with_prefix(prefix: str) -> list[str]:
    try:
        return sorted(n for n in os.listdir("/run/netns") if n.startswith(prefix))
    except FileNotFoundError:
        return []


BACKEND_PARAMS = ["netns", pytest.param("mininet", marks=pytest.mark.mininet)]
"""Parametrize a root-tier test over both backends (the Mininet case skips only where Mininet is absent)."""


@pytest.fixture
def unique_name(request: pytest.FixtureRequest) -> Iterator[str]:
    """A testbed name unique to this test; anything left under it is removed afterwards and fails the test."""
    name = f"t{os.getpid() % 10000}-{abs(hash(request.node.nodeid)) % 100000}"
    yield name
    leftovers = netns_with_prefix(f"tb-{name}-")
    if leftovers:
        run_cli("down", name, check=False)
        for ns in netns_with_prefix(f"tb-{name}-"):
            subprocess.run(["ip", "netns", "del", ns], check=False)
        pytest.fail(f"test left namespaces behind: {leftovers}")


# Under CI (CI=true) a tier must not pass by running nothing: one where no test ran (all skipped, none collected)
# fails. Where CI_ALLOWED_SKIPS names a file (one regular expression a line, searched in the skip's reason; `#`
# comments), a test skipped for a reason no line matches fails it too: the workflow sets one per runner and tier.
CI_ALLOWED_SKIPS = "CI_ALLOWED_SKIPS"


class CiGate:
    def __init__(self, allowed_file: str | None) -> None:
        self.allowed_file = allowed_file
        self.ran = 0
        self.skips: list[tuple[str, str]] = []
        self.problems: list[str] = []

    def allowed(self) -> list[re.Pattern[str]] | None:
        if not self.allowed_file:
            return None
        try:
            lines = Path(self.allowed_file).read_text().splitlines()
        except OSError as exc:
            self.problems.append(f"{CI_ALLOWED_SKIPS}={self.allowed_file}: cannot read it ({exc})")
            return []
        return [re.compile(line.strip()) for line in lines if line.strip() and not line.lstrip().startswith("#")]

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when == "call" and (not report.skipped or hasattr(report, "wasxfail")):
            self.ran += 1
        elif report.skipped and not hasattr(report, "wasxfail"):
            reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
            self.skips.append((report.nodeid, reason.removeprefix("Skipped: ")))

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if self.ran == 0:
            self.problems.append(f"no test ran ({len(self.skips)} skipped): a tier that runs nothing does not pass")
        allowed = self.allowed()
        if allowed is not None:
            self.problems += [f"{nodeid} skipped: {reason!r} is not in {self.allowed_file}"
                              for nodeid, reason in self.skips if not any(p.search(reason) for p in allowed)]
        if self.problems and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        for problem in self.problems:
            terminalreporter.write_line(f"CI=true: {problem}", red=True, bold=True)


def pytest_configure(config: pytest.Config) -> None:
    if os.environ.get("CI") == "true" and not config.getoption("collectonly", False):
        config.pluginmanager.register(CiGate(os.environ.get(CI_ALLOWED_SKIPS) or None), "ci-gate")
