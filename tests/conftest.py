"""Shared fixtures. Tiers: unit (no root), `root` (namespaces), `vm`, `mininet`, `multihost`, `slow`."""

from __future__ import annotations

import os
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
