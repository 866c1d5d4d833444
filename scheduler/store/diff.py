"""Documents told apart key by key: a job's settings, two environments, two package lists."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Difference:
    """A setting, a fact of the environment or a package whose value is not the same in every
    job (None: a job without it)."""

    key: str
    values: list[Any]


def flatten(document: Any, prefix: str = "") -> dict[str, Any]:
    """A document as dotted keys to scalars: `{"a": {"b": [1, {"c": 2}]}}` gives `a.b.0: 1`
    and `a.b.1.c: 2`."""
    if isinstance(document, dict):
        items: list[tuple[str, Any]] = [(str(k), v) for k, v in document.items()]
    elif isinstance(document, list):
        items = [(str(i), v) for i, v in enumerate(document)]
    else:
        return {prefix: document}
    if not items:
        return {prefix: document} if prefix else {}
    out: dict[str, Any] = {}
    for key, value in items:
        out.update(flatten(value, f"{prefix}.{key}" if prefix else key))
    return out


def differences(documents: list[dict[str, Any] | None]) -> tuple[list[Difference], int]:
    """The keys whose values are not all the same, in the order first seen, and how many
    keys are the same everywhere."""
    keys: dict[str, None] = {}
    for one in documents:
        keys.update(dict.fromkeys(one or {}))
    found = []
    for key in keys:
        values = [(one or {}).get(key) for one in documents]
        if len({repr(value) for value in values}) > 1:
            found.append(Difference(key, values))
    return found, len(keys) - len(found)
