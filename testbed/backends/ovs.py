"""Open vSwitch for Mininet's switches: which datapath this machine has, and a private userspace instance.

The kernel datapath needs the `openvswitch` module; it uses the system's ovs-vswitchd when that runs. The
userspace datapath (`netdev`) needs no module. Where no system daemon serves, a testbed gets its own
ovsdb-server and ovs-vswitchd, started with OVS_RUNDIR pointing into the testbed's state folder, recorded by
PID and stopped by `down`. The system's OVS database is only touched to add and delete this testbed's
bridges, by name, when the system's daemon is the one in use.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from testbed.backends.base import BackendError
from testbed.state.records import ProcessRecord

SCHEMA = Path("/usr/share/openvswitch/vswitch.ovsschema")
SYSTEM_RUNDIR = Path("/var/run/openvswitch")
START_TIMEOUT_S = 10.0
DATAPATH_DEVICE = {"ovs": "ovs-system", "ovs-user": "ovs-netdev"}
"""The root-namespace device of each datapath, shared by every ovs-vswitchd that uses it."""


def installed() -> bool:
    return all(shutil.which(t) for t in ("ovs-vsctl", "ovsdb-server", "ovs-vswitchd", "ovsdb-tool"))


def kernel_datapath() -> bool:
    """The openvswitch kernel module is loaded (this tool never loads modules)."""
    return Path("/sys/module/openvswitch").exists()


def system_switch_running() -> bool:
    """The system's ovsdb-server answers (what Mininet's kernel-datapath OVSSwitch talks to)."""
    if not installed() or not (SYSTEM_RUNDIR / "db.sock").exists():
        return False
    return subprocess.run(["ovs-vsctl", "-t", "2", "show"], capture_output=True, env=system_env()).returncode == 0


def system_env() -> dict[str, str]:
    """This process's environment without OVS_* overrides, so OVS tools talk to the system's daemon."""
    return {k: v for k, v in os.environ.items() if not k.startswith("OVS_")}


def private_env(rundir: Path) -> dict[str, str]:
    """Environment that points every OVS tool (and Mininet's calls to them) at a private instance."""
    return {"OVS_RUNDIR": str(rundir), "OVS_DBDIR": str(rundir), "OVS_LOGDIR": str(rundir),
            "OVS_SYSCONFDIR": str(rundir)}


def start_private(rundir: Path, record: Callable[[ProcessRecord], None]) -> None:
    """Start ovsdb-server and ovs-vswitchd for the userspace datapath in `rundir`; `record(ProcessRecord)` each."""
    if not installed():
        raise BackendError("--switch ovs-user needs Open vSwitch's userspace tools (ovsdb-server, ovs-vswitchd): "
                           "apt-get install openvswitch-switch (make install does)")
    rundir.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, **private_env(rundir)}
    db = rundir / "conf.db"
    subprocess.run(["ovsdb-tool", "create", str(db), str(SCHEMA)], check=True, capture_output=True, env=env)
    _spawn(["ovsdb-server", str(db), f"--remote=punix:{rundir / 'db.sock'}", "--pidfile", "--log-file"], env, "ovsdb-server",
           record)
    _wait_for(rundir / "db.sock", "ovsdb-server", rundir)
    subprocess.run(["ovs-vsctl", "--no-wait", "init"], check=True, capture_output=True, env=env)
    _spawn(["ovs-vswitchd", "--pidfile", "--log-file"], env, "ovs-vswitchd", record)
    deadline = time.monotonic() + START_TIMEOUT_S
    while subprocess.run(["ovs-appctl", "-t", "ovs-vswitchd", "version"], capture_output=True, env=env).returncode:
        if time.monotonic() > deadline:
            raise BackendError(f"ovs-vswitchd did not start within {START_TIMEOUT_S:g} s: "
                               + _log_tail(rundir / "ovs-vswitchd.log"))
        time.sleep(0.05)


def stop_private(rundir: Path, bridges: list[str]) -> None:
    """Delete this testbed's bridges and ask the private ovs-vswitchd to exit removing its datapath
    (`exit --cleanup`): kernel datapath ports outlive the daemon otherwise. Processes are stopped by PID later."""
    if not (rundir / "ovs-vswitchd.pid").exists():
        return
    env = {**os.environ, **private_env(rundir)}
    if bridges:
        argv = ["ovs-vsctl", "-t", "30"]
        for bridge in bridges:
            argv += ["--", "--if-exists", "del-br", bridge]
        subprocess.run(argv, capture_output=True, env=env)
    subprocess.run(["ovs-appctl", "-T", "30", "-t", "ovs-vswitchd", "exit", "--cleanup"], capture_output=True, env=env)


def delete_datapath(kind: str) -> None:
    """Remove a datapath's device if `exit --cleanup` left it (only called when this testbed's daemon made it)."""
    if kind == "ovs":
        subprocess.run(["ovs-dpctl", "del-dp", f"system@{DATAPATH_DEVICE[kind]}"], capture_output=True)


def _spawn(argv: list[str], env: dict[str, str], role: str, record: Callable[[ProcessRecord], None]) -> None:
    proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    record(ProcessRecord.of(proc.pid, role))


def _wait_for(path: Path, what: str, rundir: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while not path.exists():
        if time.monotonic() > deadline:
            raise BackendError(f"{what} did not start within {START_TIMEOUT_S:g} s: " + _log_tail(rundir / f"{what}.log"))
        time.sleep(0.02)


def _log_tail(log: Path, lines: int = 3) -> str:
    """The end of a daemon's log, for an error message (the log goes with the testbed's folder)."""
    try:
        return " | ".join(log.read_text().strip().splitlines()[-lines:]) or f"{log} is empty"
    except OSError:
        return f"no log at {log}"
