"""Interruption as users cause it: Ctrl-C typed in a real terminal (tmux send-keys C-c), the terminal closed
(tmux kill-session: the pty hangs up, SIGHUP), and `kill -TERM` (what timeout, CI and schedulers send), at
several points of `testbed run` and `testbed experiment`. Each must leave no namespace, state file or
process of its own behind, say why it stopped, and (experiment) keep what it measured."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import REPO, netns_with_prefix
from terminal import Terminal, _wait_for, _zombie

from testbed.state import store as state

pytestmark = [pytest.mark.root, pytest.mark.slow,
              pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux (make install: apt tmux)")]

SMALL = ["--microbatches", "4", "--layers", "2", "--width", "64", "--heads", "2", "--seq-len", "32"]


def _processes_mentioning(*needles: str) -> list[str]:
    """Command lines of live processes that mention one of these paths (a check only: nothing is killed)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmd = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except (FileNotFoundError, ProcessLookupError, PermissionError):
                continue
            if cmd.startswith("tmux "):              # the terminal itself (its server names the log file)
                continue
            if any(n in cmd for n in needles) and not _zombie(int(entry)):
                found.append(f"{entry}: {cmd[:160]}")
    return found


def _assert_nothing_left(name: str, results: Path) -> None:
    assert netns_with_prefix(f"tb-{name}-") == []
    assert not (state.state_dir() / f"{name}.json").exists()
    assert _processes_mentioning(str(results), str(state.state_dir() / name)) == []


POINTS = {
    "bring-up": lambda name, term: (state.state_dir() / f"{name}.json").exists(),
    "warm-up": lambda name, term: "running 1f1b" in term.output(),
    "a schedule": lambda name, term: "1f1b iteration 2:" in term.output(),
    "the other schedule": lambda name, term: "geopipe iteration 3:" in term.output(),   # interleaved with 1f1b
}
STOPS = {
    "SIGINT": (lambda term: term.ctrl_c(), 130),
    "SIGTERM": (lambda term: os.kill(term.pid, signal.SIGTERM), 143),
    "SIGHUP": (lambda term: term.close(), None),       # the terminal is gone: no status to read
}


@pytest.mark.parametrize("point", list(POINTS))
@pytest.mark.parametrize("stop", list(STOPS))
def test_run_stopped_at_any_point_leaves_nothing(stop: str, point: str, unique_name: str, tmp_path: Path,
                                                 terminal: Callable[[list[str]], Terminal]) -> None:
    results = tmp_path / "results"
    term = terminal([sys.executable, "-m", "testbed", "run", "2dc-1000km", "--name", unique_name, "--schedule",
                     "1f1b,geopipe", "--iterations", "6", "--results", str(results), *SMALL])
    _wait_for(lambda: POINTS[point](unique_name, term), point, term)
    send, code = STOPS[stop]
    send(term)
    term.wait_exit()
    if code is not None:
        assert term.status() == code, term.output()
        assert f"received {stop}; everything this command created was removed" in term.output()
    _assert_nothing_left(unique_name, results)


def test_experiment_stopped_keeps_its_points_and_resumes_to_the_full_table(
        unique_name: str, tmp_path: Path, terminal: Callable[[list[str]], Terminal]) -> None:
    results = tmp_path / "results"
    argv = [sys.executable, "-m", "testbed", "experiment", "--distances", "0,100", "--focus", "100", "--repetitions",
            "2", "--focus-schedule", "", "--memory-budgets", "", "--rates", "", "--microbatches", "4", "--iterations", "2",
            "--results", str(results)]
    term = terminal(argv)        # one launch: 2 distances x 1f1b, 1f1b-prefetch, geopipe; then a repetition at 100 km
    _wait_for(lambda: term.output().count("bubble ") >= 6, "the distance sweep's points", term, timeout_s=300)
    os.kill(term.pid, signal.SIGTERM)
    term.wait_exit()
    assert term.status() == 143, term.output()
    (exp_dir,) = results.iterdir()
    doc = json.loads((exp_dir / "summary.json").read_text())
    assert doc["partial"] and doc["stopped"] == "received SIGTERM" and len(doc["points"]) == 6
    assert len(doc["points"]) + len(doc["missing"]) == 9
    assert "PARTIAL" in (exp_dir / "report.md").read_text() and (exp_dir / "report.html").exists()
    report = subprocess.run([sys.executable, "-m", "testbed", "report", str(exp_dir)], capture_output=True, text=True,
                            cwd=REPO, timeout=120)
    assert report.returncode == 0 and "PARTIAL" in report.stdout
    assert netns_with_prefix("tb-exp") == [] and _processes_mentioning(str(results)) == []
    before = {p["label"] for p in doc["points"]}

    resumed = terminal([sys.executable, "-m", "testbed", "experiment", "--resume", str(exp_dir)])
    resumed.wait_exit(timeout_s=400)
    assert resumed.status() == 0, resumed.output()
    done = json.loads((exp_dir / "summary.json").read_text())
    assert not done["partial"] and done["missing"] == [] and done["resumed"] == 1
    assert len(done["points"]) == 9 and before <= {p["label"] for p in done["points"]}
    assert f"{len(doc['missing'])} to go" in " ".join(resumed.output().split())
    again = subprocess.run([sys.executable, "-m", "testbed", "experiment", "--resume", str(exp_dir)],
                           capture_output=True, text=True, cwd=REPO, timeout=120)
    assert again.returncode == 1 and "it is complete" in again.stderr


