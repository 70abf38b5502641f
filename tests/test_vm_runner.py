"""Host side of the stock-kernel tier: `testbed vm` itself (the guest's tests are tests/test_vm*.py)."""

from __future__ import annotations

import subprocess

import pytest
from conftest import REPO

from testbed.backends import vm
from testbed.backends.vm import VmUnavailable, find_setup


def _tier_available() -> bool:
    try:
        find_setup()
    except VmUnavailable:
        return False
    return True


@pytest.mark.skipif(not _tier_available(), reason="no stock kernel / virtme-ng here (make install sets them up)")
def test_a_guest_past_its_timeout_is_killed_and_says_so(tmp_path) -> None:
    """A silent kill at the deadline once cut a 30-minute bench short with nothing on the terminal."""
    # --kvm off: the deadline is under test, not the accelerator; auto's KVM probe alone waits up to 90 s on a host
    # whose /dev/kvm cannot boot the guest (PVM), past this test's 60 s.
    proc = subprocess.run([str(REPO / ".venv/bin/testbed"), "vm", "--kvm", "off", "--timeout", "3", "--out",
                           str(tmp_path), "--", "sleep", "120"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 124, (proc.returncode, proc.stdout, proc.stderr)
    assert "ran past --timeout 3 s and was killed" in proc.stderr
    qemu = subprocess.run(["pgrep", "-af", str(tmp_path)], capture_output=True, text=True)
    assert qemu.stdout == "", f"the guest (vng, QEMU) still runs: {qemu.stdout}"


def _fake_vng(tmp_path, body: str):
    """A stand-in for vng: what it is told is kept in argv.txt; `body` decides what it says and returns."""
    vng = tmp_path / "vng"
    vng.write_text(f"#!/bin/bash\necho \"$@\" >> {tmp_path}/argv.txt\nn=$(wc -l < {tmp_path}/argv.txt)\n{body}\n")
    vng.chmod(0o755)
    return vm.VmSetup(vng=vng, kernel=tmp_path / "vmlinuz")


def test_a_guest_that_dies_before_its_command_is_booted_once_more_and_the_console_shown(tmp_path, monkeypatch,
                                                                                     capfd) -> None:
    """CI once got vng's 255 with no output at all: the reason (the console) was thrown away and nothing retried."""
    setup = _fake_vng(tmp_path, 'if [ "$n" = 1 ]; then echo "Kernel panic - not syncing: fake" >&2; exit 255; fi\n'
                                'echo "guest ran"; exit 0')
    monkeypatch.setattr(vm, "find_setup", lambda: setup)
    assert vm.run_in_vm("true", tmp_path / "out", timeout_s=30) == 0
    out, err = capfd.readouterr()
    assert "guest ran" in out
    assert "died before the command began (vng exit 255)" in err and "Kernel panic - not syncing: fake" in err
    assert len((tmp_path / "argv.txt").read_text().splitlines()) == 2
    assert "--verbose" in (tmp_path / "argv.txt").read_text()


def test_a_guest_that_fails_after_it_spoke_is_not_booted_again(tmp_path, monkeypatch, capfd) -> None:
    """A command that ran and failed is the command's failure: one boot, its status, the console's tail."""
    setup = _fake_vng(tmp_path, 'echo "1 failed"; echo "virtme-init: done" >&2; exit 255')
    monkeypatch.setattr(vm, "find_setup", lambda: setup)
    assert vm.run_in_vm("pytest", tmp_path / "out", timeout_s=30) == 255
    _, err = capfd.readouterr()
    assert "ended without the command's status (vng exit 255)" in err and "virtme-init: done" in err
    assert len((tmp_path / "argv.txt").read_text().splitlines()) == 1
    assert (tmp_path / "out" / vm.CONSOLE_LOG).read_text().strip() == "virtme-init: done"


def test_the_guest_script_joins_its_stderr_to_the_streamed_stdout(tmp_path) -> None:
    """The host's stderr of vng is the kernel console (kept in the log): the command's own errors must not go there."""
    assert vm.guest_script("pytest", tmp_path).startswith("exec 2>&1;")
