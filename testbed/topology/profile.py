"""Deployment profiles (profiles/*.yaml): a named model on named accelerators as a cost model, every number
with its source.

A profile states the model's published shape, the accelerator (dense BF16 peak, HBM, a kernel-level
utilisation), the node a stage runs on (`tp` devices in tensor parallelism, its efficiency), the fabric and
a default micro-batch shape. Compute, message bytes and stash follow from the micro-batch size b and the
sequence length s (docs/compute.md):

  layer forward FLOPs   2*b*s*P_layer + 4*b*s^2*h, P_layer = 2*h*h (q, o) + 2*h*kv_heads*(h/heads) (k, v)
                        + 3*h*f (SwiGLU); attention counted in full, without causal masking's half
  LM head (last stage)  2*b*s*h*V; every backward twice its forward (arXiv:2104.04473, section 5.1)
  span                  FLOPs / (tp * peak * utilisation * tp_efficiency)
  message               b*s*h*2 bytes (BF16)
  stash per layer       34*s*b*h bytes (selective recomputation, arXiv:2205.05198, section 5)

It turns into a cost table (workloads/compute.py) for a stage count, a shape and the rate scales of the
links between the stages. A file may carry `variants:` that restate some numbers (`NAME@VARIANT`).
Validated once at load, with every problem named by file, key and fix (as topology files are).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from testbed.topology.errors import Problem, TopologyError
from testbed.topology.yamlcheck import UniqueKeyLoader, YamlChecker, join_path
from testbed.util import units
from testbed.util.paths import REPO_ROOT
from workloads.compute import PROFILE, REAL, REPLAY, ComputeMode, CostTable, PhaseCost, StageCost

PROFILES_DIR = REPO_ROOT / "profiles"

WHOLE, NUMBER, SHARE, SIZE, RATE = "whole", "number", "share", "size", "rate"
SECTIONS: dict[str, dict[str, str]] = {
    "model": {"layers": WHOLE, "hidden": WHOLE, "ffn_hidden": WHOLE, "heads": WHOLE, "kv_heads": WHOLE,
              "vocab": WHOLE},
    "shape": {"microbatch_size": WHOLE, "seq_len": WHOLE},
    "accelerator": {"peak_tflops": NUMBER, "hbm": SIZE, "utilisation": SHARE},
    "node": {"tp": WHOLE, "tp_efficiency": SHARE},
    "memory": {"resident_per_param": NUMBER},
    "network": {"fabric_rate": RATE},
}
"""Every key a profile has, by section, and how its value is read. All are required, each as {value, source}."""
EXPECTED = {WHOLE: ("a whole number >= 1", "e.g. 32"), NUMBER: ("a positive number", "e.g. 16"),
            SHARE: ("a share of the peak in (0, 1]", "e.g. 0.75")}

BACKWARD_FACTOR = 2.0
"""A backward costs twice its forward's FLOPs (Narayanan et al. 2021, arXiv:2104.04473, section 5.1)."""
STASH_PER_TOKEN_HIDDEN = 34
"""Bytes a layer keeps per token and hidden unit with selective recomputation (Korthikanti et al. 2022)."""
BYTES_PER_VALUE = 2
"""BF16."""


class ProfileError(TopologyError):
    """A deployment profile is invalid or unknown; every problem with file, key and fix."""

    what = "deployment profile"


@dataclass(frozen=True, slots=True)
class StageEstimate:
    """One stage (node) at one micro-batch shape: what a planner weighs."""

    layers: int
    forward_s: float
    backward_s: float
    stash_bytes: int
    """Per pending micro-batch on the node: its layers' stash and the stage's input and output."""
    resident_bytes: int
    """Weights, gradients and optimizer state of the stage's parameters, on the node."""


