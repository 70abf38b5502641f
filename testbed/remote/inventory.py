"""An inventory file: which real machine plays which host of a topology, and how to reach it over SSH.

    topology: 2dc-1000km            # a shipped topology's name, or a path relative to this file
    known_hosts: known_hosts        # optional (default ~/.ssh/known_hosts), relative to this file
    defaults: {user: root, key: id_ed25519, nic: eth0}
    hosts:
      dc-a-h1: {address: 192.0.2.10, data_address: 10.0.0.1}
      dc-b-h1: {address: 192.0.2.11, data_address: 10.0.0.2, port: 2222, jump: admin@bastion:22}

Validated like a topology file: every problem names the file, the key path, what is wrong and the fix.
"""

from __future__ import annotations

import difflib
import ipaddress
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from testbed.topology.errors import Problem, TopologyError
from testbed.topology.loader import load_topology
from testbed.topology.model import Topology
from testbed.topology.yamlcheck import UniqueKeyLoader, YamlChecker
from testbed.util.paths import resolve_topology

TOP_KEYS = {"topology", "known_hosts", "defaults", "hosts"}
HOST_KEYS = {"address", "data_address", "port", "user", "key", "nic", "jump", "python", "workdir",
             "accept_new_host_key"}
DEFAULT_KEYS = HOST_KEYS - {"address", "data_address"}
USER_RE = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")
LABEL = r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
HOSTNAME_RE = re.compile(rf"^(?=.{{1,253}}$){LABEL}(\.{LABEL})*$")
IFNAME_RE = re.compile(r"^[A-Za-z0-9_.-]{1,15}$")
JUMP_RE = re.compile(r"^(?:(?P<user>[a-z_][a-z0-9_-]*)@)?(?P<host>[A-Za-z0-9.-]+)(?::(?P<port>\d+))?$")
DEFAULT_WORKDIR = "~/.cache/geo-testbed"
MAX_INVENTORY_BYTES = 256 * 1024


class InventoryError(TopologyError):
    """An inventory file is invalid (same form as topology errors: file, key path, problem, fix)."""

    what = "inventory"


@dataclass(frozen=True, slots=True)
class Jump:
    """A bastion the SSH connection goes through."""

    host: str
    user: str | None
    port: int


@dataclass(frozen=True, slots=True)
class Machine:
    """One real machine playing one topology host."""

    name: str
    """The topology host it plays (e.g. `dc-a-h1`)."""
    dc: str
    address: str
    """Where SSH reaches it."""
    data_address: str
    """Its address on `nic`: what the other hosts' workers and shaping rules use."""
    port: int
    user: str
    key: Path | None
    nic: str
    jump: Jump | None
    python: str | None
    """A pre-provisioned interpreter (with torch); None: provision a venv under `workdir`."""
    workdir: str
    accept_new_host_key: bool
    """Trust a host key not in known_hosts on first contact (never a changed one)."""

    @property
    def login(self) -> str:
        return f"{self.user}@{self.address}:{self.port}"


@dataclass(frozen=True, slots=True)
class Inventory:
    source: Path
    topology: Topology
    topology_path: Path
    known_hosts: Path
    machines: tuple[Machine, ...]

    def machine(self, name: str) -> Machine:
        for m in self.machines:
            if m.name == name:
                return m
        raise KeyError(name)


def load_inventory(path: str | Path) -> Inventory:
    """Read and validate an inventory file; raises `InventoryError` with every problem found."""
    source = Path(path)
    try:
        data = source.read_bytes()[:MAX_INVENTORY_BYTES + 1]
    except OSError as exc:
        raise InventoryError(str(source), [Problem("", f"cannot read file: {exc.strerror}", "give the path of an "
                                                   "inventory YAML file (see playbooks/README.md)")]) from None
    if len(data) > MAX_INVENTORY_BYTES:
        raise InventoryError(str(source), [Problem("", "the file is larger than 256 KiB", "is this the right path?")])
    try:
        raw = yaml.load(data.decode("utf-8", errors="strict"), Loader=UniqueKeyLoader)  # noqa: S506
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark else ""
        raise InventoryError(str(source), [Problem(where, f"not valid YAML: {getattr(exc, 'problem', exc)}",
                                                   "fix the YAML syntax (indentation, colons, quotes)")]) from None
    check = YamlChecker()
    inventory = _build(raw, source, check)
    if check.problems or inventory is None:
        raise InventoryError(str(source), check.problems)
    return inventory


