"""A lab of "machines" for the multihost tier: network namespaces on this box, each running its own sshd
(Debian's openssh-server binary, its own host key, listening only on the lab's management address), joined by a
management network (a bridge in the root namespace, where the controller runs) and a data network (a bridge
in a switch namespace). Everything is named with the lab's prefix and removed by `close()`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from pyroute2 import IPRoute, NetNS, netns

SSHD = "/usr/sbin/sshd"
SFTP_SERVER = "/usr/lib/openssh/sftp-server"
MGMT_NIC, DATA_NIC = "mgmt0", "data0"


GUEST_PASSWD = Path("/run/testbed-lab-passwd")


def _mount_point(path: str) -> bool:
    return any(line.split()[4] == path for line in Path("/proc/self/mountinfo").read_text().splitlines())


def _root_entry(text: str, field: int, value: str, only_if: str = "") -> str:
    """A passwd-style file's text with one field of root's line replaced (where it starts with `only_if`)."""
    lines = []
    for line in text.splitlines():
        parts = line.split(":")
        if parts[0] == "root" and parts[field].startswith(only_if):
            parts[field] = value
        lines.append(":".join(parts))
    return "\n".join(lines) + "\n"


def _guest_root_login() -> bool:
    """Only inside virtme-ng's guest (TESTBED_IN_VM=1), root's login as the lab needs it; returns whether
    /etc/passwd was covered (undone by `_undo_guest_root_login`):
    - virtme-ng mounts a generated shadow over /etc/shadow (a file in the guest's /run/tmp) that locks root
      (`root:!`), and sshd without PAM refuses a locked account even for a key ("User root not allowed because
      account is locked"): in that file root's password becomes `*` (no password, key logins allowed);
    - bash sources this machine's ~/.bashrc for every SSH command (here pyenv's init: 230 ms a command natively,
      tens of seconds under TCG with three machines at once), which is this machine's setup, not the lab's: a copy
      of /etc/passwd with root's shell /bin/sh is mounted over it, in the guest's own mount table.
    The host's files are never written (the guest's root file system is the host's)."""
    if os.environ.get("TESTBED_IN_VM") != "1":
        return False
    shadow = Path("/etc/shadow")
    if _mount_point(str(shadow)):                # virtme-ng's generated file, not the host's
        shadow.write_text(_root_entry(shadow.read_text(), 1, "*", only_if="!"))
    if _mount_point("/etc/passwd"):
        return False
    GUEST_PASSWD.write_text(_root_entry(Path("/etc/passwd").read_text(), 6, "/bin/sh"))
    subprocess.run(["mount", "--bind", str(GUEST_PASSWD), "/etc/passwd"], check=True)
    return True


def _undo_guest_root_login() -> None:
    subprocess.run(["umount", "/etc/passwd"], check=False)
    GUEST_PASSWD.unlink(missing_ok=True)


@dataclass
class LabHost:
    name: str
    netns: str
    mgmt: str
    data: str
    host_key_pub: str = ""
    sshd: subprocess.Popen[bytes] | None = None


@dataclass
class SshLab:
    """`count` machines: prefix-h1..hN with mgmt 10.213.<net>.i and data 10.214.<net>.i."""

    root: Path
    prefix: str
    count: int
    net: int = 7
    hosts: list[LabHost] = field(default_factory=list)
    created_run_sshd: bool = False
    covered_passwd: bool = False

    @property
    def bridge(self) -> str:
        return f"{self.prefix}-br"

    @property
    def switch(self) -> str:
        return f"{self.prefix}-sw"

    @property
    def client_key(self) -> Path:
        return self.root / "id_ed25519"

    @property
    def known_hosts(self) -> Path:
        return self.root / "known_hosts"

    def open(self) -> SshLab:
        self.root.mkdir(parents=True, exist_ok=True)
        _keygen(self.client_key)
        (self.root / "authorized_keys").write_text(self.client_key.with_suffix(".pub").read_text())
        self.covered_passwd = _guest_root_login()
        if not Path("/run/sshd").exists():       # sshd's privilege-separation directory
            Path("/run/sshd").mkdir(mode=0o755)
            self.created_run_sshd = True
        with IPRoute() as ipr:
            ipr.link("add", ifname=self.bridge, kind="bridge")
            index = ipr.link_lookup(ifname=self.bridge)[0]
            ipr.addr("add", index=index, address=f"10.213.{self.net}.254", prefixlen=24)
            ipr.link("set", index=index, state="up")
        netns.create(self.switch)
        with NetNS(self.switch) as sw:
            sw.link("add", ifname="br", kind="bridge")
            sw.link("set", index=sw.link_lookup(ifname="br")[0], state="up")
        for i in range(1, self.count + 1):
            self.hosts.append(self._host(i))
        self.known_hosts.write_text("".join(f"{h.mgmt} {h.host_key_pub}\n" for h in self.hosts))
        return self

    def _host(self, i: int) -> LabHost:
        host = LabHost(f"h{i}", f"{self.prefix}-h{i}", f"10.213.{self.net}.{i}", f"10.214.{self.net}.{i}")
        netns.create(host.netns)
        with IPRoute() as ipr:
            ipr.link("add", ifname=f"{self.prefix}m{i}", kind="veth", peer=MGMT_NIC)
            ipr.link("set", index=ipr.link_lookup(ifname=MGMT_NIC)[0], net_ns_fd=host.netns)
            ipr.link("set", index=ipr.link_lookup(ifname=f"{self.prefix}m{i}")[0],
                     master=ipr.link_lookup(ifname=self.bridge)[0], state="up")
            ipr.link("add", ifname=f"{self.prefix}d{i}", kind="veth", peer=DATA_NIC)
            ipr.link("set", index=ipr.link_lookup(ifname=DATA_NIC)[0], net_ns_fd=host.netns)
            ipr.link("set", index=ipr.link_lookup(ifname=f"{self.prefix}d{i}")[0], net_ns_fd=self.switch)
        with NetNS(self.switch) as sw:
            sw.link("set", index=sw.link_lookup(ifname=f"{self.prefix}d{i}")[0],
                    master=sw.link_lookup(ifname="br")[0], state="up")
        with NetNS(host.netns) as ns:
            for ifname, address in ((MGMT_NIC, host.mgmt), (DATA_NIC, host.data), ("lo", None)):
                index = ns.link_lookup(ifname=ifname)[0]
                if address:
                    ns.addr("add", index=index, address=address, prefixlen=24)
                ns.link("set", index=index, state="up")
        folder = self.root / host.name
        folder.mkdir(exist_ok=True)
        key = folder / "ssh_host_ed25519_key"
        _keygen(key)
        host.host_key_pub = " ".join(key.with_suffix(".pub").read_text().split()[:2])
        config = folder / "sshd_config"
        config.write_text("\n".join([
            "Port 22", f"ListenAddress {host.mgmt}", f"HostKey {key}", f"PidFile {folder / 'sshd.pid'}",
            f"AuthorizedKeysFile {self.root / 'authorized_keys'}", "PermitRootLogin prohibit-password",
            "PasswordAuthentication no", "KbdInteractiveAuthentication no", "UsePAM no", "StrictModes no",
            f"Subsystem sftp {SFTP_SERVER}", "LogLevel ERROR", "MaxStartups 50", ""]))
        host.sshd = self.start_sshd(host)
        return host

    def start_sshd(self, host: LabHost) -> subprocess.Popen[bytes]:
        config = self.root / host.name / "sshd_config"
        log = open(self.root / host.name / "sshd.log", "ab")  # noqa: SIM115 - kept open for sshd's lifetime
        proc = subprocess.Popen(["ip", "netns", "exec", host.netns, SSHD, "-D", "-e", "-f", str(config)],
                                stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + 10
        while not _listening(host.netns, host.mgmt):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"sshd in {host.netns} did not start: "
                                   f"{(self.root / host.name / 'sshd.log').read_text()[-500:]}")
            time.sleep(0.05)
        return proc

    def stop_sshd(self, host: LabHost) -> None:
        if host.sshd and host.sshd.poll() is None:
            os.killpg(host.sshd.pid, signal.SIGTERM)
            host.sshd.wait(timeout=10)
        host.sshd = None

    def processes(self) -> list[int]:
        """Every process still running in the lab's namespaces (sshd included)."""
        pids = []
        for h in self.hosts:
            out = subprocess.run(["ip", "netns", "pids", h.netns], capture_output=True, text=True).stdout
            pids += [int(x) for x in out.split()]
        return pids

    def close(self) -> None:
        for h in self.hosts:
            self.stop_sshd(h)
        for pid in self.processes():          # anything the cycle left behind is a failure, but is cleaned
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        with IPRoute() as ipr:       # root-side ends first: a removed namespace's veths go only asynchronously
            for name in [f"{self.prefix}m{i}" for i in range(1, self.count + 1)] + [self.bridge]:
                for index in ipr.link_lookup(ifname=name):
                    ipr.link("del", index=index)
        for name in [h.netns for h in self.hosts] + [self.switch]:
            if name in netns.listnetns():
                netns.remove(name)
        if self.created_run_sshd:
            with contextlib.suppress(OSError):
                Path("/run/sshd").rmdir()
        if self.covered_passwd:
            _undo_guest_root_login()


def _keygen(path: Path) -> None:
    if not path.exists():
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "geo-testbed-lab", "-f", str(path)],
                       check=True)


def _listening(ns: str, address: str) -> bool:
    out = subprocess.run(["ip", "netns", "exec", ns, "ss", "-Hltn", f"src {address}:22"], capture_output=True,
                         text=True).stdout
    return bool(out.strip())
