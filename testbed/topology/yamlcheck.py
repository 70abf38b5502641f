"""Reading a YAML tree with every problem collected: the checker the topology, profile and other loaders share.

`UniqueKeyLoader` is PyYAML's SafeLoader that refuses a duplicate key instead of keeping the last one;
`YamlChecker` collects (key path, problem, fix) while a loader walks the tree, so that a file's every problem is
said at once; `join_path` spells a key path (`links[2].b`)."""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable
from typing import Any

import yaml

from testbed.topology.errors import Problem
from testbed.util import units

NAME_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,27}$")
NAME_RULE = "names are 1-28 characters of a-z, 0-9 and '-', starting with a letter or digit"

class UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate mapping keys instead of silently keeping the last one."""


def _construct_mapping(loader: UniqueKeyLoader, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        try:
            hash(key)
        except TypeError:
            raise yaml.constructor.ConstructorError(
                None, None, f"a key must be a name, not a {type(key).__name__}", key_node.start_mark) from None
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r} (each key may appear once)", key_node.start_mark)
        seen.add(key)
    return yaml.SafeLoader.construct_mapping(loader, node, deep)


UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


class YamlChecker:
    """Collects problems while reading a raw YAML tree."""

    def __init__(self) -> None:
        self.problems: list[Problem] = []

    def add(self, path: str, problem: str, fix: str) -> None:
        item = Problem(path, problem, fix)
        if item not in self.problems:
            self.problems.append(item)

    def mapping(self, value: Any, path: str, allowed: set[str]) -> dict[str, Any]:
        if value is None:
            return {}
        if not isinstance(value, dict):
            self.add(path, f"expected a mapping, got {type(value).__name__} {value!r}",
                     f"write it as keys: {', '.join(sorted(allowed))}")
            return {}
        for key in value:
            if key not in allowed:
                close = difflib.get_close_matches(str(key), sorted(allowed), n=1)
                hint = f"did you mean {close[0]!r}?" if close else f"allowed keys: {', '.join(sorted(allowed))}"
                self.add(join_path(path, str(key)), f"unknown key {key!r}", hint)
        return {k: v for k, v in value.items() if k in allowed}

    def quantity(self, value: Any, path: str, parse: Callable[[Any], float], *, minimum: float = 0.0,
                 strict: bool = False, maximum: float | None = None) -> float | None:
        try:
            number = parse(value)
        except units.UnitError as exc:
            self.add(path, exc.problem, exc.fix)
            return None
        if number < minimum or (strict and number == minimum):
            op = ">" if strict else ">="
            self.add(path, f"{value!r} is out of range", f"it must be {op} {minimum:g}")
            return None
        if maximum is not None and number > maximum:
            self.add(path, f"{value!r} is too large", f"it must be <= {maximum:g}")
            return None
        return number

    def boolean(self, value: Any, path: str) -> bool | None:
        if isinstance(value, bool):
            return value
        self.add(path, f"expected true or false, got {value!r}", "write true or false (no quotes)")
        return None

    def name(self, value: Any, path: str, what: str) -> str | None:
        if isinstance(value, str) and NAME_RE.match(value):
            return value
        self.add(path, f"invalid {what} name {value!r}", NAME_RULE)
        return None


def join_path(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else key
