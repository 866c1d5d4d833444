"""The one codec of every flat Redis record: a field added to a record is one line of its
class, written and read as its type says."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from contract.codec import decode, from_fields, to_fields


@dataclass(frozen=True)
class Sample:
    count: int
    ratio: float
    name: str
    where: Path
    flag: bool
    shape: tuple[int, ...]
    pair: tuple[str, float]
    document: dict[str, int]
    renamed: int = field(default=0, metadata={"wire": "alias"})
    maybe: int | None = None
    known: int = field(default=0, metadata={"wire": None})


def sample(**changes: object) -> Sample:
    given: dict[str, object] = {
        "count": -3,
        "ratio": 0.1,
        "name": "a b",
        "where": Path("/x/y"),
        "flag": True,
        "shape": (2, 3),
        "pair": ("F", 1.5),
        "document": {"k": 1},
        "renamed": 4,
        "maybe": None,
        **changes,
    }
    return Sample(**given)  # type: ignore[arg-type]


def test_every_type_reads_back_as_written() -> None:
    record = sample()
    fields = to_fields(record)
    assert fields == {
        "count": "-3",
        "ratio": "0.1",
        "name": "a b",
        "where": "/x/y",
        "flag": "1",
        "shape": "[2, 3]",
        "pair": '["F", 1.5]',
        "document": '{"k": 1}',
        "alias": "4",
        "maybe": "",
    }
    assert from_fields(Sample, fields) == record
    assert from_fields(Sample, {**fields, "maybe": "7"}).maybe == 7
    assert not from_fields(Sample, {**fields, "flag": ""}).flag


def test_floats_read_back_exactly() -> None:
    ratio = 0.1 + 0.2
    assert from_fields(Sample, to_fields(sample(ratio=ratio))).ratio == ratio


def test_fields_with_defaults_may_be_missing_and_known_ones_are_given() -> None:
    fields = to_fields(sample())
    del fields["alias"], fields["maybe"]
    read = from_fields(Sample, fields, known=5)
    assert (read.renamed, read.maybe, read.known) == (0, None, 5)


def test_a_missing_or_malformed_field_is_named() -> None:
    fields = to_fields(sample())
    with pytest.raises(KeyError, match="count"):
        from_fields(Sample, {k: v for k, v in fields.items() if k != "count"})
    with pytest.raises(ValueError, match=re.escape("document is not a JSON object")):
        from_fields(Sample, {**fields, "document": "[]"})
    with pytest.raises(ValueError, match=re.escape("pair has 3 items, not 2")):
        from_fields(Sample, {**fields, "pair": '["F", 1, 2]'})
    with pytest.raises(ValueError, match="count"):
        from_fields(Sample, {**fields, "count": "many"})


def test_bytes_from_redis_are_read_as_text() -> None:
    assert decode({b"a": b"1", "b": "2"}) == {"a": "1", "b": "2"}