@pytest.mark.parametrize("stop", ["SIGINT", "SIGHUP"])
def test_experiment_stopped_by_ctrl_c_or_a_closed_terminal_keeps_its_points(
        stop: str, tmp_path: Path, terminal: Callable[[list[str]], Terminal]) -> None:
    results = tmp_path / "results"
    term = terminal([sys.executable, "-m", "testbed", "experiment", "--distances", "0,100", "--focus", "100",
                     "--repetitions", "2", "--focus-schedule", "", "--memory-budgets", "", "--rates", "", "--microbatches", "4",
                     "--iterations", "2", "--results", str(results)])
    _wait_for(lambda: "bubble " in term.output(), "a measured point", term, timeout_s=300)
    send, code = STOPS[stop]
    send(term)
    term.wait_exit()
    if code is not None:
        assert term.status() == code, term.output()
    (exp_dir,) = results.iterdir()
    doc = json.loads((exp_dir / "summary.json").read_text())
    assert doc["partial"] and doc["stopped"] == f"received {stop}" and doc["points"]
    assert (exp_dir / "report.md").exists()
    assert netns_with_prefix("tb-exp") == [] and _processes_mentioning(str(results)) == []


@pytest.mark.parametrize("stop", ["SIGINT", "SIGTERM"])
def test_dilated_run_stopped_removes_its_cgroups_and_restores_the_links(
        stop: str, unique_name: str, tmp_path: Path, terminal: Callable[[list[str]], Terminal]) -> None:
    """A dilated run on a testbed that stays up: stopped mid-run, its capped cgroups are gone and the links are
    back at their own delay and rate (not k times slower), with nothing in the state to restore."""
    from testbed.backends import cgroups

    try:
        root = cgroups.cpu_controller().root
    except cgroups.CgroupError as exc:
        pytest.skip(str(exc))
    subprocess.run([sys.executable, "-m", "testbed", "up", "2dc-1000km", "--name", unique_name, "--verify", "skip"],
                   check=True, cwd=REPO, capture_output=True, timeout=300)
    try:
        term = terminal([sys.executable, "-m", "testbed", "run", unique_name, "--schedule", "1f1b,geopipe",
                         "--iterations", "6", "--dilation", "auto", "--results", str(tmp_path / "results"), *SMALL])
        _wait_for(lambda: "1f1b iteration 2:" in term.output() and list(root.glob(f"testbed-{unique_name}-w*")),
                  "a dilated schedule", term)
        assert "time dilation k = " in term.output()
        send, code = STOPS[stop]
        send(term)
        term.wait_exit()
        assert term.status() == code, term.output()
        assert list(root.glob(f"testbed-{unique_name}-*")) == []
        doc = json.loads((state.state_dir() / f"{unique_name}.json").read_text())
        assert doc["cgroups"] == [] and doc["undilated"] == []
        assert {d["delay_s"] for d in doc["plan"]["directions"]} == {0.005}
        assert {d["rate_bps"] for d in doc["plan"]["directions"]} == {1e9}
        assert [p for p in doc["processes"] if p["role"] == "worker"] == []
    finally:
        subprocess.run([sys.executable, "-m", "testbed", "down", unique_name], cwd=REPO, capture_output=True, timeout=120)
    _assert_nothing_left(unique_name, tmp_path / "results")


@pytest.mark.mininet
def test_mininet_run_stopped_leaves_no_root_namespace_links(unique_name: str, tmp_path: Path,
                                                            terminal: Callable[[list[str]], Terminal]) -> None:
    from pyroute2 import IPRoute

    with IPRoute() as root:
        before = {link.get("IFLA_IFNAME") for link in root.get_links()}
    results = tmp_path / "results"
    term = terminal([sys.executable, "-m", "testbed", "run", "2dc-1000km", "--name", unique_name, "--backend", "mininet",
                     "--schedule", "1f1b,geopipe", "--iterations", "6", "--results", str(results), *SMALL])
    _wait_for(lambda: POINTS["a schedule"](unique_name, term), "a schedule", term)
    os.kill(term.pid, signal.SIGTERM)
    term.wait_exit()
    assert term.status() == 143, term.output()
    _assert_nothing_left(unique_name, results)
    with IPRoute() as root:
        assert {link.get("IFLA_IFNAME") for link in root.get_links()} == before
