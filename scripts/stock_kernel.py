#!/usr/bin/env python3
"""The newest 7.x stock kernel trixie-backports offers, from `apt-cache search --names-only '^linux-binary-7\\.'`
on stdin: prints its release (e.g. 7.3.4+deb13-amd64), the name the linux-binary-, linux-modules- and linux-base-
packages carry. Only the plain amd64 flavour counts (not -cloud-amd64 or -rt-amd64), and no 6.x. None found: exit 1
with a line naming the override (STOCK_KERNEL_VERSION). Standard library only: scripts/install-stock-kernel.sh runs
it with the system's python3 before the venv exists."""

from __future__ import annotations

import re
import sys

OVERRIDE = "STOCK_KERNEL_VERSION"
_BINARY = re.compile(r"^linux-binary-((\d+)\.(\d+)\.(\d+)\+deb(\d+)-amd64)(?:\s|$)")


class NoStockKernel(LookupError):
    pass


def newest_7x(apt_output: str) -> str:
    """The release of the newest 7.x linux-binary-R-amd64 named in apt-cache's output."""
    found = {}
    for line in apt_output.splitlines():
        m = _BINARY.match(line.strip())
        if m and m.group(2) == "7":
            found[m.group(1)] = tuple(int(n) for n in m.group(2, 3, 4, 5))
    if not found:
        raise NoStockKernel("no 7.x linux-binary-*-amd64 package in trixie-backports' list; name one with "
                            f"{OVERRIDE}=7.X.Y+deb13-amd64 (or scripts/install-stock-kernel.sh 7.X.Y+deb13-amd64)")
    return max(found, key=found.__getitem__)


def main() -> int:
    try:
        print(newest_7x(sys.stdin.read()))
    except NoStockKernel as exc:
        print(f"stock kernel: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
