"""One delay line installed where it runs: its configuration file, its supervised daemon, its NFQUEUE rules and
its counters. The single machine's shaper (`delayline_shaper`: one per receiving router, in its namespace) and
each remote machine's agent (`testbed.remote.hostshape`: one on the machine itself) both install through here.

What differs between the two is a parameter, each for a reason:

- the `Place`: a router's namespace is entered through the backend (`NodePlace`); an agent runs on the machine
  it shapes (`ThisMachine`);
- the rules' selectors (`nfqueue_rule`): a router's OTN interface carries one link, so `-i IFNAME` selects it; a
  machine's NIC carries every DC's traffic and other users' too, so each rule selects one source address and
  carries the testbed's comment (its `remove` deletes exactly those);
- what is recorded as it is installed (`DelayLineInstall.start`'s `started`): the testbed's state file or the
  agent's.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from testbed.backends import nsfs
from testbed.shaping import nfqueue
from testbed.shaping.base import ShaperError
from testbed.shaping.delayline import DaemonConfig, DaemonStats, QueueConfig, Timing
from testbed.shaping.otn_edge import EdgeConfig
from testbed.shaping.supervisor import SupervisorStatus

if TYPE_CHECKING:
    from testbed.backends.base import Backend

READY_TIMEOUT_S = 60.0
"""How long a daemon may take to write its first statistics (its sign of ready): seconds under QEMU's TCG."""
DELIVERED_COMMENT = "tb-delivered"


