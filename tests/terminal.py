"""A command in a real terminal (tmux, a private server per test), stopped as users stop it: Ctrl-C typed
(send-keys C-c), the terminal closed (SIGHUP), or kill -TERM. The `terminal` fixture is registered in conftest."""

from __future__ import annotations

import os
import shlex
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from testbed.state import store as state

REPO = Path(__file__).resolve().parent.parent


class Terminal:
    """A command in its own tmux pane (a private tmux server per test), run by bash as a user's shell runs it:
    Ctrl-C reaches both, bash waits for the command and records its exit status."""

    def __init__(self, socket: str, session: str, argv: list[str], log: Path) -> None:
        self.socket, self.session, self.log = socket, session, log
        self.status_file = log.with_suffix(".status")
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in (("TESTBED_STATE_DIR", str(state.state_dir())),
                                                              ("PATH", os.environ["PATH"])))
        script = (f"cd {shlex.quote(str(REPO))} && env {env} {shlex.join(argv)} > {shlex.quote(str(log))} 2>&1; "
                  f"echo $? > {shlex.quote(str(self.status_file))}")
        self._tmux("new-session", "-d", "-s", session, "-x", "200", "-y", "50", shlex.join(["bash", "-c", script]))
        shell = int(self._tmux("display-message", "-p", "-t", session, "#{pane_pid}").strip())
        self.pid = _first_child(shell)

    def _tmux(self, *args: str) -> str:
        return subprocess.run(["tmux", "-L", self.socket, *args], capture_output=True, text=True, check=True).stdout

    def ctrl_c(self) -> None:
        self._tmux("send-keys", "-t", self.session, "C-c")

    def close(self) -> None:
        self._tmux("kill-session", "-t", self.session)

    def wait_exit(self, timeout_s: float = 90) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not Path(f"/proc/{self.pid}").exists() or _zombie(self.pid):
                return
            time.sleep(0.1)
        raise AssertionError(f"the command did not end within {timeout_s} s of the signal:\n{self.output()}")

    def status(self) -> int | None:
        """The command's exit status, as its shell recorded it."""
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.status_file.exists() and self.status_file.read_text().strip():
                return int(self.status_file.read_text())
            time.sleep(0.05)
        return None

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


def _first_child(pid: int, timeout_s: float = 10) -> int:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        if children:
            return int(children[0])
        time.sleep(0.01)
    raise AssertionError(f"the shell {pid} started no command")


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (FileNotFoundError, ProcessLookupError):      # gone between the look and the read (reaped)
        return True


@pytest.fixture
def terminal(tmp_path: Path) -> Iterator[Callable[[list[str]], Terminal]]:
    socket = f"tbtest{os.getpid()}-{abs(hash(str(tmp_path))) % 10**8}"     # one tmux server per test
    made: list[Terminal] = []

    def start(argv: list[str]) -> Terminal:
        made.append(Terminal(socket, f"t{len(made)}", argv, tmp_path / f"out-{len(made)}.log"))
        return made[-1]

    yield start
    subprocess.run(["tmux", "-L", socket, "kill-server"], capture_output=True)


def _wait_for(predicate: Callable[[], bool], what: str, term: Terminal, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.02)
    raise AssertionError(f"never reached {what}:\n{term.output()}")
