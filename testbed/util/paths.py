"""Where the project's files are, and how a topology argument (name or path) resolves to a file."""

from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent.parent
TOPOLOGY_DIR = REPO_ROOT / "topologies"
DEFAULT_TOPOLOGY = "2dc-1000km"


def resolve_topology(arg: str) -> Path:
    """A path as given, or a shipped topology by name (`2dc-1000km` -> topologies/2dc-1000km.yaml)."""
    path = Path(arg)
    if path.exists() or path.suffix in (".yaml", ".yml") or "/" in arg:
        return path
    return TOPOLOGY_DIR / f"{arg}.yaml"


def shipped_topologies() -> list[Path]:
    return sorted(TOPOLOGY_DIR.glob("*.yaml"))