class Place(Protocol):
    """Where a delay line runs and its rules live."""

    @property
    def name(self) -> str: ...

    def run(self, argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
        """Run a command there to completion, its output captured as text."""
        ...

    def popen(self, argv: Sequence[str], **kwargs: Any) -> subprocess.Popen[Any]:
        """Start a process there."""
        ...

    def read_proc(self, path: str) -> str:
        """A file under /proc/thread-self/ as seen there ('' where it does not exist)."""
        ...


@dataclass(frozen=True, slots=True)
class NodePlace:
    """A node of this machine's testbed: a receiving router's namespace."""

    backend: Backend
    node: str

    @property
    def name(self) -> str:
        return self.node

    def run(self, argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
        return self.backend.exec(self.node, list(argv), capture_output=True, text=True)

    def popen(self, argv: Sequence[str], **kwargs: Any) -> subprocess.Popen[Any]:
        return self.backend.popen(self.node, list(argv), **kwargs)

    def read_proc(self, path: str) -> str:
        with nsfs.entered(self.backend.netns_path(self.node)):
            return _read(Path("/proc/thread-self") / path)


@dataclass(frozen=True, slots=True)
class ThisMachine:
    """The machine this process runs on, in its own namespace: a remote machine, shaped by its agent."""

    name: str

    def run(self, argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run(list(argv), capture_output=True, text=True)

    def popen(self, argv: Sequence[str], **kwargs: Any) -> subprocess.Popen[Any]:
        return subprocess.Popen(list(argv), **kwargs)

    def read_proc(self, path: str) -> str:
        return _read(Path("/proc/thread-self") / path)


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except FileNotFoundError:
        return ""


class DaemonFilesLike(Protocol):
    """The files of one daemon (`testbed.state.records.DaemonFiles`, the agent's `DelayLineFiles`)."""

    @property
    def config(self) -> str: ...

    @property
    def stats(self) -> str: ...

    @property
    def status(self) -> str: ...

    @property
    def log(self) -> str: ...


# -- configuration ---------------------------------------------------------------------------------


def hold(queue: int, ifname: str, delay_s: float, subtract_s: float, *, rate_bps: float, mtu: int, maxlen: int,
         jitter_s: float = 0.0, loss: float = 0.0, edge: EdgeConfig | None = None) -> QueueConfig:
    """One queue of a delay line: each packet held `delay_s` less `subtract_s` (the path's own latency, which
    the calibration measured; never below zero), plus its own serialization time at `rate_bps` (the daemon adds
    it per packet from its length and `mtu`), `maxlen` packets at most."""
    return QueueConfig(queue=queue, ifname=ifname, delay_s=max(0.0, delay_s - subtract_s), jitter_s=jitter_s,
                       loss=loss, maxlen=maxlen, rate_bps=rate_bps, mtu=mtu, edge=edge)


# -- iptables ----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class IptablesRule:
    """One rule: added with -A, deleted by the same match with -D."""

    table: str
    chain: str
    match: tuple[str, ...]

    def args(self, op: str) -> list[str]:
        return ["-t", self.table, op, self.chain, *self.match]

    @property
    def spec(self) -> str:
        """The rule as `iptables -S` lists it."""
        return " ".join(["-A", self.chain, *self.match])

    @classmethod
    def from_json(cls, data: dict[str, Any] | list[str]) -> IptablesRule:
        if isinstance(data, list):            # an older agent's state file: ["-t", table, chain, match...]
            return cls(data[1], data[2], tuple(data[3:]))
        return cls(data["table"], data["chain"], tuple(data["match"]))


def nfqueue_rule(queue: int, *select: str) -> IptablesRule:
    """The packets `select` matches (on arrival: raw PREROUTING) go to queue `queue`. No --queue-bypass: a dead
    daemon stops the link's traffic (loud) instead of letting it through undelayed (silent)."""
    return IptablesRule("raw", "PREROUTING", (*select, "-j", "NFQUEUE", "--queue-num", str(queue)))


def delivered_rule(ifname: str) -> IptablesRule:
    """A counting rule (no target) where packets the delay line accepted arrive next: mangle PREROUTING."""
    return IptablesRule("mangle", "PREROUTING", ("-i", ifname, "-m", "comment", "--comment", DELIVERED_COMMENT))


def rule_packets(listing: str, ifname: str, marker: str) -> int | None:
    """The packet counter of the rule on `-i ifname` that contains `marker`, from `iptables -S -v` output."""
    for line in listing.splitlines():
        words = line.split()
        if line.startswith("-A ") and marker in line and words[words.index("-i") + 1:][:1] == [ifname]:
            return int(words[words.index("-c") + 1])
    return None


def iptables_binary() -> str | None:
    return shutil.which("iptables")


def iptables(place: Place, args: list[str], check: bool = True) -> int:
    """`iptables -w ARGS` at `place`; a refusal raises unless `check` is off (its exit status is returned)."""
    result = place.run([iptables_binary() or "iptables", "-w", *args])
    if check and result.returncode != 0:
        raise ShaperError(f"iptables on {place.name} refused {' '.join(args)}: {result.stderr.strip()}")
    return result.returncode


def listing(place: Place, table: str, counters: bool = False) -> str:
    """`iptables -S PREROUTING` of `table` at `place` (with packet counters: -v)."""
    return place.run([iptables_binary() or "iptables", "-w", "-t", table, "-S", "PREROUTING",
                      *(["-v"] if counters else [])]).stdout


def queue_counters(place: Place) -> dict[int, nfqueue.QueueCounters]:
    """The kernel's counters of every NFQUEUE queue at `place` (queue full, listener socket full)."""
    return nfqueue.parse_proc(place.read_proc("net/netfilter/nfnetlink_queue"))


# -- the daemon --------------------------------------------------------------------------------------


def write_config(path: Path, queues: list[QueueConfig], timing: Timing | None = None) -> int:
    """A new generation of a daemon's configuration, written whole and then renamed over the old; the timing
    stays as it was unless given. Returns the generation (the daemon reports it once it has taken it)."""
    old = DaemonConfig.from_json(json.loads(path.read_text())) if path.exists() else None
    config = DaemonConfig(old.generation + 1 if old else 0, queues, timing or (old.timing if old else Timing()))
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(config.to_json(), indent=1))
    os.replace(tmp, path)
    return config.generation


def package_root() -> str:
    return str(Path(__file__).resolve().parent.parent.parent)


class DelayLineInstall:
    """One delay line's daemon (under its supervisor) and rules at `place`, its files `files`."""

    def __init__(self, place: Place, files: DaemonFilesLike) -> None:
        self.place, self.files = place, files

    def config(self) -> DaemonConfig:
        return DaemonConfig.from_json(json.loads(Path(self.files.config).read_text()))

    def configure(self, queues: list[QueueConfig], timing: Timing | None = None) -> int:
        """A new generation of the configuration (`write_config`); returns the generation."""
        return write_config(Path(self.files.config), queues, timing)

    def start(self, started: Callable[[int], None]) -> None:
        """Start the supervised daemon on the configuration written; `started` records its pid (before the wait:
        a daemon that never gets ready is still stopped by teardown); returns once it is ready."""
        stats, log = Path(self.files.stats), Path(self.files.log)
        stats.unlink(missing_ok=True)
        with open(log, "ab") as logf:
            proc = self.place.popen([sys.executable, "-m", "testbed.shaping.supervisor", self.files.config,
                                     self.files.stats, self.files.status],
                                    stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True, env={**os.environ, "PYTHONPATH": package_root()})
        started(proc.pid)
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise ShaperError(f"delay daemon on {self.place.name} exited with {proc.returncode}: "
                                  f"{_tail(log)}", hint=f"its log is {log}")
            if stats.exists():
                return
            time.sleep(0.01)
        raise ShaperError(f"delay daemon on {self.place.name} did not become ready in {READY_TIMEOUT_S:.0f} s",
                          hint=f"its log is {log}")

    def reload(self, pid: int) -> None:
        """SIGHUP the supervisor `pid` (it passes it on) and wait until the daemon reports the configuration
        file's generation."""
        generation = self.config().generation
        os.kill(pid, signal.SIGHUP)
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            stats = self.stats()
            if stats and stats.generation >= generation:
                return
            time.sleep(0.005)
        raise ShaperError(f"delay daemon on {self.place.name} did not take its new configuration",
                          hint=f"its log is {self.files.log}")

    # -- counters ----------------------------------------------------------------------------------
    def stats(self) -> DaemonStats | None:
        """The daemon's own statistics (at most STATS_INTERVAL_S old), None while it has written none."""
        try:
            return DaemonStats.from_json(json.loads(Path(self.files.stats).read_text()))
        except (FileNotFoundError, json.JSONDecodeError):
            return None

    def supervisor(self) -> SupervisorStatus | None:
        """The supervisor's record of the daemon's deaths and restarts."""
        if not self.files.status:
            return None
        try:
            return SupervisorStatus.from_json(json.loads(Path(self.files.status).read_text()))
        except (FileNotFoundError, json.JSONDecodeError):
            return None

    def holds(self, queue: int, stats: DaemonStats | None = None) -> tuple[int, float] | None:
        """Queue `queue`'s packets released so far and the sum of their release error (seconds, release time
        less due time); None where the daemon has not reported the queue."""
        stats = stats or self.stats()
        q = stats.queues.get(queue) if stats else None
        return None if q is None else (q.released, q.error_us_sum / 1e6)

    # -- rules -------------------------------------------------------------------------------------
    def add(self, rule: IptablesRule) -> None:
        iptables(self.place, rule.args("-A"))

    def delete(self, rule: IptablesRule, check: bool = True) -> bool:
        """Delete `rule`; False where it was not there (and `check` is off)."""
        return iptables(self.place, rule.args("-D"), check) == 0


def _tail(log: Path) -> str:
    return _read(log)[-800:].strip()
