"""The controller's side of several machines: one SSH session and the facts found on each, a step run on all of
them in parallel (one line per machine, failures named together), the agent's typed replies, and the steps that
only concern the machines themselves: preflight, provision, teardown."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

from testbed.errors import TestbedError
from testbed.remote.inventory import Inventory, Machine
from testbed.remote.replies import EnvReply, RemovedReply
from testbed.remote.ssh import RemoteError, Session
from testbed.util.paths import REPO_ROOT

T = TypeVar("T")


class FromJson(Protocol):
    """A typed reply: an agent Reply, or the RDMA probe's ProbeResult."""

    @classmethod
    def from_json(cls: type[T], data: dict[str, Any]) -> T: ...


R = TypeVar("R", bound=FromJson)
CLOCK_SAMPLES = 8
TORCH_IMPORT_S = 600
"""Bound on a command that imports torch (preflight's Python probe, `env`): seconds natively, minutes for three
machines at once in a TCG guest. Only a failure waits this long."""


class CycleError(TestbedError, RuntimeError):
    """A step failed on one or more machines (each named)."""


@dataclass(slots=True)
class HostFacts:
    """What preflight and provisioning found on one machine (results/<run>/hosts/<name>.json)."""

    name: str
    dc: str
    login: str
    uid: int = -1
    kernel: str = ""
    home: str = ""
    python: str = ""
    torch: str | None = None
    clock_offset_s: float = 0.0
    """Its clock minus the controller's, from one `date` round trip (± clock_uncertainty_s)."""
    clock_uncertainty_s: float = 0.0
    env: EnvReply = field(default_factory=EnvReply)
    """The agent's `env` (shaper the kernel allows, rxe, CPUs, boot id, package path)."""
    project: str = ""
    shaper: str | None = None