def _build(raw: Any, source: Path, check: YamlChecker) -> Inventory | None:
    top = check.mapping(raw, "", TOP_KEYS)
    if not isinstance(raw, dict):
        return None
    base = source.parent
    topology, topology_path = None, None
    if "topology" not in top:
        check.add("topology", "missing", "name the topology these machines play (e.g. topology: 2dc-1000km)")
    else:
        topology_path = _topology_path(str(top["topology"]), base)
        try:
            topology = load_topology(topology_path)
        except TopologyError as exc:
            check.add("topology", f"{topology_path} does not load: {exc.problems[0].render(str(topology_path))}",
                      "fix that topology file or name a shipped one (topologies/)")
    known_hosts = Path("~/.ssh/known_hosts").expanduser()
    if "known_hosts" in top:
        known_hosts = _relative(str(top["known_hosts"]), base)
        if not known_hosts.is_file():
            check.add("known_hosts", f"{known_hosts} does not exist",
                      "give the file holding the machines' host keys (ssh-keyscan -H HOST >> FILE, checked by hand)")
    defaults = check.mapping(top.get("defaults"), "defaults", DEFAULT_KEYS)
    hosts = top.get("hosts")
    if not isinstance(hosts, dict) or not hosts:
        check.add("hosts", "missing or empty" if not hosts else f"expected a mapping, got {type(hosts).__name__}",
                  "map topology hosts to machines: hosts: {dc-a-h1: {address: 192.0.2.10}}")
        return None
    dc_of = dict((h, dc) for h, dc in topology.hosts) if topology else {}
    machines = []
    for name, spec in hosts.items():
        path = f"hosts.{name}"
        if topology and name not in dc_of:
            close = difflib.get_close_matches(str(name), sorted(dc_of), n=1)
            check.add(path, f"{name!r} is not a host of topology {topology.name}",
                      f"did you mean {close[0]!r}?" if close else f"its hosts are: {', '.join(sorted(dc_of))}")
            continue
        own = check.mapping(spec, path, HOST_KEYS)
        machine = _machine(str(name), dc_of.get(name, "?"), {**defaults, **own}, own, path, base, check)
        if machine:
            machines.append(machine)
    if len(machines) == len(hosts):            # a rejected machine must not read as an uncovered DC
        _check_cover(machines, topology, check)
    _check_unique(machines, check)
    if check.problems or topology is None or topology_path is None:
        return None
    return Inventory(source, topology, topology_path, known_hosts, tuple(machines))


