"""scripts/stock_kernel.py: which trixie-backports kernel `make install` fetches, from apt-cache's answer (scripted
here). Backports drops old kernels, so a pinned 7.3.4 stops downloading; the newest 7.x listed is taken instead."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys

import pytest
from conftest import REPO

SCRIPT = REPO / "scripts" / "stock_kernel.py"
_spec = importlib.util.spec_from_file_location("stock_kernel", SCRIPT)
assert _spec and _spec.loader
stock_kernel = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(stock_kernel)

# `apt-cache search --names-only '^linux-binary-7\.'` against trixie-backports (2026-12), shortened, plus what a
# careless pattern would also let in
APT_SEARCH = """\
linux-binary-7.0.13+deb13-amd64 - Binary for Linux 7.0.13 (signed)
linux-binary-7.0.13+deb13-cloud-amd64 - Binary for Linux 7.0.13 (signed)
linux-binary-7.1.13+deb13-amd64 - Linux 7.1.13 for 64-bit PCs (kernel image)
linux-binary-7.2.9+deb13-amd64 - Linux 7.2.9 for 64-bit PCs (kernel image)
linux-binary-7.2.12+deb13-amd64 - Linux 7.2.12 for 64-bit PCs (kernel image)
linux-binary-7.2.12+deb13-rt-amd64 - Linux 7.2.12 for 64-bit PCs (kernel image)
linux-binary-7.10.1+deb13-cloud-amd64 - Linux 7.10.1 for x86-64 cloud (kernel image)
linux-binary-7.3.4+deb13-amd64 - Linux 7.3.4 for 64-bit PCs (kernel image)
linux-binary-6.12.48+deb13-amd64 - Linux 6.12.48 for 64-bit PCs (kernel image)
linux-binary-8.0.1+deb13-amd64 - Linux 8.0.1 for 64-bit PCs (kernel image)
linux-modules-7.9.1+deb13-amd64 - Linux 7.9.1 modules
"""


def test_the_newest_7x_amd64_is_taken_by_version_not_by_text() -> None:
    # 7.3.4 over 7.2.12 (text order would pick 7.2.12 over 7.10 and 7.3); not -cloud/-rt, not 6.x or 8.x
    assert stock_kernel.newest_7x(APT_SEARCH) == "7.3.4+deb13-amd64"
    assert stock_kernel.newest_7x(APT_SEARCH + "linux-binary-7.10.2+deb13-amd64 - Linux 7.10.2\n") == \
        "7.10.2+deb13-amd64"
    assert stock_kernel.newest_7x("linux-binary-7.3.4+deb13-amd64 - x\nlinux-binary-7.3.4+deb14-amd64 - x\n") == \
        "7.3.4+deb14-amd64"


@pytest.mark.parametrize("answer", ["", "linux-binary-6.12.48+deb13-amd64 - Linux 6.12.48\n",
                                    "linux-binary-7.2.12+deb13-cloud-amd64 - cloud only\n"])
def test_none_found_names_the_override(answer: str) -> None:
    with pytest.raises(stock_kernel.NoStockKernel, match="STOCK_KERNEL_VERSION=7"):
        stock_kernel.newest_7x(answer)


def test_the_install_script_reads_it_from_stdin_and_fails_with_the_override() -> None:
    """As scripts/install-stock-kernel.sh runs it: the system's python3 (no venv yet), apt-cache's answer piped in."""
    found = subprocess.run([sys.executable, str(SCRIPT)], input=APT_SEARCH, capture_output=True, text=True, timeout=30)
    assert (found.returncode, found.stdout, found.stderr) == (0, "7.3.4+deb13-amd64\n", "")
    none = subprocess.run([sys.executable, str(SCRIPT)], input="", capture_output=True, text=True, timeout=30)
    assert none.returncode == 1 and none.stdout == "" and "STOCK_KERNEL_VERSION" in none.stderr
    script = (REPO / "scripts" / "install-stock-kernel.sh").read_text()
    assert 'stock_kernel.py"' in script and "STOCK_KERNEL_VERSION" in script and not re.search(r":-[0-9]", script), \
        "the script resolves the release; a pinned default (${1:-7.3.4...}) stops working when backports moves on"
