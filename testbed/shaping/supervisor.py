"""Keeps one delay-line daemon running: `python -m testbed.shaping.supervisor CONFIG STATS STATUS`.

Runs in the receiving router's namespace as the daemon's parent. A daemon that dies (crash, kill -9) is
started again after RESTART_DELAY_S with the same configuration file, so it binds the same queues with the
same holds; every death is recorded in STATUS (JSON) with its time, how it ended and how long the link had
no listener. The daemon ends with its supervisor. SIGHUP (reload) is passed on; SIGTERM/SIGINT stop the
daemon gracefully (it releases what it holds) and then the supervisor. A daemon that keeps dying
(MAX_RESTARTS within RESTART_WINDOW_S) is given up: the supervisor exits non-zero and `status` reports the
link dead. Import-light, like the daemon.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

PR_SET_PDEATHSIG = 1
RESTART_DELAY_S = 0.05
MAX_RESTARTS = 5
RESTART_WINDOW_S = 60.0


@dataclass(slots=True)
class Death:
    """One end of a daemon the supervisor did not ask for."""

    at: float
    """Wall-clock time (epoch seconds)."""
    how: str
    """`exit 1`, `signal SIGKILL`, ..."""
    gap_s: float
    """How long the link had no listener: from the death being seen to the new daemon being ready."""


@dataclass(slots=True)
class SupervisorStatus:
    """The supervisor's STATUS file."""

    supervisor_pid: int
    daemon_pid: int | None = None
    restarts: int = 0
    deaths: list[Death] = field(default_factory=list)
    gave_up: bool = False

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SupervisorStatus:
        return cls(**{**data, "deaths": [Death(**d) for d in data.get("deaths", [])]})


def _end_with_parent() -> None:
    """In the daemon: SIGTERM when the supervisor dies, so no daemon runs on unsupervised (it releases what it
    holds and exits; the link then stops, loudly, until the testbed is brought up again)."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def _how(code: int) -> str:
    return f"signal {signal.Signals(-code).name}" if code < 0 else f"exit {code}"


class Supervisor:
    def __init__(self, config: Path, stats: Path, status: Path) -> None:
        self.config, self.stats, self.status_path = config, stats, status
        self.status = SupervisorStatus(supervisor_pid=os.getpid())
        self.child: subprocess.Popen[bytes] | None = None
        self.stopping = False

    def save(self) -> None:
        tmp = self.status_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.status.to_json()))
        os.replace(tmp, self.status_path)

    def start_daemon(self) -> None:
        self.stats.unlink(missing_ok=True)
        self.child = subprocess.Popen([sys.executable, "-m", "testbed.shaping.delayline", str(self.config),
                                       str(self.stats)], stdin=subprocess.DEVNULL, preexec_fn=_end_with_parent)
        self.status.daemon_pid = self.child.pid
        self.save()

    def wait_ready(self, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and not self.stats.exists():
            if self.child is None or self.child.poll() is not None:
                return
            time.sleep(0.002)

    def forward(self, signum: int) -> None:
        if self.child is not None and self.child.poll() is None:
            os.kill(self.child.pid, signum)

    def run(self) -> int:
        self.start_daemon()
        while True:
            assert self.child is not None
            code = self.child.wait()
            if self.stopping:
                return 0
            seen = time.monotonic()
            recent = [d for d in self.status.deaths if d.at > time.time() - RESTART_WINDOW_S]
            if len(recent) >= MAX_RESTARTS:
                self.status.gave_up = True
                self.status.deaths.append(Death(time.time(), _how(code), float("inf")))
                self.save()
                print(f"supervisor: the delay daemon died {MAX_RESTARTS + 1} times in {RESTART_WINDOW_S:.0f} s "
                      f"({_how(code)}); giving up", file=sys.stderr, flush=True)
                return 1
            print(f"supervisor: the delay daemon ended ({_how(code)}); starting it again", file=sys.stderr,
                  flush=True)
            time.sleep(RESTART_DELAY_S)
            if self.stopping:
                return 0
            self.start_daemon()
            self.wait_ready()
            self.status.restarts += 1
            self.status.deaths.append(Death(time.time(), _how(code), time.monotonic() - seen))
            self.save()


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    sup = Supervisor(Path(argv[0]), Path(argv[1]), Path(argv[2]))

    def stop(signum: int, _frame: object) -> None:
        sup.stopping = True
        sup.forward(signal.SIGTERM)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGHUP, lambda signum, _frame: sup.forward(signum))
    return sup.run()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