@dataclass
class Fleet:
    """One inventory's machines under one testbed name, their SSH sessions and what was found on them."""

    inventory: Inventory
    testbed: str
    log: Callable[[str], None] = field(default=print, kw_only=True)
    sessions: dict[str, Session] = field(default_factory=dict, kw_only=True)
    facts: dict[str, HostFacts] = field(default_factory=dict, kw_only=True)
    step_s: dict[str, float] = field(default_factory=dict, kw_only=True)
    """Seconds per step, summed over its calls."""
    tree_id: str = field(default="", kw_only=True)

    def each(self, step: str, work: Callable[[Machine], str], machines: Iterable[Machine] | None = None,
             stop: bool = True) -> list[RemoteError]:
        """`work` on every machine in parallel; one line per machine; the failures raised together (or returned)."""
        machines = list(self.inventory.machines if machines is None else machines)
        start = time.monotonic()
        failures: list[RemoteError] = []
        with ThreadPoolExecutor(max_workers=max(1, len(machines))) as pool:
            futures = {m.name: pool.submit(_guard, work, m) for m in machines}
            for name, future in futures.items():
                error, detail = future.result()
                if error:
                    failures.append(error)
                    self.log(f"  {step:<9} {name}: FAILED {str(error).removeprefix(name + ': ')}")
                else:
                    self.log(f"  {step:<9} {name}: {detail}")
        self.step_s[step] = self.step_s.get(step, 0.0) + time.monotonic() - start
        if failures and stop:
            raise CycleError(f"{step} failed on {', '.join(e.machine for e in failures)}:\n"
                             + "\n".join(f"  {e}" for e in failures))
        return failures

    def agent(self, m: Machine, reply: type[R], *args: str, root: bool = False, timeout_s: float = 120) -> R:
        """One agent command on `m` (testbed/remote/agent.py); its JSON line read back as `reply`."""
        facts = self.facts[m.name]
        return reply.from_json(self.sessions[m.name].json(["env", f"PYTHONPATH={facts.project}", facts.python, "-m",
                                                           "testbed.remote.agent", *args], root=root,
                                                          timeout_s=timeout_s))

    def agent_channel(self, m: Machine, *args: str, root: bool = False) -> Any:
        """An agent command left running on `m` (its stdout read line by line with `read_line`)."""
        facts = self.facts[m.name]
        return self.sessions[m.name].start(["env", f"PYTHONPATH={facts.project}", facts.python, "-m",
                                            "testbed.remote.agent", *args], root=root, pty=False)

    def workdir(self, m: Machine) -> str:
        home = self.facts[m.name].home
        return home + m.workdir[1:] if m.workdir.startswith("~") else m.workdir

    def first_per_dc(self) -> dict[str, Machine]:
        firsts: dict[str, Machine] = {}
        for m in self.inventory.machines:
            firsts.setdefault(m.dc, m)
        return firsts

    def close(self) -> None:
        for session in self.sessions.values():
            session.close()
        self.sessions.clear()

    def preflight(self) -> None:
        """SSH (host keys checked), root or sudo, kernel, Python and torch, the clock's offset."""
        self.log(f"preflight: {len(self.inventory.machines)} machines of {self.inventory.topology.name}")

        def check(m: Machine) -> str:
            if m.name not in self.sessions:
                self.sessions[m.name] = Session(m, self.inventory.known_hosts)
            session = self.sessions[m.name]
            facts = self.facts.setdefault(m.name, HostFacts(m.name, m.dc, m.login))
            facts.uid = int(session.run(["id", "-u"]).stdout.strip())
            if facts.uid != 0 and session.run(["sudo", "-n", "true"], check=False).code != 0:
                raise RemoteError(m.name, f"{m.user} is not root and has no passwordless sudo: shaping needs root")
            facts.kernel = session.run(["uname", "-r"]).stdout.strip()
            facts.home = session.run(["printenv", "HOME"]).stdout.strip()
            facts.python = m.python or "python3"
            facts.clock_offset_s, facts.clock_uncertainty_s = _clock_offset(session, facts.python)
            probe = session.run([facts.python, "-c", "import sys, json\ntry:\n import torch; v = torch.__version__\n"
                                 "except ImportError:\n v = None\nprint(json.dumps([sys.version.split()[0], v]))"],
                                check=False, timeout_s=TORCH_IMPORT_S)
            if probe.code != 0:
                raise RemoteError(m.name, f"{facts.python} does not run (exit {probe.code}"
                                  + (f", killed by signal {probe.code - 128}" if probe.code > 128 else "")
                                  + (f": no exit status within {TORCH_IMPORT_S} s" if probe.code < 0 else "")
                                  + f"): {probe.stderr.strip()[-300:]} "
                                  "(inventory key python, or install python3)")
            version, facts.torch = json.loads(probe.stdout.strip().splitlines()[-1])
            return (f"{'root' if facts.uid == 0 else 'sudo'}, kernel {facts.kernel}, python {version}, "
                    f"torch {facts.torch or 'missing (provision installs it)'}, clock "
                    f"{facts.clock_offset_s * 1e3:+.1f} ms ± {facts.clock_uncertainty_s * 1e3:.1f} ms")

        self.each("preflight", check)

    def provision(self) -> None:
        """The project at this working tree's state in <workdir>/<tree id>, a venv where the inventory names no
        python, then the agent's `env` (the doctor: shaper this kernel allows, rxe)."""
        archive = self._archive()

        def install(m: Machine) -> str:
            session, facts = self.sessions[m.name], self.facts[m.name]
            target = f"{self.workdir(m)}/{self.tree_id}"
            present = session.run(["test", "-f", f"{target}/.complete"], check=False).code == 0
            if not present:
                session.run(["mkdir", "-p", target])
                session.put(archive, f"{target}.tar")
                session.run(["tar", "-xf", f"{target}.tar", "-C", target])
                session.run(["rm", "-f", f"{target}.tar"])
                session.run(["touch", f"{target}/.complete"])
            facts.project = target
            if not m.python:
                venv = f"{self.workdir(m)}/venv"
                if session.run(["test", "-x", f"{venv}/bin/python"], check=False).code != 0:
                    session.run(["python3", "-m", "venv", "--system-site-packages", venv], timeout_s=300)
                    session.run([f"{venv}/bin/pip", "install", "-q", f"{target}[train]"], timeout_s=1800)
                facts.python = f"{venv}/bin/python"
            # torch is imported only where preflight did not already import it with this interpreter (its import
            # is the slow one: minutes for three machines at once in a TCG guest)
            modules = ["yaml", "pyroute2", "fabric"] if facts.torch and facts.python == (m.python or "python3") \
                else ["torch", "yaml", "pyroute2", "fabric"]
            missing = session.run(["env", f"PYTHONPATH={target}", facts.python, "-c", f"import {', '.join(modules)}"],
                                  check=False, timeout_s=TORCH_IMPORT_S)
            if missing.code < 0:
                raise RemoteError(m.name, f"{facts.python} did not finish importing {', '.join(modules)} "
                                  f"within {TORCH_IMPORT_S} s")
            if missing.code != 0:
                raise RemoteError(m.name, f"{facts.python} lacks a dependency: {missing.stderr.strip()[-200:]}; "
                                  "install torch, PyYAML, pyroute2 and fabric there (or drop key python to get a venv)")
            facts.env = self.agent(m, EnvReply, "env", root=True, timeout_s=TORCH_IMPORT_S)
            facts.shaper = facts.env.shaper
            return (f"{'present' if present else 'copied'} {self.tree_id}, {facts.python}, shaper "
                    f"{facts.shaper}, rxe {'no (' + facts.env.rdma + ')' if facts.env.rdma else 'yes'}, {facts.env.cpus} CPUs")

        self.each("provision", install)

    def _archive(self) -> Path:
        """The project as it is in the working tree (tracked and new files that git does not ignore)."""
        files = subprocess.run(["git", "-C", str(REPO_ROOT), "ls-files", "-z", "--cached", "--others",
                                "--exclude-standard"], capture_output=True, check=True).stdout.split(b"\0")
        commit = subprocess.run(["git", "-C", str(REPO_ROOT), "rev-parse", "--short=12", "HEAD"], capture_output=True,
                                text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(REPO_ROOT), "status", "--porcelain"], capture_output=True,
                               text=True, check=True).stdout.strip()
        digest = hashlib.sha256()
        names = sorted(f.decode() for f in files if f and (REPO_ROOT / f.decode()).is_file())
        for name in names:
            digest.update(name.encode() + b"\0" + (REPO_ROOT / name).read_bytes())
        self.tree_id = commit + (f"-dirty-{digest.hexdigest()[:8]}" if dirty else "")
        archive = Path(tempfile.gettempdir()) / f"geo-testbed-{self.tree_id}.tar"
        if not archive.exists():
            tmp = archive.with_suffix(f".{os.getpid()}.tmp")
            with tarfile.open(tmp, "w") as tar:
                for name in names:
                    tar.add(REPO_ROOT / name, arcname=name, recursive=False)
            os.replace(tmp, archive)
        return archive

    def teardown(self) -> list[RemoteError]:
        """On every machine that answers: stop this testbed's workers, remove its shaping and run folders."""
        self.log("teardown")

        def clean(m: Machine) -> str:
            if m.name not in self.sessions:
                return "not reached: nothing was set up there"
            facts = self.facts.get(m.name)
            if facts is None or not facts.project:
                return "nothing set up"
            removed = self.agent(m, RemovedReply, "unshape", self.testbed, m.name, root=True).removed
            workdir = self.workdir(m)
            self.sessions[m.name].run(["rm", "-rf", "--", f"{workdir}/runs", f"{workdir}/{self.testbed}.{m.name}.shape.json"])
            return f"removed {len(removed)} item(s)" + (f": {', '.join(removed)}" if removed else "")

        return self.each("teardown", clean, stop=False)


