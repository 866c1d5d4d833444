"""`--set key.path=value` overrides, applied to the parsed document before validation.

Layers are addressed by name (`neuralnet.layers.fc1.units=256`); other lists by index. Values
are read as YAML scalars or flow collections (`3`, `0.5`, `true`, `[1, 2]`, `{init: gaussian}`).

A job keeps the document as submitted, its overrides, and its effective document: the
submitted one with the overrides applied, what the job runs and what is shown of it
(`effective_document`); `override_lines` says where each override landed in it.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from typing import Any

import yaml

from dsl.errors import JobSpecError, Path, SpecIssue
from dsl.source import ParsedDocument, parse_document, read_document


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
    return _apply(document, overrides)[0]


def _apply(
    document: dict[str, Any], overrides: Mapping[str, Any]
) -> tuple[dict[str, Any], dict[str, Path]]:
    """`apply_overrides`, and the path each override was set at (a layer's name as its index)."""
    out = copy.deepcopy(document)
    paths: dict[str, Path] = {}
    issues: list[SpecIssue] = []
    for dotted, value in overrides.items():
        parts = dotted.split(".")
        node: Any = out
        path: list[str | int] = []
        try:
            for depth, part in enumerate(parts):
                last = depth == len(parts) - 1
                where = ".".join(parts[: depth + 1])
                if isinstance(node, list):
                    index = _step_into_list(node, part, where)
                    path.append(index)
                    if last:
                        node[index] = value
                    else:
                        node = node[index]
                elif isinstance(node, dict):
                    path.append(part)
                    if last:
                        node[part] = value
                    else:
                        node = node.setdefault(part, {})
                else:
                    raise JobSpecError(
                        SpecIssue(where, f"cannot set '{dotted}': '{parts[depth - 1]}' is a value")
                    )
            paths[dotted] = tuple(path)
        except JobSpecError as exc:
            issues.extend(exc.issues)
    if issues:
        raise JobSpecError(issues)
    return out, paths


def effective_document(
    document: str | Mapping[str, Any] | ParsedDocument, overrides: Mapping[str, Any]
) -> str:
    """The document with `overrides` applied, as YAML: the submitted text itself when there are
    none (its comments kept), else the applied document written out in the submitted order."""
    if not overrides and isinstance(document, str):
        return document
    raw = read_document(document).raw
    applied = apply_overrides(raw, overrides)
    return yaml.safe_dump(applied, sort_keys=False, default_flow_style=None, allow_unicode=True)


def override_lines(effective: str, overrides: Mapping[str, Any]) -> dict[str, int]:
    """Each override's `key.path` -> the 1-based line of `effective` it set (the key's line,
    else its value's); one that no longer addresses the document (it renamed the layer it
    names) is left out."""
    if not overrides:
        return {}
    raw, source = parse_document(effective)
    lines: dict[str, int] = {}
    for dotted, value in overrides.items():
        try:
            path = _apply(raw, {dotted: value})[1][dotted]
        except JobSpecError:
            continue
        where = source.keys.get(path) or source.values.get(path)
        if where is not None:
            lines[dotted] = where[0]
    return lines


def parse_overrides(items: Iterable[str]) -> dict[str, Any]:
    return dict(parse_override(item) for item in items)
