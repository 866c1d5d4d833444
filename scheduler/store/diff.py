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
