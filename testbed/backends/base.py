"""The one small interface every backend implements (cf. Kathara's IManager, without its facade)."""

from __future__ import annotations

import subprocess
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pyroute2 import IPRoute

from testbed.backends import nsfs
from testbed.errors import TestbedError
from testbed.plan.model import Plan
from testbed.state.store import TestbedState


class BackendError(TestbedError, RuntimeError):
    """A backend could not build, enter or remove a testbed; the message says why and what to do."""


@dataclass(frozen=True, slots=True)
class FabricPort:
    """An interface whose egress carries a DC's fabric traffic towards a host (shaped at the fabric rate)."""

    node: str | None
    """The node whose namespace holds it; None for the root namespace (Mininet's switches live there)."""
    ifname: str
    dc: str


class Backend(ABC):
    """Makes a `Plan` real, runs commands on its nodes, and removes exactly what it made."""

    name: str = ""

    def __init__(self, state: TestbedState) -> None:
        self.state = state

    @abstractmethod
    def deploy(self, plan: Plan) -> None:
        """Create every node, link, address, route and sysctl of the plan; on failure remove what was made."""

    @abstractmethod
    def destroy(self) -> None:
        """Remove everything recorded in the state, also after a crash of the creating process."""

    @abstractmethod
    def netns_path(self, node: str) -> str:
        """A path that names the node's network namespace (for setns), e.g. /run/netns/NAME."""

    def netlink(self, node: str | None) -> IPRoute:
        """A netlink socket bound to the node's namespace, or the root namespace for None (caller closes it)."""
        if node is None:
            return IPRoute()
        with nsfs.entered(self.netns_path(node)):
            return IPRoute()

    @abstractmethod
    def fabric_ports(self) -> list[FabricPort]:
        """Every egress of the DC fabrics: each host's uplink and each port that delivers to a host."""

    @abstractmethod
    def popen(self, node: str, argv: Sequence[str], **kwargs: Any) -> subprocess.Popen[Any]:
        """Start a process on a node."""

    def exec(self, node: str, argv: Sequence[str], *, timeout: float | None = None,
             check: bool = False, **kwargs: Any) -> subprocess.CompletedProcess[Any]:
        """Run a command on a node to completion (`capture_output=True` as in subprocess.run)."""
        if kwargs.pop("capture_output", False):
            kwargs["stdout"] = kwargs["stderr"] = subprocess.PIPE
        proc = self.popen(node, argv, **kwargs)
        try:
            out, err = proc.communicate(timeout=timeout)
        except BaseException:
            proc.kill()
            proc.wait()
            raise
        result = subprocess.CompletedProcess(list(argv), proc.returncode, out, err)
        if check:
            result.check_returncode()
        return result