@dataclass(frozen=True, slots=True)
class DeploymentProfile:
    """One deployment as its file states it (FLOP/s, bytes, bits per second), and its cost model.

    Memory is per node: a stage is one node of `tp` devices, its HBM `tp` x the device's, and its stash and
    resident state the node's sums; per device they are 1/tp of that, evenly split (tensor parallelism with
    sequence parallelism splits weights and activations evenly, arXiv:2205.05198, section 4.2.2)."""

    name: str
    description: str
    path: str
    layers: int
    hidden: int
    ffn_hidden: int
    heads: int
    kv_heads: int
    vocab: int
    microbatch_size: int
    """The default shape, for runs without a planner."""
    seq_len: int
    peak_flops: float
    """Dense BF16 FLOP/s of one device."""
    device_hbm_bytes: int
    utilisation: float
    tp: int
    tp_efficiency: float
    resident_per_param: float
    fabric_rate_bps: float
    """The node's NIC rate within a DC."""
    sources: dict[str, str]
    """`section.key` -> where the number comes from."""
    variant: str = ""
    variants: tuple[str, ...] = field(default_factory=tuple)

    @property
    def label(self) -> str:
        """The name `--compute` gives: `NAME` or `NAME@VARIANT`."""
        return f"{self.name}@{self.variant}" if self.variant else self.name

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def layer_weights(self) -> int:
        """A layer's matmul weights: q and o (h*h each), k and v (h*kv_heads*head_dim each), SwiGLU's 3*h*f."""
        h = self.hidden
        return 2 * h * h + 2 * h * self.kv_heads * self.head_dim + 3 * h * self.ffn_hidden

    @property
    def params(self) -> int:
        """Every parameter: layers (weights, two RMSNorm gains), embedding and LM head (untied), final norm."""
        return self.layers * (self.layer_weights + 2 * self.hidden) + 2 * self.vocab * self.hidden + self.hidden

    @property
    def stage_rate(self) -> float:
        """FLOP/s of one stage: tp * peak * utilisation * tp_efficiency."""
        return self.tp * self.peak_flops * self.utilisation * self.tp_efficiency

    @property
    def hbm_bytes(self) -> int:
        """The node's HBM: tp x the device's."""
        return self.tp * self.device_hbm_bytes

    def layer_forward_flops(self, b: int, s: int) -> float:
        """2*b*s*P_layer for the projections and the MLP, 4*b*s^2*h for QK^T and AV (no causal halving)."""
        return 2.0 * b * s * self.layer_weights + 4.0 * b * s * s * self.hidden

    def head_forward_flops(self, b: int, s: int) -> float:
        return 2.0 * b * s * self.hidden * self.vocab

    def activation_bytes(self, b: int, s: int) -> int:
        """One micro-batch's hidden states between two stages: b*s*h*2 bytes."""
        return BYTES_PER_VALUE * b * s * self.hidden

    def stash_per_layer_bytes(self, b: int, s: int) -> int:
        """What a layer keeps for its backward on the node: 34*s*b*h bytes (34*s*b*h/tp per device)."""
        return STASH_PER_TOKEN_HIDDEN * s * b * self.hidden

    def layers_per_stage(self, stages: int) -> list[int]:
        """The layers each stage holds: evenly, the first stages one more where they do not divide."""
        if not 1 <= stages <= self.layers:
            raise ProfileError(self.path, [Problem("model.layers", f"{self.layers} layers cannot fill {stages} stages",
                                                   f"run at most {self.layers} stages (--stages)")])
        base, extra = divmod(self.layers, stages)
        return [base + (1 if s < extra else 0) for s in range(stages)]

    def stage_params(self, stages: int) -> list[int]:
        """Parameters per stage: its layers, the embedding on the first, the LM head and final norm on the last."""
        per_layer = self.layer_weights + 2 * self.hidden
        params = [n * per_layer for n in self.layers_per_stage(stages)]
        params[0] += self.vocab * self.hidden
        params[-1] += self.vocab * self.hidden + self.hidden
        return params

    def shape(self, microbatch_size: int | None = None, seq_len: int | None = None) -> tuple[int, int]:
        """(b, s): the given ones, the profile's default where None; each a whole number >= 1."""
        b = self.microbatch_size if microbatch_size is None else microbatch_size
        s = self.seq_len if seq_len is None else seq_len
        for what, n in (("micro-batch size", b), ("sequence length", s)):
            if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                raise ProfileError(self.path, [Problem("shape", f"{what} {n!r} is no shape",
                                                       "give whole numbers >= 1 for b and s")])
        return b, s

    def stage_costs(self, stages: int, b: int, s: int) -> list[StageEstimate]:
        """Each stage's forward and backward, stash and resident bytes at shape (b, s): cheap enough for a planner
        to call for thousands of shapes a second."""
        b, s = self.shape(b, s)
        rate = self.stage_rate
        layer_f = self.layer_forward_flops(b, s) / rate
        head_f = self.head_forward_flops(b, s) / rate
        stash, edges = self.stash_per_layer_bytes(b, s), 2 * self.activation_bytes(b, s)
        out = []
        for i, (n, params) in enumerate(zip(self.layers_per_stage(stages), self.stage_params(stages), strict=True)):
            f = n * layer_f + (head_f if i == stages - 1 else 0.0)
            out.append(StageEstimate(n, f, BACKWARD_FACTOR * f, n * stash + edges,
                                     int(self.resident_per_param * params)))
        return out

    def table(self, stages: int, rate_scale: list[float], microbatch_size: int | None = None,
              seq_len: int | None = None) -> CostTable:
        """The cost table of `stages` stages at shape (b, s) (None: the default) with these rate scales on the
        links between them. Its resident bytes are the largest stage's."""
        b, s = self.shape(microbatch_size, seq_len)
        est = self.stage_costs(stages, b, s)
        costs = [StageCost(PhaseCost.stated(e.forward_s), PhaseCost.stated(e.backward_s), e.stash_bytes) for e in est]
        return CostTable(f"profile:{self.label}", f"{self.description}; micro-batch {b} x {s} tokens", costs,
                         self.activation_bytes(b, s), b, list(rate_scale), self.hbm_bytes,
                         max(e.resident_bytes for e in est), b * s)

    def inflight_capacity(self, stages: int, microbatch_size: int | None = None, seq_len: int | None = None) -> int:
        """Micro-batches whose stash every stage's HBM holds beside its resident state (the tightest stage's)."""
        est = self.stage_costs(stages, *self.shape(microbatch_size, seq_len))
        return max(0, min((self.hbm_bytes - e.resident_bytes) // e.stash_bytes for e in est))


def shipped_profiles() -> list[Path]:
    return sorted(PROFILES_DIR.glob("*.yaml"))


def split_variant(text: str) -> tuple[str, str]:
    """`NAME@VARIANT` -> (NAME, VARIANT); no variant: (text, "")."""
    name, at, variant = text.rpartition("@")
    if not at or not name or "/" in variant:
        return text, ""
    return name, variant


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


def resolve_profile(text: str) -> DeploymentProfile:
    """`--compute NAME`, `NAME@VARIANT` or a path (with `@VARIANT`): the profile, loaded and checked."""
    name, variant = split_variant(text)
    return load_profile(find_profile(name), variant)


def load_profile(path: str | Path, variant: str = "") -> DeploymentProfile:
    """Read and validate a profile file (and its `variant`, if named); every problem at once, each with file,
    key and fix. Variants are checked whether chosen or not."""
    source = str(path)
    raw = _read(path)
    check = YamlChecker()
    top = check.mapping(raw, "", {"name", "description", "variants", *SECTIONS})
    entries = _base_entries(top, check)
    variants = _variant_entries(top.get("variants"), check)
    if variant and variant not in variants:
        close = difflib.get_close_matches(variant, list(variants), n=1)
        check.add("variants", f"no variant {variant!r}", f"did you mean {close[0]!r}?" if close else
                  ("choose one of: " + ", ".join(variants) if variants else f"drop '@{variant}' (the file has none)"))
    values, sources = _values(entries, check)
    _consistent(values, check)
    restated = {name_of: _values(entries_of, check) for name_of, entries_of in variants.items()}
    for name_of, (numbers, _) in restated.items():
        if set(numbers) & SPLITS:
            _consistent({**values, **numbers}, check, join_path("variants", name_of))
    if variant in restated:
        values, sources = {**values, **restated[variant][0]}, {**sources, **restated[variant][1]}
    name = top.get("name")
    if not isinstance(name, str) or not name:
        check.add("name", "missing", "name the profile (its file's stem)")
    if check.problems:
        raise ProfileError(source, check.problems)
    return _profile(str(name), _description(top, variant), source, values, sources, variant, tuple(variants))


def _read(path: str | Path) -> Any:
    source = str(path)
    try:
        return yaml.load(Path(path).read_text(), Loader=UniqueKeyLoader)  # noqa: S506 - SafeLoader subclass
    except OSError as exc:
        raise ProfileError(source, [Problem("", f"cannot read file: {exc.strerror}",
                                            "give a profile's name (profiles/) or path")]) from None
    except yaml.YAMLError as exc:
        raise ProfileError(source, [Problem("", f"YAML syntax error: {exc}", "fix the YAML syntax")]) from None


Entry = tuple[str, Any, str]
"""(key path in the file, value, source) of one `{value, source}` entry."""


def _entry(raw: Any, where: str, check: YamlChecker) -> Entry:
    entry = check.mapping(raw, where, {"value", "source"})
    if not str(entry.get("source", "")).strip():
        check.add(join_path(where, "source"), "no source", "say where the number comes from (a paper, a datasheet)")
    return where, entry.get("value"), str(entry.get("source", "")).strip()


def _base_entries(top: dict[str, Any], check: YamlChecker) -> dict[str, Entry]:
    """Every section's every key, as required."""
    out: dict[str, Entry] = {}
    for section, keys in SECTIONS.items():
        if section not in top:
            check.add(section, "missing section", f"add {section}: with {', '.join(keys)}")
            continue
        got = check.mapping(top[section], section, set(keys))
        for key in keys:
            where = join_path(section, key)
            if key not in got:
                check.add(where, "missing", f"add {key}: {{value: ..., source: \"where it comes from\"}}")
                continue
            out[where] = _entry(got[key], where, check)
    return out


def _variant_entries(raw: Any, check: YamlChecker) -> dict[str, dict[str, Entry]]:
    """`variants: {NAME: {description, SECTION: {KEY: {value, source}}}}`: each restates only some keys."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        check.add("variants", f"expected a mapping, got {type(raw).__name__}", "write variants: {NAME: {...}}")
        return {}
    out: dict[str, dict[str, Entry]] = {}
    for name, spec in raw.items():
        base = join_path("variants", str(name))
        if not isinstance(name, str) or not name or "@" in name or "/" in name:
            check.add(base, f"invalid variant name {name!r}", "name it with letters, digits and '-'")
            continue
        got = check.mapping(spec, base, {"description", *SECTIONS})
        entries: dict[str, Entry] = {}
        for section in set(got) & set(SECTIONS):
            for key, value in check.mapping(got[section], join_path(base, section), set(SECTIONS[section])).items():
                entries[join_path(section, key)] = _entry(value, join_path(join_path(base, section), key), check)
        if not entries:
            check.add(base, "restates no number", "give at least one SECTION: {KEY: {value, source}}")
        out[name] = entries
    return out


def _values(entries: dict[str, Entry], check: YamlChecker) -> tuple[dict[str, float], dict[str, str]]:
    values: dict[str, float] = {}
    sources: dict[str, str] = {}
    for key, (where, value, source) in entries.items():
        section, name = key.split(".")
        number = _number(value, join_path(where, "value"), SECTIONS[section][name], check)
        if number is not None:
            values[key], sources[key] = number, source
    return values, sources


def _number(value: Any, where: str, kind: str, check: YamlChecker) -> float | None:
    if kind == SIZE:
        return check.quantity(value, where, units.parse_size, strict=True)
    if kind == RATE:
        return check.quantity(value, where, units.parse_rate, strict=True)
    what, example = EXPECTED[kind]
    number = not isinstance(value, bool) and isinstance(value, int | float) and value > 0
    if not number or (kind == WHOLE and value != int(value)):
        check.add(where, f"expected {what}, got {value!r}", f"write {what}, {example}")
    elif kind == SHARE and value > 1:
        check.add(where, f"{value!r} is more than the whole peak", f"write {what}, {example}")
    else:
        return float(value)
    return None


SPLITS = {"model.hidden", "model.heads", "model.kv_heads", "node.tp"}
"""The keys whose values must divide each other."""


def _consistent(v: dict[str, float], check: YamlChecker, within: str = "") -> None:
    """The shape splits: heads divide hidden, kv heads divide heads, tp divides the heads (`within`: a variant's
    numbers over the file's)."""
    hidden, heads, kv, tp = (v.get(k) for k in ("model.hidden", "model.heads", "model.kv_heads", "node.tp"))
    if hidden and heads and hidden % heads:
        check.add(join_path(within, "model.heads"), f"{heads:g} heads do not divide hidden {hidden:g}",
                  "give the published heads (head dim = hidden / heads)")
    if heads and kv and (kv > heads or heads % kv):
        check.add(join_path(within, "model.kv_heads"), f"{kv:g} key/value heads do not divide {heads:g} heads",
                  "give the published kv heads (= heads without GQA)")
    if heads and tp and heads % tp:
        check.add(join_path(within, "node.tp"), f"{heads:g} heads do not split over {tp:g} devices",
                  "give a tp that divides the heads")


def _description(top: dict[str, Any], variant: str) -> str:
    text = str(top.get("description", ""))
    extra = (top.get("variants") or {}).get(variant) if variant else None
    note = extra.get("description") if isinstance(extra, dict) else None
    return f"{text} ({variant}: {note})" if note else (f"{text} ({variant})" if variant else text)


def _profile(name: str, description: str, path: str, v: dict[str, float], sources: dict[str, str], variant: str,
             variants: tuple[str, ...]) -> DeploymentProfile:
    n = {k: int(x) for k, x in v.items() if x == int(x)}
    return DeploymentProfile(
        name=name, description=description, path=path, layers=n["model.layers"], hidden=n["model.hidden"],
        ffn_hidden=n["model.ffn_hidden"], heads=n["model.heads"], kv_heads=n["model.kv_heads"],
        vocab=n["model.vocab"], microbatch_size=n["shape.microbatch_size"], seq_len=n["shape.seq_len"], tp=n["node.tp"],
        peak_flops=v["accelerator.peak_tflops"] * 1e12, device_hbm_bytes=int(v["accelerator.hbm"]),
        utilisation=v["accelerator.utilisation"], tp_efficiency=v["node.tp_efficiency"],
        resident_per_param=v["memory.resident_per_param"], fabric_rate_bps=v["network.fabric_rate"],
        sources=sources, variant=variant, variants=variants)


def parse_compute(text: str) -> ComputeMode:
    """`--compute`: `real`, `replay`, `replay:FILE`, or a profile's name (profiles/NAME.yaml) or path, with an
    optional `@VARIANT`, checked now (a missing table or an invalid profile fails before anything is brought up)."""
    text = (text or "").strip()
    if text in (REAL, REPLAY):
        return ComputeMode(text)
    if text.startswith("replay:"):
        path = text.removeprefix("replay:")
        CostTable.load(path)
        return ComputeMode(REPLAY, path)
    name, variant = split_variant(text)
    path = find_profile(name)
    load_profile(path, variant)
    shown = path.stem if path.resolve().parent == PROFILES_DIR.resolve() else str(path)
    return ComputeMode(PROFILE, f"{shown}@{variant}" if variant else shown)
