"""Host side of the stock-kernel tier: `testbed vm` itself (the guest's tests are tests/test_vm*.py)."""

from __future__ import annotations

import subprocess

import pytest
from conftest import REPO

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
