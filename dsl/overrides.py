"""`--set key.path=value` overrides, applied to the parsed document before validation.

Layers are addressed by name (`neuralnet.layers.fc1.units=256`); other lists by index. Values
are read as YAML scalars or flow collections (`3`, `0.5`, `true`, `[1, 2]`, `{init: gaussian}`).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from typing import Any

import yaml

from dsl.errors import JobSpecError, SpecIssue


def parse_override(text: str) -> tuple[str, Any]:
    """`"a.b=3"` -> `("a.b", 3)`."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise JobSpecError(
            SpecIssue(
                text, "an override must look like key.path=value", hint="e.g. train_steps=500"
            )
        )
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as exc:
        raise JobSpecError(SpecIssue(key, f"cannot read the value '{raw}': {exc}")) from None
    return key.strip(), value


def _step_into_list(items: list[Any], part: str, where: str) -> int:
    for i, item in enumerate(items):
        if isinstance(item, dict) and item.get("name") == part:
            return i
    if part.lstrip("-").isdigit() and -len(items) <= int(part) < len(items):
        return int(part) % len(items)
    names = [str(item.get("name")) for item in items if isinstance(item, dict) and "name" in item]
    known = f"; names here: {', '.join(names)}" if names else ""
    raise JobSpecError(SpecIssue(where, f"no item named or numbered '{part}' in this list{known}"))


def apply_overrides(document: dict[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """Return a copy of `document` with each `path -> value` set; the input is left unchanged."""
    out = copy.deepcopy(document)
    issues: list[SpecIssue] = []
    for dotted, value in overrides.items():
        parts = dotted.split(".")
        node: Any = out
        try:
            for depth, part in enumerate(parts):
                last = depth == len(parts) - 1
                where = ".".join(parts[: depth + 1])
                if isinstance(node, list):
                    index = _step_into_list(node, part, where)
                    if last:
                        node[index] = value
                    else:
                        node = node[index]
                elif isinstance(node, dict):
                    if last:
                        node[part] = value
                    else:
                        node = node.setdefault(part, {})
                else:
                    raise JobSpecError(
                        SpecIssue(where, f"cannot set '{dotted}': '{parts[depth - 1]}' is a value")
                    )
        except JobSpecError as exc:
            issues.extend(exc.issues)
    if issues:
        raise JobSpecError(issues)
    return out


def parse_overrides(items: Iterable[str]) -> dict[str, Any]:
    return dict(parse_override(item) for item in items)
