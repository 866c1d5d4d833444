"""A job document as flat `dotted.key: scalar` pairs: what trackers call a run's parameters
(TensorBoard's HParams, MLflow's params) and what comparing two runs diffs.

A list of mappings that each have a `name` (a net's layers) is keyed by those names, so that
`neuralnet.layers.conv1.kernel` stays the same key when a layer is added before it; any other
list by position. Imports nothing at module level: the client and the workers both use it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dsl.schema import JobSpec

Scalar = str | int | float | bool


def flatten_document(document: Mapping[str, Any], prefix: str = "") -> dict[str, Scalar]:
    """Every leaf of `document` under its dotted path; None leaves are left out (unset), an
    empty list or mapping is kept as its text so that its key still shows."""
    out: dict[str, Scalar] = {}
    for key, value in document.items():
        _flatten_into(out, f"{prefix}{key}", value)
    return out


def job_parameters(spec: JobSpec) -> dict[str, Scalar]:
    """A checked job's parameters: what its document set (overrides applied), flattened."""
    return flatten_document(spec.model_dump(mode="json", exclude_unset=True))


def _flatten_into(out: dict[str, Scalar], path: str, value: Any) -> None:
    if value is None:
        return
    if isinstance(value, Mapping):
        if not value:
            out[path] = "{}"
        for key, inner in value.items():
            _flatten_into(out, f"{path}.{key}", inner)
    elif isinstance(value, list | tuple):
        if not value:
            out[path] = "[]"
        for index, inner in enumerate(value):
            _flatten_into(out, f"{path}.{_item_key(value, index, inner)}", inner)
    elif isinstance(value, str | int | float | bool):
        out[path] = value
    else:
        out[path] = str(value)


def _item_key(items: list[Any] | tuple[Any, ...], index: int, item: Any) -> str:
    """A named item's name where every item of the list has a distinct one, else its index."""
    names = [entry.get("name") if isinstance(entry, Mapping) else None for entry in items]
    if all(isinstance(n, str) and n for n in names) and len(set(names)) == len(names):
        return str(item["name"])
    return str(index)
