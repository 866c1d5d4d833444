"""Turn pydantic's validation errors into located, human job-language issues."""

from __future__ import annotations

import types
import typing
from dataclasses import dataclass
from typing import Any, Union

from pydantic import BaseModel, ValidationError

from dsl.errors import Path, SpecIssue
from dsl.registry import did_you_mean
from dsl.source import SourceMap

_TAG_KEYS = ("type", "source", "alg")


def translate_validation_error(
    exc: ValidationError, document: dict[str, Any], source: SourceMap
) -> list[SpecIssue]:
    from dsl.schema import JobSpec

    issues: list[SpecIssue] = []
    seen: set[tuple[str, str]] = set()
    for error in exc.errors(include_url=False):
        path = _document_path(error["loc"], document)
        issue = _issue(error, path, document, source, JobSpec)
        key = (issue.path, issue.message)
        if key not in seen:
            seen.add(key)
            issues.append(issue)
    return issues


def _document_path(loc: tuple[Any, ...], document: Any) -> Path:
    """Drop the parts of pydantic's location that are union tags or validator names."""
    path: list[str | int] = []
    node = document
    for part in loc:
        if isinstance(node, list) and isinstance(part, int):
            path.append(part)
            node = node[part] if part < len(node) else None
        elif isinstance(node, dict):
            if part in node:
                path.append(part)
                node = node[part]
            elif any(node.get(k) == part for k in _TAG_KEYS) or _is_internal(part):
                continue
            else:
                path.append(part)
                node = None
        elif not _is_internal(part):
            path.append(part)
    return tuple(path)


def _is_internal(part: Any) -> bool:
    return isinstance(part, str) and ("[" in part or part.startswith("function-"))


def _value_at(document: Any, path: Path) -> Any:
    node = document
    for part in path:
        try:
            node = node[part]
        except (KeyError, IndexError, TypeError):
            return None
    return node


def _issue(
    error: Any, path: Path, document: dict[str, Any], source: SourceMap, root: type[BaseModel]
) -> SpecIssue:
    kind = error["type"]
    ctx = error.get("ctx") or {}
    if kind == "extra_forbidden":
        key = str(path[-1])
        known = _known_keys(root, path[:-1], document)
        hint = did_you_mean(key, known) if known else None
        if known and not hint:
            hint = f"keys allowed here: {', '.join(known)}"
        return source.issue(path, f"unknown key '{key}'", hint)
    if kind == "missing":
        field = _field_info(root, path, document)
        hint = field.description if field is not None and field.description else None
        return source.issue(path[:-1], f"missing required key '{path[-1]}'", hint)
    if kind == "union_tag_invalid":
        tag_key = str(ctx.get("discriminator", "'type'")).strip("'")
        tag = ctx.get("tag")
        known = [t.strip().strip("'") for t in str(ctx.get("expected_tags", "")).split(",")]
        known = sorted(t for t in known if t)
        hint = did_you_mean(str(tag), known)
        message = f"unknown {tag_key} '{tag}'; known: {', '.join(known)}"
        return source.issue((*path, tag_key), message, hint)
    if kind == "union_tag_not_found":
        tag_key = str(ctx.get("discriminator", "'type'")).strip("'")
        return source.issue(path, f"missing required key '{tag_key}'")
    value = _value_at(document, path)
    message = error["msg"]
    if kind == "value_error":  # our own validators: their message without pydantic's prefix
        message = str(ctx.get("error", message))
    if value is not None and not isinstance(value, dict | list):
        message = f"{message} (got {value!r})"
    field = _field_info(root, path, document)
    hint = field.description if field is not None and field.description else None
    return source.issue(path, message, hint)


def _model_at(root: type[BaseModel], path: Path, document: Any) -> type[BaseModel] | None:
    """The pydantic model that validates the mapping at `path` of the document."""
    model: Any = root
    node: Any = document
    for part in path:
        if isinstance(model, _Items):  # a list index or a dict key: step into the item
            node = _value_at(node, (part,))
            model = _unwrap(model.item, node)
            continue
        if not _is_model(model):
            return None
        field = model.model_fields.get(part)
        if field is None:
            return None
        node = node.get(part) if isinstance(node, dict) else None
        model = _unwrap(field.annotation, node)
    model = _unwrap(model, node)
    return model if isinstance(model, type) and issubclass(model, BaseModel) else None


def _unwrap(annotation: Any, node: Any) -> Any:
    """Pick, from Optional/list/Annotated/union types, the model that fits `node`."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _unwrap(typing.get_args(annotation)[0], node)
    if origin in (Union, types.UnionType):
        members = [a for a in typing.get_args(annotation) if a is not type(None)]
        models = [m for m in (_unwrap(a, node) for a in members) if _is_model(m)]
        for model in models:
            for key in _TAG_KEYS:
                tag_field = model.model_fields.get(key)
                if tag_field is not None and isinstance(node, dict):
                    allowed = typing.get_args(tag_field.annotation)
                    if node.get(key) in allowed:
                        return model
        return models[0] if len(models) == 1 else (members[0] if len(members) == 1 else None)
    if origin in (list, dict):
        return _Items(typing.get_args(annotation)[-1])
    return annotation


@dataclass(frozen=True)
class _Items:
    """The items of a list or dict field, whose element type is `item`."""

    item: Any


def _is_model(candidate: Any) -> bool:
    return isinstance(candidate, type) and issubclass(candidate, BaseModel)


def _known_keys(root: type[BaseModel], path: Path, document: Any) -> list[str]:
    model = _model_at(root, path, document)
    return sorted(model.model_fields) if model is not None else []


def _field_info(root: type[BaseModel], path: Path, document: Any) -> Any:
    if not path or not isinstance(path[-1], str):
        return None
    model = _model_at(root, path[:-1], document)
    return model.model_fields.get(path[-1]) if model is not None else None
