"""The package's layers stay as the folders say: no import cycles, no upward imports between subpackages,
and `workloads/` imports nothing from `testbed/`. Imports are read with `ast` (function-level ones too)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
LAYERS = ["errors", "util", "topology", "plan", "state", "backends", "probe", "shaping", "rdma", "deploy", "check", "run",
          "remote", "experiment", "api", "cli", "__main__"]
"""testbed's subpackages (and top-level modules) lowest first: each may import only from those before it."""


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path, name: str, known: set[str]) -> set[str]:
    """The project modules a module imports (`from pkg import mod` counts as pkg.mod where that is a module)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            found.add(base)
            found |= {f"{base}.{a.name}" for a in node.names}
    return {m for m in found if m in known and m != name}


def import_graph(root: Path, packages: tuple[str, ...]) -> dict[str, set[str]]:
    files = {module_name(p, root): p for pkg in packages for p in (root / pkg).rglob("*.py")}
    known = set(files)
    return {name: imports_of(path, name, known) for name, path in files.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle (as a path that ends where it starts), or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


PLAYBOOKS = LAYERS.index("cli") - 0.5
"""playbooks/ (the multi-machine cycle) sits just below the CLI: it may use every testbed layer but the CLI, and
no testbed layer but the CLI may import it."""


def layer_of(module: str) -> float | None:
    parts = module.split(".")
    if parts[0] == "playbooks":
        return PLAYBOOKS
    if parts[0] != "testbed" or len(parts) == 1:
        return None
    return LAYERS.index(parts[1])


def _layer_name(layer: float) -> str:
    return "playbooks" if layer == PLAYBOOKS else LAYERS[int(layer)]


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    bad = []
    for module, targets in graph.items():
        here = layer_of(module)
        for target in targets:
            there = layer_of(target)
            if module.startswith("workloads") and target.startswith("testbed"):
                bad.append(f"{module} -> {target} (workloads must not import testbed)")
            elif here is not None and there is not None and there > here:
                bad.append(f"{module} -> {target} ({_layer_name(here)} may not import {_layer_name(there)})")
    return sorted(bad)


def test_every_subpackage_is_a_known_layer() -> None:
    names = {p.name if p.is_dir() else p.stem for p in (REPO / "testbed").iterdir()
             if (p.is_dir() and (p / "__init__.py").exists()) or (p.suffix == ".py" and p.stem != "__init__")}
    assert names == set(LAYERS), f"add new subpackages to LAYERS (in order): {names ^ set(LAYERS)}"


def test_each_subpackage_says_what_it_owns_and_may_import() -> None:
    for pkg in LAYERS:
        init = REPO / "testbed" / pkg / "__init__.py"
        if init.exists():
            doc = ast.get_docstring(ast.parse(init.read_text())) or ""
            assert doc and ("import" in doc.lower()), f"testbed/{pkg}/__init__.py: say what it owns and may import"


def test_no_import_cycles_and_no_upward_imports() -> None:
    graph = import_graph(REPO, ("testbed", "workloads", "playbooks"))
    assert len(graph) > 40 and "playbooks.cycle" in graph
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph) or [])
    assert upward_imports(graph) == []


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


@pytest.mark.parametrize("lazy", [False, True])
def test_the_check_fails_on_a_cycle(tmp_path: Path, lazy: bool) -> None:
    back = "def f():\n    from testbed.check import verify\n" if lazy else "from testbed.check.verify import X\n"
    root = _tree(tmp_path, {"testbed/__init__.py": "", "testbed/check/__init__.py": "",
                            "testbed/check/verify.py": "from testbed.check import links\nX = 1\n",
                            "testbed/check/links.py": back})
    cycle = find_cycle(import_graph(root, ("testbed",)))
    assert cycle is not None and cycle[0] == cycle[-1] and "testbed.check.links" in cycle


def test_the_check_fails_on_an_upward_import(tmp_path: Path) -> None:
    root = _tree(tmp_path, {"testbed/__init__.py": "", "testbed/shaping/__init__.py": "",
                            "testbed/check/__init__.py": "", "testbed/check/doctor.py": "X = 1\n",
                            "testbed/shaping/registry.py": "def f():\n    from testbed.check.doctor import X\n",
                            "workloads/__init__.py": "", "workloads/worker.py": "import testbed.shaping.registry\n"})
    bad = upward_imports(import_graph(root, ("testbed", "workloads")))
    assert bad == ["testbed.shaping.registry -> testbed.check.doctor (shaping may not import check)",
                   "workloads.worker -> testbed.shaping.registry (workloads must not import testbed)"]


def test_the_check_keeps_playbooks_between_the_layers_and_the_cli(tmp_path: Path) -> None:
    root = _tree(tmp_path, {"testbed/__init__.py": "", "testbed/run/__init__.py": "", "testbed/cli.py": "X = 1\n",
                            "testbed/run/runner.py": "from playbooks.cycle import Y\n",
                            "playbooks/__init__.py": "", "playbooks/cycle.py": "from testbed.cli import X\nY = 1\n"})
    bad = upward_imports(import_graph(root, ("testbed", "playbooks")))
    assert bad == ["playbooks.cycle -> testbed.cli (playbooks may not import cli)",
                   "testbed.run.runner -> playbooks.cycle (run may not import playbooks)"]
