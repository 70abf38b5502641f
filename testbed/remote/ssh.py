"""One SSH session per machine (fabric over paramiko), with host keys checked against known_hosts.

Commands are argument lists, quoted with shlex.join; nothing is built by string interpolation. A host key that
is not in known_hosts is refused unless the inventory says `accept_new_host_key: true` for that machine (then
it is added to the file); a key that differs from the file's is always refused. Errors name the machine.
"""

from __future__ import annotations

import json
import shlex
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import paramiko
from fabric import Connection

from testbed.errors import TestbedError
from testbed.remote.inventory import Machine

CONNECT_TIMEOUT_S = 5.0
"""TCP connect: an unreachable machine fails fast."""
HANDSHAKE_TIMEOUT_S = 60.0
"""Banner and authentication once connected: a loaded machine (or a TCG guest: 5 s was too little for three
logins at once) is slow, not wrong."""


class RemoteError(TestbedError, RuntimeError):
    """A step failed on one machine; the message starts with the machine's name."""

    def __init__(self, machine: str, message: str) -> None:
        self.machine = machine
        super().__init__(f"{machine}: {message}")


@dataclass(frozen=True, slots=True)
class Result:
    code: int
    stdout: str
    stderr: str


class _AddToKnownHosts(paramiko.MissingHostKeyPolicy):
    """Trust on first use, for machines whose inventory entry allows it: the key is written to known_hosts."""

    def __init__(self, known_hosts: Path) -> None:
        self.known_hosts = known_hosts

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        client.get_host_keys().add(hostname, key.get_name(), key)
        self.known_hosts.parent.mkdir(parents=True, exist_ok=True)
        with open(self.known_hosts, "a") as f:
            f.write(f"{hostname} {key.get_name()} {key.get_base64()}\n")


