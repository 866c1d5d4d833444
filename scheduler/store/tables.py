"""Uploaded tables (.csv with text columns, .parquet) converted to a shard folder of npy pairs.

The folder is what `source: shards, format: npy` reads and, in memory, `source: dataset`
(workers/data/uploaded.py): `NNNNN.x.npy` (float32, (N, F)) and `NNNNN.y.npy` ((N,): int64
class indices, or float32 regression targets) per shard, and `categories.json`, the values
behind the indices of every text column: {"features": {column: [values]}, "label": [values]}
(the label's list is empty for a numeric label). A text feature becomes one feature holding
its value's index; values are numbered in sorted order.

The file is read twice, a block of rows at a time (pyarrow), so a table larger than memory
converts in bounded memory: the first pass learns each column's type and its distinct values,
the second writes the shards. What the shards will take is known after the first pass (rows x
features): a table whose shards would pass the bound given is refused then, before anything is
written, and the writer holds the shards to it as they are written. The conversion runs in the
intake's process of its own (scheduler/store/intake.py), never in the API's.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq

from contract.rundir import CATEGORIES, shard_names
from contract.shards import MAX_CATEGORIES_BYTES
from scheduler.store.errors import InvalidRequest, TooLarge, UnpacksTooLarge

MAX_CATEGORIES = 10_000  # distinct values of one text column
MAX_COLUMNS = 10_000
SHARD_BYTES = 64 * 2**20  # x bytes per shard
# A small table is still cut into this many shards (when it has the rows): a streamed job
# (`source: shards`) holds whole shards out, the last for its test split by default and
# round(fraction x shards) for validation, so one shard would leave nothing to train on.
MIN_SHARDS = 10
READ_BLOCK = 8 * 2**20  # CSV bytes per block read
BATCH_ROWS = 65_536  # Parquet rows per batch read, for tables of up to BATCH_CELLS // BATCH_ROWS
BATCH_CELLS = 2**22  # columns; a wider table's batches hold about this many values
NPY_HEADER = 128  # bytes of an .npy file besides its array (the header numpy writes, about)


class BadTable(InvalidRequest):
    """The table cannot be a dataset; the message says which column or row and why."""


@dataclass
class Column:
    """What the first pass learned of one column."""

    name: str
    numeric: bool = True  # every value so far reads as a number
    integral: bool = True  # ... and as a whole number
    values: set[str] | None = field(default_factory=set)  # None: more than MAX_CATEGORIES

    def see(self, array: pa.Array) -> None:
        if self.numeric:
            numbers = _as_numbers(array)
            if numbers is None:
                self.numeric = False
            elif self.integral and len(numbers):
                self.integral = bool(pc.all(pc.equal(numbers, pc.floor(numbers))).as_py())
        if self.values is not None:
            self.values.update(pc.unique(pc.cast(array, pa.string())).to_pylist())
            if len(self.values) > MAX_CATEGORIES:
                self.values = None
        if not self.numeric and self.values is None:
            raise BadTable(
                f"column '{self.name}' holds text with more than {MAX_CATEGORIES} distinct "
                "values; a text column is categorical, one index per value"
            )

    def categories(self) -> list[str] | None:
        """The sorted values of a text column; None for a numeric one."""
        if self.numeric:
            return None
        assert self.values is not None
        return sorted(self.values)


def _as_numbers(array: pa.Array) -> pa.Array | None:
    """The column as float64; None where it does not read as numbers (a text column)."""
    try:
        return pc.cast(array, pa.float64())
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None


def _no_nulls(array: pa.Array, column: str) -> None:
    empty = array.null_count
    if not empty and _text_type(array.type):
        empty = pc.sum(pc.equal(pc.cast(array, pa.string()), "")).as_py() or 0
    if empty:
        raise BadTable(f"column '{column}' has {empty} empty value(s); fill or drop those rows")


# -- reading: batches of columns, from either kind ---------------------------------------------
def csv_header(path: Path) -> list[str]:
    try:
        with path.open(newline="", encoding="utf-8") as handle:
            header = next(csv.reader(handle), [])
    except (UnicodeDecodeError, csv.Error) as error:
        raise BadTable(f"the file is not UTF-8 CSV text ({error})") from None
    if len(header) < 2:
        raise BadTable("the .csv file needs a header row naming at least 2 columns")
    if len(header) > MAX_COLUMNS:
        raise BadTable(f"the .csv file has {len(header)} columns, more than {MAX_COLUMNS}")
    if len(set(header)) != len(header):
        raise BadTable("the .csv header names a column twice")
    return header


def csv_schema(header: list[str]) -> pa.Schema:
    """The schema every .csv is read with: each column as text (the survey types them)."""
    return pa.schema([(name, pa.string()) for name in header])


def csv_batches(path: Path, header: list[str]) -> Iterator[pa.RecordBatch]:
    """Every value as text (the first pass decides what each column is)."""
    reader = pa_csv.open_csv(
        path,
        read_options=pa_csv.ReadOptions(block_size=READ_BLOCK),
        convert_options=pa_csv.ConvertOptions(
            column_types=csv_schema(header), strings_can_be_null=False
        ),
    )
    try:
        yield from reader
    except pa.ArrowInvalid as error:
        raise BadTable(f"the .csv file cannot be read: {error}") from None


def parquet_file(path: Path) -> pq.ParquetFile:
    try:
        return pq.ParquetFile(path)
    except (pa.ArrowInvalid, OSError) as error:
        raise BadTable(f"the file is not a readable Parquet file ({error})") from None


def parquet_batches(path: Path) -> Iterator[pa.RecordBatch]:
    try:
        file = parquet_file(path)
        columns = max(1, len(file.schema_arrow.names))
        rows = max(1, min(BATCH_ROWS, BATCH_CELLS // columns))
        yield from file.iter_batches(batch_size=rows)
    except (pa.ArrowInvalid, OSError) as error:
        raise BadTable(f"the Parquet file cannot be read: {error}") from None


# -- the conversion ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Survey:
    """The first pass: the table's columns, what each holds, its rows."""

    names: list[str]
    label: str
    vector: bool  # the features are one fixed-size list column x
    columns: dict[str, Column]
    rows: int
    width: int  # features per row

    @property
    def categories(self) -> dict[str, object]:
        return {
            "features": {
                name: values
                for name, column in self.columns.items()
                if name != self.label and (values := column.categories()) is not None
            },
            "label": self.columns[self.label].categories() or [],
        }

    @property
    def categorical(self) -> bool:
        """Some column holds text."""
        return not all(column.numeric for column in self.columns.values())

    @property
    def label_is_index(self) -> bool:
        label = self.columns[self.label]
        return not label.numeric or label.integral


