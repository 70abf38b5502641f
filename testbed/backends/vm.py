"""`testbed vm -- CMD`: run a command under a stock kernel (Debian's linux-image) with this machine's own
userspace, via virtme-ng + QEMU, where sch_netem, rdma_rxe and openvswitch load as modules.

KVM where a guest really boots with it: `--kvm auto` (the default) boots a guest that only runs `true` with
KVM first and takes TCG (~35 s to boot) when that fails, saying which ran and why. On this project's machines
/dev/kvm opens but is a PVM hypervisor on which Debian's kernels abort or hang (docs/kernel.md), so the probe
falls back; on hosted CI runners with hardware KVM it is taken. The guest sees the host's files read-only,
except the folder given as the writable output directory.
"""

from __future__ import annotations

import os
import platform
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from testbed.errors import TestbedError
from testbed.util.paths import REPO_ROOT

GUEST_MODULES = ("sch_netem", "rdma_rxe", "openvswitch")


class VmUnavailable(TestbedError, RuntimeError):
    """What is missing for the stock-kernel tier, and how to install it."""


@dataclass(frozen=True, slots=True)
class VmSetup:
    vng: Path
    kernel: Path


def find_vng() -> Path | None:
    """virtme-ng beside this interpreter (the venv's bin, where make install puts it), else on PATH."""
    bindir = Path(sys.executable).parent
    found = bindir / "vng" if (bindir / "vng").exists() else shutil.which("vng")
    return Path(found) if found else None


def stock_kernels() -> list[Path]:
    """Kernel images other than the running one, in /boot and /usr/lib/modules/<release>/vmlinuz (where Debian's
    trixie-backports 7.x kernel installs it: scripts/install-stock-kernel.sh), oldest version first; the last
    is the one booted (7.x: rdma_rxe works inside network namespaces)."""
    running = platform.release()
    found = {p.name.removeprefix("vmlinuz-"): p for p in Path("/boot").glob("vmlinuz-*")}
    for image in Path("/usr/lib/modules").glob("*/vmlinuz"):
        found.setdefault(image.parent.name, image)
    return [found[r] for r in sorted((r for r in found if r != running), key=_version_key)]


def kernel_release(image: Path) -> str:
    """The release of a kernel image path (/boot/vmlinuz-R or /usr/lib/modules/R/vmlinuz)."""
    return image.parent.name if image.name == "vmlinuz" else image.name.removeprefix("vmlinuz-")


def _version_key(release: str) -> tuple[int, ...]:
    return tuple(int(n) for n in re.findall(r"\d+", release.split("-")[0].split("+")[0])[:3])


def kernel_package() -> str:
    """The distribution's stock-kernel package: linux-image-generic on Ubuntu, linux-image-amd64 on Debian."""
    try:
        fields = dict(line.split("=", 1) for line in Path("/etc/os-release").read_text().splitlines() if "=" in line)
    except OSError:
        fields = {}
    return "linux-image-generic" if fields.get("ID", "").strip('"') == "ubuntu" else "linux-image-amd64"


def find_setup() -> VmSetup:
    """The virtme-ng binary and a stock kernel image other than the running one."""
    vng = find_vng()
    missing = []
    if not vng:
        missing.append("virtme-ng (pip install virtme-ng; make install does it)")
    if not shutil.which("qemu-system-x86_64"):
        missing.append("qemu-system-x86 (apt)")
    if not (shutil.which("busybox") or Path("/bin/busybox").exists()):
        missing.append("busybox-static (apt; virtme-ng builds its initramfs with it)")
    kernels = stock_kernels()
    if not kernels:
        missing.append(f"a stock kernel in /boot (apt-get install {kernel_package()})")
    if missing:
        raise VmUnavailable("the stock-kernel tier needs: " + "; ".join(missing))
    return VmSetup(vng=Path(str(vng)), kernel=kernels[-1])


KVM_PROBE_TIMEOUT_S = 90.0


@dataclass(frozen=True, slots=True)
class Accel:
    """How the guest runs: KVM or TCG, and why."""

    kvm: bool
    reason: str

    @property
    def name(self) -> str:
        return "KVM" if self.kvm else "TCG"