def _guard(work: Callable[[Machine], str], machine: Machine) -> tuple[RemoteError | None, str]:
    try:
        return None, work(machine)
    except RemoteError as exc:
        return exc, ""
    except Exception as exc:  # noqa: BLE001 - any failure is this machine's, named
        return RemoteError(machine.name, f"{type(exc).__name__}: {exc}"), ""


def read_line(channel: Any, machine: str, timeout_s: float) -> str:
    """One line from a channel's stdout (blocking, so a reply is seen the moment it lands), or the command's
    stderr as the error."""
    buffer = b""
    channel.settimeout(timeout_s)
    while b"\n" not in buffer:
        try:
            chunk = channel.recv(4096)
        except TimeoutError:
            raise RemoteError(machine, f"agent said nothing in {timeout_s:.0f} s") from None
        if not chunk:
            err = channel.recv_stderr(4096).decode(errors="replace")
            raise RemoteError(machine, f"agent exited {channel.recv_exit_status()}: {err.strip()}")
        buffer += chunk
    return buffer.split(b"\n", 1)[0].decode()


def _clock_offset(session: Session, python: str) -> tuple[float, float]:
    """The machine's clock minus ours, NTP-style: over one channel, the sample with the shortest round trip
    (offset = remote - midpoint, uncertainty = half that round trip); `python` is the machine's interpreter."""
    channel = session.start([python, "-c", "import sys, time\nfor _ in sys.stdin: print(repr(time.time()), "
                             "flush=True)"], pty=False)
    best = (0.0, float("inf"))
    try:
        for i in range(CLOCK_SAMPLES):
            before = time.time()
            channel.sendall(b"\n")     # the first answer waits for the interpreter to start (>10 s in a TCG guest)
            remote = float(read_line(channel, session.machine.name, 60 if i == 0 else 10))
            after = time.time()
            if (after - before) / 2 < best[1]:
                best = (remote - (before + after) / 2, (after - before) / 2)
    finally:
        channel.close()
    return best