def survey_table(
    batches: Iterator[pa.RecordBatch], schema: pa.Schema, *, label_column: str | None
) -> Survey:
    """Read the table once: each column's type and distinct values, the rows; a table that
    cannot be a dataset raises BadTable naming the column."""
    names = list(schema.names)
    label = _label_of(names, label_column)
    vector = "x" in names and pa.types.is_fixed_size_list(schema.field("x").type)
    if vector:
        extra = sorted(set(names) - {"x", label})
        if extra:
            raise BadTable(
                f"a table with a fixed-size list column x holds x and the label {label} only, "
                f"not {', '.join(extra)}"
            )
        value_type = schema.field("x").type.value_type
        if not _numeric_type(value_type):
            raise BadTable(f"column x holds lists of {value_type}, not numbers")
        width = schema.field("x").type.list_size
    else:
        for name in names:
            kind = schema.field(name).type
            if not (_numeric_type(kind) or _text_type(kind)):
                raise BadTable(
                    f"column '{name}' is of type {kind}; columns are numbers or text (a "
                    "fixed-size list only as column x)"
                )
        width = len(names) - 1
    if width < 1:
        raise BadTable("the table has no feature columns besides its label")
    columns = {name: Column(name) for name in ([label] if vector else names)}
    rows = 0
    for batch in batches:
        rows += batch.num_rows
        for name, column in columns.items():
            array = batch.column(name)
            _no_nulls(array, name)
            column.see(array)
    if rows < 2:
        raise BadTable(f"the table has {rows} row(s); a dataset needs at least 2")
    return Survey(names, label, vector, columns, rows, width)