def choose_accel(mode: str, setup: VmSetup) -> Accel:
    """`on`: KVM; `off`: TCG; `auto`: KVM if a guest boots with it here (a probe that runs `true`), else TCG."""
    if mode == "on":
        return Accel(True, "asked (--kvm on)")
    if mode == "off":
        return Accel(False, "asked (--kvm off)")
    if not os.access("/dev/kvm", os.R_OK | os.W_OK):
        return Accel(False, "no usable /dev/kvm")
    argv = [str(setup.vng), "-r", str(setup.kernel), "--memory", "512M", "--cpus", "1", "--", "true"]
    env = {**os.environ, "PATH": f"{setup.vng.parent}:{os.environ.get('PATH', '')}"}
    proc = subprocess.Popen(argv, env=env, start_new_session=True, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        out, _ = proc.communicate(timeout=KVM_PROBE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        return Accel(False, f"a KVM guest did not finish booting in {KVM_PROBE_TIMEOUT_S:.0f} s (PVM or nested KVM "
                            "without guest support)")
    if proc.returncode == 0:
        return Accel(True, "a KVM guest booted (probe)")
    last = (out or b"").decode(errors="replace").strip().splitlines()[-1:] or ["no output"]
    return Accel(False, f"a KVM guest failed (exit {proc.returncode}: {last[0][:160]})")


GUEST_ENV_PASSED = ("CI", "CI_ALLOWED_SKIPS")
"""Variables the guest gets from the host (virtme-ng passes none): under CI the guest's pytest applies the same
rules as the host's (tests/conftest.py: a tier that ran nothing, or skipped outside the runner's list, fails)."""


def guest_script(command: str, outdir: Path) -> str:
    """What runs inside the guest: load the modules, then the command from the repo root."""
    loads = "; ".join(f"modprobe {m} 2>/dev/null" for m in GUEST_MODULES)
    passed = "".join(f" {k}={shlex.quote(os.environ[k])}" for k in GUEST_ENV_PASSED if k in os.environ)
    return (f"exec 2>&1; {loads}; cd {shlex.quote(str(REPO_ROOT))} && export TESTBED_IN_VM=1 PYTHONDONTWRITEBYTECODE=1 "
            f"TESTBED_STATE_DIR={shlex.quote(str(outdir / 'state'))} TESTBED_VM_OUT={shlex.quote(str(outdir))}"
            f"{passed} && {command}")


CONSOLE_LOG = "console.log"
"""The guest kernel's console and what vng and QEMU say on the host, kept under the output folder."""
CONSOLE_TAIL_LINES = 30
BOOT_FAILED = 255
"""vng's status when the guest ended without the command's status: a kernel panic, QEMU dying, the init failing."""


def run_in_vm(command: str, outdir: Path, *, kvm: bool = False, memory: str = "2G", cpus: int = 2,
              timeout_s: float = 1800) -> int:
    """Boot the stock kernel, run `command` (a shell line), return its exit status. Ctrl-C kills the guest.

    The guest's console goes to `outdir/console.log`; when the guest dies before the command began (vng's 255 with
    no output: a panic or QEMU failing under emulation) it is booted once more, saying why with the console's
    last lines. Past `timeout_s` the guest is killed and the exit status is 124, with a line on stderr."""
    setup = find_setup()
    outdir.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + timeout_s
    for boot in (1, 2):
        status, spoke, expired = _boot(setup, command, outdir, kvm=kvm, memory=memory, cpus=cpus,
                                       timeout_s=max(1.0, deadline - time.monotonic()))
        if expired:
            print(f"testbed vm: the guest ran past --timeout {timeout_s:g} s and was killed; what it wrote under "
                  f"{outdir} stays; give it longer with --timeout", file=sys.stderr, flush=True)
            return 124
        if status == BOOT_FAILED and not spoke and boot == 1:
            print(f"testbed vm: the guest died before the command began (vng exit {status}); its console's last "
                  f"lines:\n{console_tail(outdir)}\ntestbed vm: booting it once more", file=sys.stderr, flush=True)
            continue
        if status == BOOT_FAILED:       # the command's own status never came back: a panic, QEMU dying
            print(f"testbed vm: the guest ended without the command's status (vng exit {status}); its console's "
                  f"last lines ({outdir / CONSOLE_LOG}):\n{console_tail(outdir)}", file=sys.stderr, flush=True)
        return status
    raise AssertionError("unreachable")


def console_tail(outdir: Path, lines: int = CONSOLE_TAIL_LINES) -> str:
    """The last lines of the guest's console log, or a line saying it is empty."""
    try:
        text = (outdir / CONSOLE_LOG).read_text(errors="replace").rstrip().splitlines()
    except OSError:
        text = []
    return "\n".join(f"  | {line}" for line in text[-lines:]) or "  | (nothing: QEMU wrote no console output)"


def _boot(setup: VmSetup, command: str, outdir: Path, *, kvm: bool, memory: str, cpus: int,
          timeout_s: float) -> tuple[int, bool, bool]:
    """One boot: (exit status, whether the guest wrote anything on its stdout, whether it ran past timeout_s)."""
    # --verbose sends the kernel's console to vng's stderr, kept in the log; the guest script's own stderr is joined
    # to its stdout (guest_script), which is streamed here.
    argv = [str(setup.vng), *([] if kvm else ["--disable-kvm"]), "--verbose", "-r", str(setup.kernel),
            "--memory", memory, "--cpus", str(cpus), "--rwdir", str(outdir), "--", guest_script(command, outdir)]
    env = {**os.environ, "PATH": f"{setup.vng.parent}:{os.environ.get('PATH', '')}"}
    # Through pipes: QEMU writing straight into an inherited file would overwrite what is already in it.
    with open(outdir / CONSOLE_LOG, "wb") as console:
        proc = subprocess.Popen(argv, env=env, start_new_session=True, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert proc.stdout is not None and proc.stderr is not None
        logger = threading.Thread(target=shutil.copyfileobj, args=(proc.stderr, console), daemon=True)
        logger.start()
        expired = threading.Event()

        def expire() -> None:
            expired.set()
            os.killpg(proc.pid, signal.SIGKILL)

        watchdog = threading.Timer(timeout_s, expire)
        watchdog.start()
        spoke = False
        try:
            for line in iter(proc.stdout.readline, b""):
                spoke = True
                sys.stdout.buffer.write(line)
                sys.stdout.buffer.flush()
            proc.wait()
        except BaseException:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise
        finally:
            watchdog.cancel()
            logger.join(timeout=5)
    return proc.returncode, spoke, expired.is_set()


def in_vm() -> bool:
    return os.environ.get("TESTBED_IN_VM") == "1"