def _machine(name: str, dc: str, merged: dict[str, Any], own: dict[str, Any], path: str, base: Path,
             check: YamlChecker) -> Machine | None:
    def where(key: str) -> str:
        return f"{path}.{key}" if key in own else f"defaults.{key}"

    before = len(check.problems)
    address = merged.get("address")
    if address is None:
        check.add(f"{path}.address", "missing", "give the address SSH reaches this machine at (IP or DNS name)")
    elif not _is_address(str(address)):
        check.add(f"{path}.address", f"{address!r} is not an IP address or host name", "write e.g. 192.0.2.10 or node1.lab")
    data_address = merged.get("data_address", address)
    if data_address is not None and not _is_ip(str(data_address)):
        check.add(f"{path}.data_address" if "data_address" in own else f"{path}.address",
                  f"{data_address!r} is not an IPv4 address",
                  "give the IPv4 address of the machine's data NIC (shaping rules match it)")
    port = merged.get("port", 22)
    if not isinstance(port, int) or isinstance(port, bool) or not 1 <= port <= 65535:
        check.add(where("port"), f"{port!r} is not a TCP port", "write a number from 1 to 65535")
    user = merged.get("user", "root")
    if not isinstance(user, str) or not USER_RE.match(user):
        check.add(where("user"), f"invalid user name {user!r}", "a Unix login name: a-z, 0-9, '_', '-'")
    key = None
    if merged.get("key") is not None:
        key = _relative(str(merged["key"]), base)
        if not key.is_file():
            check.add(where("key"), f"key file {key} does not exist",
                      "give the private key file (relative to the inventory) or leave key out to use ssh-agent")
    nic = merged.get("nic")
    if nic is None:
        check.add(f"{path}.nic", "missing", "name the NIC whose egress carries inter-DC traffic (e.g. nic: eth0)")
    elif not isinstance(nic, str) or not IFNAME_RE.match(nic):
        check.add(where("nic"), f"invalid interface name {nic!r}", "1-15 characters of letters, digits, '_', '.', '-'")
    jump = None
    if merged.get("jump") is not None:
        m = JUMP_RE.match(str(merged["jump"]))
        if not m or not _is_address(m["host"]):
            check.add(where("jump"), f"{merged['jump']!r} is not a jump host", "write [user@]host[:port]")
        else:
            jump = Jump(m["host"], m["user"], int(m["port"] or 22))
    python = merged.get("python")
    if python is not None and (not isinstance(python, str) or not python.startswith("/")):
        check.add(where("python"), f"{python!r} is not an absolute path",
                  "give the remote interpreter's absolute path (e.g. /opt/geo/.venv/bin/python), or leave it out")
    workdir = merged.get("workdir", DEFAULT_WORKDIR)
    if not isinstance(workdir, str) or not (workdir.startswith("/") or workdir.startswith("~/")):
        check.add(where("workdir"), f"{workdir!r} is not an absolute or ~/ path", f"e.g. {DEFAULT_WORKDIR}")
    accept = merged.get("accept_new_host_key", False)
    if not isinstance(accept, bool):
        check.add(where("accept_new_host_key"), f"expected true or false, got {accept!r}", "write true or false")
    if len(check.problems) > before:
        return None
    return Machine(name=name, dc=dc, address=str(address), data_address=str(data_address), port=port, user=user,
                   key=key, nic=str(nic), jump=jump, python=python, workdir=workdir, accept_new_host_key=accept)


def _check_cover(machines: list[Machine], topology: Topology | None, check: YamlChecker) -> None:
    if topology is None or not machines:
        return
    dcs = {m.dc for m in machines}
    if len(dcs) < 2:
        check.add("hosts", f"every machine is in {next(iter(dcs))}: nothing crosses an inter-DC link",
                  f"map hosts of at least two DCs of {topology.name}: {', '.join(d.name for d in topology.datacenters)}")


def _check_unique(machines: list[Machine], check: YamlChecker) -> None:
    seen: dict[str, str] = {}
    for m in machines:
        if m.data_address in seen:
            check.add(f"hosts.{m.name}.data_address", f"{m.data_address} is also {seen[m.data_address]}'s",
                      "each topology host needs its own data address (shaping matches addresses)")
        seen.setdefault(m.data_address, m.name)


def _topology_path(value: str, base: Path) -> Path:
    candidate = _relative(value, base)
    if candidate.exists() or "/" in value or value.endswith((".yaml", ".yml")):
        return candidate
    return resolve_topology(value)


def _relative(value: str, base: Path) -> Path:
    path = Path(value).expanduser()
    return path if path.is_absolute() else base / path


def _is_ip(value: str) -> bool:
    try:
        ipaddress.IPv4Address(value)
    except ValueError:
        return False
    return True


def _is_address(value: str) -> bool:
    return _is_ip(value) or (not value.replace(".", "").isdigit() and bool(HOSTNAME_RE.match(value)))