class Session:
    """An open SSH connection to one machine."""

    def __init__(self, machine: Machine, known_hosts: Path, timeout_s: float = CONNECT_TIMEOUT_S) -> None:
        self.machine = machine
        self.known_hosts = known_hosts
        self.timeout_s = timeout_s
        self.sudo: list[str] = [] if machine.user == "root" else ["sudo", "-n", "--"]
        self.conn = self._open()

    def _connection(self, host: str, user: str | None, port: int, gateway: Connection | None = None) -> Connection:
        kwargs: dict[str, Any] = {"timeout": self.timeout_s, "banner_timeout": HANDSHAKE_TIMEOUT_S,
                                  "auth_timeout": HANDSHAKE_TIMEOUT_S}
        if self.machine.key:
            kwargs.update(key_filename=str(self.machine.key), look_for_keys=False)
        conn = Connection(host=host, user=user, port=port, connect_kwargs=kwargs, gateway=gateway)
        client = conn.client
        client._host_keys = paramiko.HostKeys()             # only the inventory's known_hosts, not ~/.ssh's too
        if self.known_hosts.exists():
            client.load_host_keys(str(self.known_hosts))
        client.set_missing_host_key_policy(_AddToKnownHosts(self.known_hosts) if self.machine.accept_new_host_key
                                           else paramiko.RejectPolicy())
        return conn

    def _open(self) -> Connection:
        m = self.machine
        gateway = self._connection(m.jump.host, m.jump.user, m.jump.port) if m.jump else None
        conn = self._connection(m.address, m.user, m.port, gateway)
        try:
            self._connect(conn)
        except paramiko.BadHostKeyException as exc:
            raise RemoteError(m.name, f"the host key of {m.address}:{m.port} ({exc.key.get_name()}) differs from "
                              f"{self.known_hosts}: refusing to connect (another machine, or a man in the middle). "
                              f"If the machine was reinstalled, check its new key by hand and replace the line "
                              f"(ssh-keygen -R '[{m.address}]:{m.port}' -f {self.known_hosts})") from None
        except paramiko.AuthenticationException as exc:
            if "timeout" in str(exc).lower():
                raise RemoteError(m.name, f"{m.address}:{m.port} did not finish authenticating {m.user} within "
                                  f"{HANDSHAKE_TIMEOUT_S:.0f} s (an overloaded machine?)") from None
            raise RemoteError(m.name, f"authentication failed as {m.user}@{m.address}:{m.port}"
                              + (f" with key {m.key}" if m.key else " (ssh-agent/default keys)")
                              + "; check inventory keys user and key") from None
        except paramiko.SSHException as exc:
            if "not found in known_hosts" in str(exc):
                raise RemoteError(m.name, f"{m.address}:{m.port} is not in {self.known_hosts}: add its key after "
                                  "checking its fingerprint (ssh-keyscan -p PORT ADDRESS), or set "
                                  f"hosts.{m.name}.accept_new_host_key: true to trust it on first contact") from None
            raise RemoteError(m.name, f"SSH to {m.login} failed: {exc}") from None
        except (TimeoutError, OSError) as exc:
            raise RemoteError(m.name, f"unreachable: SSH to {m.login} failed ({_reason(exc)}); check the "
                              "machine is up, sshd runs, and inventory keys address/port") from None
        return conn

    @staticmethod
    def _connect(conn: Connection) -> None:
        """Open; on any failure close the half-open transport at once (sshd would hold it until LoginGraceTime)."""
        try:
            conn.open()
        except BaseException:
            conn.client.close()
            if conn.gateway is not None:
                conn.gateway.close()
            raise

    # -- commands ------------------------------------------------------------------------------------
    def run(self, argv: list[str], *, root: bool = False, timeout_s: float | None = 120, check: bool = True) -> Result:
        """Run `argv` (quoted) on the machine; `root` prefixes sudo for non-root users."""
        command = shlex.join([*(self.sudo if root else []), *argv])
        try:
            result = self.conn.run(command, hide=True, warn=True, timeout=timeout_s, in_stream=False)
        except Exception as exc:  # noqa: BLE001 - invoke's timeouts and transport errors, named
            raise RemoteError(self.machine.name, f"{argv[0]} failed: {type(exc).__name__}: {exc}") from None
        out = Result(result.exited, result.stdout, result.stderr)
        if check and out.code != 0:
            raise RemoteError(self.machine.name, f"{shlex.join(argv[:4])}{' ...' if len(argv) > 4 else ''} exited "
                              f"{out.code}: {out.stderr.strip()[-600:] or out.stdout.strip()[-600:]}")
        return out

    def json(self, argv: list[str], **kwargs: Any) -> dict[str, Any]:
        """Run a command that prints one JSON object on its last line."""
        out = self.run(argv, **kwargs)
        try:
            return json.loads(out.stdout.strip().splitlines()[-1])
        except (IndexError, json.JSONDecodeError):
            raise RemoteError(self.machine.name, f"{argv[0]} printed no JSON: {out.stdout[-300:]!r}") from None

    def start(self, argv: list[str], *, root: bool = False, pty: bool = True) -> paramiko.Channel:
        """Start `argv` without waiting; with a pty the remote process gets SIGHUP when the channel closes."""
        transport = self.conn.client.get_transport()
        assert transport is not None
        channel = transport.open_session()
        if pty:
            channel.get_pty(width=500)
        channel.exec_command(shlex.join([*(self.sudo if root else []), *argv]))
        return channel

    def put(self, local: Path, remote: str) -> None:
        try:
            self.conn.put(str(local), remote)
        except OSError as exc:
            raise RemoteError(self.machine.name, f"copying {local.name} to {remote} failed: {exc}") from None

    def get(self, remote: str, local: Path) -> None:
        local.parent.mkdir(parents=True, exist_ok=True)
        try:
            self.conn.get(remote, str(local))
        except OSError as exc:
            raise RemoteError(self.machine.name, f"fetching {remote} failed: {exc}") from None

    def close(self) -> None:
        self.conn.close()


def _reason(exc: BaseException) -> str:
    if isinstance(exc, paramiko.ssh_exception.NoValidConnectionsError):
        return "connection refused"
    if isinstance(exc, socket.timeout | TimeoutError):
        return f"no answer in {CONNECT_TIMEOUT_S:.0f} s"
    return exc.strerror or str(exc) if isinstance(exc, OSError) else str(exc)
