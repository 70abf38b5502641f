"""Bring testbeds up and down: the glue between topology, plan, state and backend."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

from testbed.backends import nsfs
from testbed.backends.base import Backend, BackendError
from testbed.backends.registry import BACKENDS, backend_for
from testbed.plan import Plan, build_plan
from testbed.rdma import softroce
from testbed.rdma.support import rxe_in_namespaces
from testbed.shaping.registry import SHAPERS, resolve
from testbed.state import store as statefile
from testbed.state.records import MininetRecord, ShaperRecord
from testbed.state.store import TestbedState
from testbed.topology import Topology, load_topology
from testbed.util.interrupts import cleanup, raise_if_pending, unwinding
from testbed.util.paths import resolve_topology


@dataclass(frozen=True, slots=True)
class UpResult:
    plan: Plan
    seconds: float
    """Bring-up of namespaces, links, addresses and routes."""
    shaped_seconds: float = 0.0
    """Shaper installation, including the calibration probes."""
    shaper: str = "none"


def up(topology_path: Path, name: str | None = None, backend: str = "netns", shaper: str = "auto",
       switch: str = "auto", rdma: str | None = None) -> UpResult:
    """Validate, plan, deploy and shape, then give every host an rxe device where the topology (or `rdma`)
    asks for SoftRoCE. On any failure or interrupt, nothing is left behind.

    `switch` picks Mininet's DC switch (auto, linuxbridge, ovs, ovs-user); the netns backend has none.
    """
    shaper_name = resolve(shaper)
    topology: Topology = load_topology(topology_path)
    if rdma is not None and rdma != topology.rdma:
        if rdma not in ("none", "softroce"):
            raise BackendError(f"unknown --rdma {rdma!r}; choose none or softroce")
        topology = replace(topology, rdma=rdma)
        if rdma == "softroce":
            softroce.check_topology(topology)
    if topology.rdma == "softroce":
        rxe_in_namespaces().require()
    plan = build_plan(topology, name)
    if backend not in BACKENDS:
        raise BackendError(f"unknown backend {backend!r}; choose one of: {', '.join(BACKENDS)}")
    if switch != "auto" and backend != "mininet":
        raise BackendError(f"--switch {switch} applies to --backend mininet only (the {backend} backend bridges "
                           "each DC inside its router namespace)")
    with unwinding(), statefile.locked():
        if statefile.exists(plan.testbed):
            raise BackendError(f"testbed {plan.testbed!r} is already up; run 'testbed down {plan.testbed}' first "
                               "or give this one another --name")
        state = TestbedState(name=plan.testbed, backend=backend, topology_source=str(topology_path), plan=plan)
        if backend == "mininet":
            state.mininet = MininetRecord(switch_requested=switch)
        started = time.perf_counter()
        made = backend_for(state)
        try:
            try:
                made.deploy(plan)
            except nsfs.SysctlRefused as exc:
                raise BackendError(f"{topology_path}: {exc.strerror}") from None
            deployed = time.perf_counter() - started
            state.shaper = ShaperRecord(name=shaper_name)
            state.save()
            if shaper_name in SHAPERS:
                SHAPERS[shaper_name](made).apply(plan)
            state.save()
            if plan.rdma == "softroce":
                softroce.attach(made, plan)
        except BaseException:
            with cleanup():
                if state.path.exists():       # a backend that failed mid-deploy has already removed its own
                    _destroy(made)
            raise
        return UpResult(plan=plan, seconds=deployed, shaped_seconds=time.perf_counter() - started - deployed,
                        shaper=shaper_name)


def down(name: str) -> float:
    """Remove a testbed (also a half-built one whose creator died). Returns the seconds it took."""
    with unwinding(), cleanup(), statefile.locked():
        if not statefile.exists(name):
            raise BackendError(f"no testbed named {name!r} is up; 'testbed status' lists them")
        started = time.perf_counter()
        _destroy(backend_for(TestbedState.load(name)))
        return time.perf_counter() - started


def _destroy(backend: Backend) -> None:
    """Remove the rxe devices first (by name), then everything else; devices still registered are an error."""
    rdma = backend.state.rdma
    softroce.detach(backend)
    backend.destroy()
    left = softroce.leftover(rdma) if rdma else []
    if left:
        raise BackendError(f"rxe devices still registered after down: {', '.join(left)} (remove them with "
                           "'rdma link delete NAME')")


def resolve_name(name: str | None) -> str:
    """The testbed a command means: the one given, or the only one up."""
    if name:
        return name
    names = [s.name for s in statefile.list_states()]
    if len(names) == 1:
        return names[0]
    if not names:
        raise BackendError("no testbed is up; bring one up with 'testbed up TOPOLOGY'")
    raise BackendError(f"several testbeds are up ({', '.join(names)}); name one")


def open_backend(name: str | None) -> Backend:
    """The backend of a running testbed."""
    resolved = resolve_name(name)
    if not statefile.exists(resolved):
        raise BackendError(f"no testbed named {resolved!r} is up; 'testbed status' lists them")
    return backend_for(TestbedState.load(resolved))


def find_node(node: str, name: str | None) -> Backend:
    """The backend of the testbed that has `node` (searching all running testbeds when no name is given)."""
    if name:
        return open_backend(name)
    owners = [s for s in statefile.list_states() if s.plan.has_node(node)]
    if len(owners) == 1:
        return backend_for(owners[0])
    if not owners:
        raise BackendError(f"no running testbed has a node named {node!r}; 'testbed status' lists the nodes")
    raise BackendError(f"node {node!r} exists in {', '.join(s.name for s in owners)}; choose one with --name")


def hosts_of(target: str) -> list[tuple[str, str]]:
    """(host, DC) pairs in pipeline order of a running testbed or of a topology, without bringing it up (so
    that a run's options are checked against it first)."""
    if statefile.exists(target):
        return [(h.name, h.dc) for h in TestbedState.load(target).plan.hosts]
    return list(load_topology(resolve_topology(target)).hosts)


@contextmanager
def testbed_for(target: str, *, name: str | None = None, backend: str = "netns", shaper: str = "auto",
                switch: str = "auto", rdma: str | None = None,
                log: Callable[[str], None] = print) -> Iterator[Backend]:
    """The backend of the running testbed named `target`, or of a topology (file or shipped name) brought up
    for the block and removed after it, also when the block fails or SIGTERM/SIGHUP/Ctrl-C interrupt it."""
    if statefile.exists(target):
        yield open_backend(target)
        return
    path = resolve_topology(target)
    owned = name or load_topology(path).name
    with unwinding():
        try:
            result = up(path, owned, backend=backend, shaper=shaper, switch=switch, rdma=rdma)
            raise_if_pending()
            log(f"testbed {owned} up ({result.shaper}); it is removed after the run")
            yield open_backend(owned)
        finally:
            if statefile.exists(owned) and TestbedState.load(owned).owner_pid == os.getpid():
                down(owned)