def shards_bytes(survey: Survey, categories: str) -> int:
    """What the shard folder of the surveyed table takes: every shard's x (float32) and y
    (int64 indices or float32 targets) with their headers, and categories.json."""
    shards = -(-survey.rows // _rows_per_shard(survey.width, survey.rows))
    row = 4 * survey.width + (8 if survey.label_is_index else 4)
    return survey.rows * row + 2 * shards * NPY_HEADER + len(categories.encode())


def write_shards(
    survey: Survey,
    batches: Iterator[pa.RecordBatch],
    folder: Path,
    *,
    max_bytes: int,
    limit: str,
    what: str = "the table",
) -> int:
    """The second pass: the table as a shard folder in `folder` (made here; the caller
    removes it where this raises). Shards that would take more than `max_bytes` (`limit`
    says what sets it) are refused with UnpacksTooLarge before anything is written, and the
    writer holds the shards to it as it writes. Returns the number of shards."""
    categories = json.dumps(survey.categories, indent=1, sort_keys=True)
    if len(categories) > MAX_CATEGORIES_BYTES:
        raise TooLarge(
            f"the values of {what}'s text columns take {len(categories)} bytes as "
            f"{CATEGORIES}, more than the {MAX_CATEGORIES_BYTES} a dataset's may take"
        )
    expected = shards_bytes(survey, categories)
    if expected > max_bytes:
        raise UnpacksTooLarge(
            f"{what} converts to {survey.rows} rows of {survey.width} features: "
            f"{expected} bytes of shards, more than {limit}; nothing was written"
        )
    folder.mkdir(parents=True)
    (folder / CATEGORIES).write_text(categories, encoding="utf-8")
    writer = _ShardWriter(folder, survey.width, survey.rows, max_bytes - len(categories), limit)
    features = [name for name in survey.names if name != survey.label]
    label = survey.columns[survey.label]
    for batch in batches:
        if survey.vector:
            x = _vectors(batch.column("x"), survey.width)
        else:
            x = np.column_stack(
                [_encode(batch.column(name), survey.columns[name]) for name in features]
            ).astype(np.float32)
        y = _encode(batch.column(survey.label), label)
        writer.add(x, y.astype(np.int64) if survey.label_is_index else y.astype(np.float32))
    return writer.close()


def _label_of(names: list[str], label_column: str | None) -> str:
    if label_column is not None:
        if label_column not in names:
            raise BadTable(
                f"the table has no column '{label_column}' (label_column); its columns: "
                f"{', '.join(names[:20])}"
            )
        return label_column
    return "y" if "y" in names else names[-1]


def _numeric_type(kind: pa.DataType) -> bool:
    return bool(
        pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_boolean(kind)
    )


def _text_type(kind: pa.DataType) -> bool:
    if pa.types.is_dictionary(kind):
        return _text_type(kind.value_type)
    return bool(pa.types.is_string(kind) or pa.types.is_large_string(kind))


def _encode(array: pa.Array, column: Column) -> np.ndarray:
    """A numeric column's numbers, or a text column's value indices (as float64)."""
    values = column.categories()
    if values is None:
        numbers = _as_numbers(array)
        assert numbers is not None  # the first pass saw every value read as a number
        return numbers.to_numpy(zero_copy_only=False)
    indices = pc.index_in(pc.cast(array, pa.string()), value_set=pa.array(values, pa.string()))
    return indices.to_numpy(zero_copy_only=False).astype(np.float64)


def _vectors(array: pa.Array, width: int) -> np.ndarray:
    _no_nulls(array, "x")
    flat = array.flatten()
    if flat.null_count:
        raise BadTable("column x holds lists with empty values")
    numbers = _as_numbers(flat)
    assert numbers is not None
    return numbers.to_numpy(zero_copy_only=False).reshape(len(array), width).astype(np.float32)


def _rows_per_shard(width: int, rows: int) -> int:
    return max(1, min(SHARD_BYTES // (4 * width), -(-rows // MIN_SHARDS)))


class _ShardWriter:
    """Rows gathered into shards of about SHARD_BYTES of x (fewer rows where the table would
    make less than MIN_SHARDS), each written as an npy pair; the pairs may take `max_bytes`
    in all."""

    def __init__(self, folder: Path, width: int, rows: int, max_bytes: int, limit: str) -> None:
        self.folder, self.width = folder, width
        self.rows_per_shard = _rows_per_shard(width, rows)
        self.pending: list[tuple[np.ndarray, np.ndarray]] = []
        self.pending_rows = 0
        self.written = 0
        self.bytes, self.max_bytes, self.limit = 0, max_bytes, limit

    def add(self, x: np.ndarray, y: np.ndarray) -> None:
        self.pending.append((x, y))
        self.pending_rows += len(x)
        while self.pending_rows >= self.rows_per_shard:
            self._flush(self.rows_per_shard)

    def close(self) -> int:
        if self.pending_rows:
            self._flush(self.pending_rows)
        return self.written

    def _flush(self, rows: int) -> None:
        x = np.concatenate([x for x, _ in self.pending])
        y = np.concatenate([y for _, y in self.pending])
        x_name, y_name = shard_names(self.written)
        self.bytes += x[:rows].nbytes + y[:rows].nbytes + 2 * NPY_HEADER
        if self.bytes > self.max_bytes:  # more rows than the first pass counted
            raise UnpacksTooLarge(
                f"the shards passed {self.limit} at shard {self.written}; nothing was kept"
            )
        np.save(self.folder / x_name, x[:rows])
        np.save(self.folder / y_name, y[:rows])
        self.written += 1
        self.pending = [(x[rows:], y[rows:])] if len(x) > rows else []
        self.pending_rows = len(x) - rows
