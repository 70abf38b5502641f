"""What every backend whose nodes are named network namespaces (/run/netns/tb-<testbed>-<node>) shares.

The netns backend creates those namespaces itself; the Mininet backend pins the namespaces of Mininet's host
shells there. From then on both are entered, shaped, probed and removed the same way.
"""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from typing import Any

from testbed.backends import cgroups, nsfs
from testbed.backends.base import Backend, BackendError
from testbed.state.records import terminate_records
from testbed.util import procs


class NamespaceBackend(Backend):
    """A backend whose nodes are the plan's named namespaces."""

    def popen(self, node: str, argv: Sequence[str], **kwargs: Any) -> subprocess.Popen[Any]:
        netns = self.netns_of(node)
        if not nsfs.exists(netns):
            raise BackendError(f"node {node!r}: namespace {netns} is gone; run 'testbed down {self.state.name}' "
                               "and bring the testbed up again")
        return subprocess.Popen(list(argv), preexec_fn=lambda: nsfs.enter_in_child(netns), **kwargs)  # noqa: PLW1509

    def netns_path(self, node: str) -> str:
        return nsfs.path_of(self.netns_of(node))

    def netns_of(self, node: str) -> str:
        plan = self.state.plan
        if plan.has_node(node):
            return plan.node(node).netns
        known = ", ".join(n.name for n in plan.nodes)
        raise BackendError(f"no node {node!r} in testbed {self.state.name!r}; nodes: {known}")

    def check_names_free(self, names: Sequence[str]) -> None:
        clashes = [ns for ns in names if nsfs.exists(ns)]
        if clashes:
            raise BackendError(f"namespace {clashes[0]} already exists (another testbed named {self.state.name!r}?); "
                               f"run 'testbed down {self.state.name}' or pick another --name")

    def remove_namespaces(self) -> None:
        """Stop every recorded process and every process inside the namespaces, then remove the namespaces."""
        self.state.phase = "destroying"
        inodes = [ino for ino in (nsfs.inode(ns) for ns in self.state.netns) if ino is not None]
        terminate_records(self.state.processes)
        procs.terminate(procs.pids_in_netns(inodes))
        failures = cgroups.remove_all(self.state.cgroups)
        for ns in self.state.netns:
            try:
                nsfs.remove(ns)
            except OSError as exc:
                failures.append(f"{ns}: {exc}")
        if failures:
            self.state.save()
            raise BackendError("could not remove namespaces: " + "; ".join(failures))
