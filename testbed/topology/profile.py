"""Deployment profiles (profiles/*.yaml): a named model on named accelerators, every number with its source.

A profile turns into a cost table (workloads/compute.py) for a given stage count and the links between the
stages: each stage's forward and backward per micro-batch (its layers' times, the LM head on the last), the
activation and stash bytes in the deployment's units, and per link the rate scale (deployment rate over the
emulated one) by which the bytes on the wire shrink, so transfer, round trip and compute keep their ratios at
1:1 time. Validated once at load, with every problem named by file, key and fix (as topology files are).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from testbed.topology.errors import Problem, TopologyError
from testbed.topology.loader import _Checker, _join, _UniqueKeyLoader
from testbed.util import units
from testbed.util.paths import REPO_ROOT
from workloads.compute import PROFILE, REAL, REPLAY, ComputeMode, CostTable, PhaseCost, StageCost

PROFILES_DIR = REPO_ROOT / "profiles"

SECTIONS: dict[str, dict[str, Any]] = {
    "model": {"layers": int, "hidden": int, "vocab": int, "seq_len": int, "microbatch_size": int, "params": float},
    "compute": {"layer_forward": units.parse_time, "layer_backward": units.parse_time,
                "head_forward": units.parse_time, "head_backward": units.parse_time},
    "memory": {"activation_bytes": units.parse_size, "stash_per_layer": units.parse_size, "hbm": units.parse_size,
               "resident_per_param": float},
    "network": {"fabric_rate": units.parse_rate},
}
"""Every key a profile has, by section, and how its value is read. All are required, each as {value, source}."""


class ProfileError(TopologyError):
    """A deployment profile is invalid or unknown; every problem with file, key and fix."""

    what = "deployment profile"


@dataclass(frozen=True, slots=True)
class DeploymentProfile:
    """One deployment, as its file states it (seconds, bytes, bits per second)."""

    name: str
    description: str
    path: str
    layers: int
    hidden: int
    vocab: int
    seq_len: int
    microbatch_size: int
    params: float
    layer_forward_s: float
    layer_backward_s: float
    head_forward_s: float
    head_backward_s: float
    activation_bytes: int
    stash_per_layer_bytes: int
    hbm_bytes: int
    resident_per_param: float
    fabric_rate_bps: float
    sources: dict[str, str]
    """`section.key` -> where the number comes from."""

    def layers_per_stage(self, stages: int) -> list[int]:
        """The layers each stage holds: evenly, the first stages one more where they do not divide."""
        if not 1 <= stages <= self.layers:
            raise ProfileError(self.path, [Problem("model.layers", f"{self.layers} layers cannot fill {stages} stages",
                                                   f"run at most {self.layers} stages (--stages)")])
        base, extra = divmod(self.layers, stages)
        return [base + (1 if s < extra else 0) for s in range(stages)]

    def table(self, stages: int, rate_scale: list[float]) -> CostTable:
        """The cost table of `stages` stages with these rate scales on the links between them."""
        costs = []
        for s, n in enumerate(self.layers_per_stage(stages)):
            last = s == stages - 1
            f = n * self.layer_forward_s + (self.head_forward_s if last else 0.0)
            b = n * self.layer_backward_s + (self.head_backward_s if last else 0.0)
            stash = n * self.stash_per_layer_bytes + 2 * self.activation_bytes   # plus the stage's input and output
            costs.append(StageCost(PhaseCost.stated(f), PhaseCost.stated(b), stash))
        resident = int(self.resident_per_param * self.params / stages)
        return CostTable(f"profile:{self.name}", self.description, costs, self.activation_bytes, self.microbatch_size,
                         list(rate_scale), self.hbm_bytes, resident, self.microbatch_size * self.seq_len)

    def inflight_capacity(self, stages: int) -> int:
        """Micro-batches whose stash the busiest stage's HBM holds beside its resident state."""
        table = self.table(stages, [])
        free = self.hbm_bytes - (table.resident_bytes or 0)
        return max(0, free // max(s.stash_bytes for s in table.stages))


def shipped_profiles() -> list[Path]:
    return sorted(PROFILES_DIR.glob("*.yaml"))


def find_profile(name: str) -> Path:
    """A profile by name (profiles/NAME.yaml) or path; an unknown one names the shipped ones."""
    path = Path(name)
    if path.suffix in (".yaml", ".yml") and path.is_file():
        return path
    shipped = {p.stem: p for p in shipped_profiles()}
    if name in shipped:
        return shipped[name]
    close = difflib.get_close_matches(name, list(shipped), n=1)
    hint = f"did you mean {close[0]!r}?" if close else "choose one of: real, replay, replay:FILE, " + ", ".join(shipped)
    raise ProfileError(str(name), [Problem("", f"--compute {name!r} is neither real, replay, replay:FILE nor a "
                                               "deployment profile", hint)])


def load_profile(path: str | Path) -> DeploymentProfile:
    """Read and validate a profile file; every problem at once, each with file, key and fix."""
    source = str(path)
    try:
        raw = yaml.load(Path(path).read_text(), Loader=_UniqueKeyLoader)  # noqa: S506 - SafeLoader subclass
    except OSError as exc:
        raise ProfileError(source, [Problem("", f"cannot read file: {exc.strerror}",
                                            "give a profile's name (profiles/) or path")]) from None
    except yaml.YAMLError as exc:
        raise ProfileError(source, [Problem("", f"YAML syntax error: {exc}", "fix the YAML syntax")]) from None
    check = _Checker()
    top = check.mapping(raw, "", {"name", "description", *SECTIONS})
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for section, keys in SECTIONS.items():
        if section not in top:
            check.add(section, "missing section", f"add {section}: with {', '.join(keys)}")
            continue
        got = check.mapping(top[section], section, set(keys))
        for key, parse in keys.items():
            where = _join(section, key)
            if key not in got:
                check.add(where, "missing", f"add {key}: {{value: ..., source: \"where it comes from\"}}")
                continue
            entry = check.mapping(got[key], where, {"value", "source"})
            if not str(entry.get("source", "")).strip():
                check.add(_join(where, "source"), "no source", "say where the number comes from (a paper, a datasheet)")
            number = _number(entry.get("value"), where, parse, check)
            if number is not None:
                values[f"{section}.{key}"] = number
                sources[f"{section}.{key}"] = str(entry.get("source", "")).strip()
    name = top.get("name")
    if not isinstance(name, str) or not name:
        check.add("name", "missing", "name the profile (its file's stem)")
    if check.problems:
        raise ProfileError(source, check.problems)
    v = values
    return DeploymentProfile(
        name=str(name), description=str(top.get("description", "")), path=source,
        layers=int(v["model.layers"]), hidden=int(v["model.hidden"]), vocab=int(v["model.vocab"]),
        seq_len=int(v["model.seq_len"]), microbatch_size=int(v["model.microbatch_size"]), params=float(v["model.params"]),
        layer_forward_s=v["compute.layer_forward"], layer_backward_s=v["compute.layer_backward"],
        head_forward_s=v["compute.head_forward"], head_backward_s=v["compute.head_backward"],
        activation_bytes=int(v["memory.activation_bytes"]), stash_per_layer_bytes=int(v["memory.stash_per_layer"]),
        hbm_bytes=int(v["memory.hbm"]), resident_per_param=float(v["memory.resident_per_param"]),
        fabric_rate_bps=float(v["network.fabric_rate"]), sources=sources)


def _number(value: Any, where: str, parse: Any, check: _Checker) -> float | None:
    if parse in (int, float):
        if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
            check.add(_join(where, "value"), f"expected a positive number, got {value!r}", "write a number, e.g. 32")
            return None
        if parse is int and value != int(value):
            check.add(_join(where, "value"), f"expected a whole number, got {value!r}", "write an integer")
            return None
        return float(value)
    return check.quantity(value, _join(where, "value"), parse, strict=True)


def parse_compute(text: str) -> ComputeMode:
    """`--compute`: `real`, `replay`, `replay:FILE`, or a profile's name (profiles/NAME.yaml) or path, checked
    now (a missing table or an invalid profile fails before anything is brought up)."""
    text = (text or "").strip()
    if text in (REAL, REPLAY):
        return ComputeMode(text)
    if text.startswith("replay:"):
        path = text.removeprefix("replay:")
        CostTable.load(path)
        return ComputeMode(REPLAY, path)
    path = find_profile(text)
    load_profile(path)
    return ComputeMode(PROFILE, path.stem if path.resolve().parent == PROFILES_DIR.resolve() else str(path))
