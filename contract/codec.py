"""One codec for every record that crosses Redis as a flat hash of strings (a stream entry, the
allocation hash, a node's registration): a frozen dataclass is written field by field as its
type says, and read back the same way. A field added to a record is one line of its class.

    int, str          str(value), as is
    float             repr(value), so that it reads back exactly
    bool              "1" or ""
    Path              str(value)
    X | None          "" for None
    anything else     JSON (dicts, lists, tuples; tuples read back as tuples)

A field's wire name is its own unless `field(metadata={"wire": name})` says otherwise
(`{"wire": None}`: not written, the reader knows it, e.g. from the key); a field with a default
may be missing from what is read (a record of an older writer).
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


def decode(fields: Mapping[Any, Any]) -> dict[str, str]:
    """Redis returns bytes unless decode_responses; normalise to str."""
    return {
        (k.decode() if isinstance(k, bytes) else k): (v.decode() if isinstance(v, bytes) else v)
        for k, v in fields.items()
    }


@dataclasses.dataclass(frozen=True)
class _Field:
    name: str
    wire: str | None
    kind: Any  # the resolved annotation, `None` taken out
    optional: bool
    required: bool


_FIELDS: dict[type, tuple[_Field, ...]] = {}


def _fields(cls: type) -> tuple[_Field, ...]:
    """A record class's fields as the codec reads them (worked out once per class)."""
    if cls not in _FIELDS:
        _FIELDS[cls] = _read_fields(cls)
    return _FIELDS[cls]


def _read_fields(cls: type) -> tuple[_Field, ...]:
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        kind = hints[f.name]
        args = typing.get_args(kind)
        optional = _is_union(kind) and type(None) in args
        if optional:
            (kind,) = [arg for arg in args if arg is not type(None)]
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        out.append(_Field(f.name, f.metadata.get("wire", f.name), kind, optional, required))
    return tuple(out)


def _is_union(kind: Any) -> bool:
    return typing.get_origin(kind) in (typing.Union, types.UnionType)


def _text(kind: Any, value: Any) -> str:
    if kind is bool:
        return "1" if value else ""
    if kind is float:
        return repr(float(value))
    if kind in (int, str) or kind is Path:
        return str(value)
    return json.dumps(value)


def _value(kind: Any, text: str) -> Any:
    if kind is bool:
        return bool(text)
    if kind in (int, float, str):
        return kind(text)
    if kind is Path:
        return Path(text)
    return _shaped(kind, json.loads(text))


def _shaped(kind: Any, value: Any) -> Any:
    """A JSON value as the annotation says: tuples for tuples (nested), typed scalars."""
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin is tuple:
        if not isinstance(value, list):
            raise ValueError("is not a JSON array")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_shaped(args[0], item) for item in value)
        if len(args) != len(value):
            raise ValueError(f"has {len(value)} items, not {len(args)}")
        return tuple(_shaped(arg, item) for arg, item in zip(args, value, strict=True))
    if origin is dict or kind is dict:
        if not isinstance(value, dict):
            raise ValueError("is not a JSON object")
        return value
    if origin is list or kind is list:
        if not isinstance(value, list):
            raise ValueError("is not a JSON array")
        return value
    if kind in (int, float, str):
        return kind(value)
    return value


def to_fields(record: Any) -> dict[str, str]:
    """The record's fields as strings, by wire name, in the class's order."""
    out = {}
    for f in _fields(type(record)):
        if f.wire is None:
            continue
        value = getattr(record, f.name)
        out[f.wire] = "" if value is None and f.optional else _text(f.kind, value)
    return out


def from_fields(cls: type[T], fields: Mapping[str, str], **known: Any) -> T:
    """The record of class `cls` from its fields (str), with the values of `known` as given;
    KeyError names a required field that is missing, ValueError or TypeError a malformed one."""
    given: dict[str, Any] = dict(known)
    wanted = [f for f in _fields(cls) if f.name not in known]
    for f in wanted:
        if f.required and (f.wire is None or f.wire not in fields):
            raise KeyError(f.wire or f.name)
    for f in wanted:
        if f.wire is None or f.wire not in fields:
            continue
        text = fields[f.wire]
        try:
            given[f.name] = None if f.optional and text == "" else _value(f.kind, text)
        except (ValueError, TypeError) as exc:
            raise ValueError(f"{f.wire} {exc}") from exc
    return cls(**given)
