"""What a dataset file holds, read in bounded memory: its inventory.

An inventory holds the facts that checking a job needs of an .npz archive or a numeric .csv
table, whichever options the job reads it with (which arrays are the samples and labels, which
column is the label, whether the first row names the columns):

- an .npz: each array's shape and dtype, from its .npy header (a few hundred bytes at the
  head of its zip member), and a summary of its values;
- a .csv: the first row (the names, if it is a header), the width, the rows, and a summary of
  each column's values, once for the first row and once for the others.

A summary (`Values`) is what the data sources' checks ask of the values: the smallest and largest
integer (the classes), whether every number is finite, as stored and as float32 (the samples),
whether every cell of a column reads as an integer, the first one that is no number. It is
computed a bounded chunk at a time (CHUNK_BYTES of an array, CSV_CELLS cells of a table): an
archive that inflates to gigabytes is summarised in megabytes of memory, and a one-line cell of
a table is never widened to the whole table.

The service takes a dataset's inventory once, when its upload completes, in a process of its
own (scheduler/store/intake.py), and stores it with the dataset; `workers.data` derives a job's
DataInfo from it (workers/data/files.py). Imports numpy and pydantic only.
"""

from __future__ import annotations

import csv
import math
import zipfile
import zlib
from collections.abc import Collection, Iterator
from pathlib import Path
from typing import IO, Annotated, Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

CHUNK_BYTES = 4 * 2**20  # of an array's data, read at a time
CSV_CELLS = 2**18  # cells of a table summarised at a time
CSV_ARRAY_BYTES = 4 * 2**20  # the most a chunk of cells takes as a fixed-width string array
CELL_TEXT = 100  # characters of a cell kept to name it in a message
NPZ_PREFIXES = (b"PK\x03\x04", b"PK\x05\x06")  # a zip archive's first bytes (numpy.load's test)
# What reading a member may raise: a bad header, a truncated or corrupted member.
UNREADABLE = (
    OSError,
    ValueError,
    TypeError,
    EOFError,
    zipfile.BadZipFile,
    zlib.error,
    NotImplementedError,
    RuntimeError,
)


class _Record(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Values(_Record):
    """A summary of numbers, read a chunk at a time."""

    low: int | None = None  # integers and booleans: the smallest (None: no values)
    high: int | None = None
    finite: bool = True  # every value is finite as stored
    finite32: bool = True  # ... and once cast to float32, as samples are

    def merged(self, other: Values) -> Values:
        """The summary of both sets of values."""
        lows = [v for v in (self.low, other.low) if v is not None]
        highs = [v for v in (self.high, other.high) if v is not None]
        return Values(
            low=min(lows) if lows else None,
            high=max(highs) if highs else None,
            finite=self.finite and other.finite,
            finite32=self.finite32 and other.finite32,
        )


class ArrayFacts(_Record):
    """One array of an .npz archive: its header, and its values' summary."""

    shape: tuple[int, ...] = ()
    descr: Any = "|u1"  # the dtype as an .npy header writes it (numpy.lib.format.dtype_to_descr)
    fortran: bool = False
    values: Values | None = None  # None: not read (not numbers, or it cannot be read)
    error: str | None = None  # why numpy.load cannot read it: an object array, a truncated file

    @property
    def dtype(self) -> np.dtype[Any]:
        return np.lib.format.descr_to_dtype(self.descr)

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


class NpzInventory(_Record):
    format: Literal["npz"] = "npz"
    error: str | None = None  # the file is no archive numpy.load opens, in its words
    arrays: dict[str, ArrayFacts] = Field(default_factory=dict)  # by the name numpy.load gives


class Cell(_Record):
    """A cell of a table, named in messages: its line in the file and its text (cut short)."""

    line: int
    text: str


class ColumnFacts(_Record):
    """A summary of a table column's cells (or of one cell: the first row's)."""

    integers: bool = True  # every cell reads as an int64 (numpy's conversion of its text)
    values: Values = Values()  # as integers where they are, else as float64
    not_a_number: Cell | None = None  # the first cell that does not read as a float64

    def merged(self, later: ColumnFacts) -> ColumnFacts:
        """The facts of these cells followed by `later`'s."""
        return ColumnFacts(
            integers=self.integers and later.integers,
            values=self.values.merged(later.values),
            not_a_number=self.not_a_number or later.not_a_number,
        )


class CsvInventory(_Record):
    format: Literal["csv"] = "csv"
    error: str | None = None  # the file cannot be read as UTF-8 CSV, in the csv reader's words
    names: list[str] = Field(default_factory=list)  # the first row, stripped: a header's names
    width: int = 0  # cells of the first row (0: the file holds no row)
    rows: int = 0  # rows after the first (empty lines are not rows)
    ragged: Cell | None = None  # the first row of another width; its text: its width
    head: list[ColumnFacts] = Field(default_factory=list)  # the first row's cells, as data
    body: list[ColumnFacts] = Field(default_factory=list)  # the other rows', per column

    def columns(self, header: bool) -> list[ColumnFacts]:
        """Each column's facts over the data rows: the first row is one unless it is a header."""
        if header:
            return self.body
        if not self.rows:
            return self.head
        return [first.merged(rest) for first, rest in zip(self.head, self.body, strict=True)]


Inventory = Annotated[NpzInventory | CsvInventory, Field(discriminator="format")]
INVENTORY: TypeAdapter[NpzInventory | CsvInventory] = TypeAdapter(Inventory)


# -- .npz ----------------------------------------------------------------------------------------
def npz_inventory(path: Path, names: Collection[str] | None = None) -> NpzInventory:
    """The archive's arrays from their headers, and the values of those in `names` (all of
    them by default) summarised a chunk at a time; nothing is held whole."""
    with path.open("rb") as handle:
        magic = handle.read(len(np.lib.format.MAGIC_PREFIX))
    if not magic.startswith(NPZ_PREFIXES):
        if magic == np.lib.format.MAGIC_PREFIX:
            return NpzInventory(error="it is one .npy array, not an .npz archive of them")
        try:
            np.load(path, allow_pickle=False)  # what it says of the file, before reading it
        except (OSError, ValueError, EOFError) as error:
            return NpzInventory(error=str(error))
        return NpzInventory(error="it is not a zip archive")
    try:
        with np.load(path, allow_pickle=False) as archive:  # opens the zip's directory only
            members = {name: _member(archive.zip, name) for name in archive.files}
            arrays = {
                name: _array_facts(archive.zip, member, names is None or name in names)
                for name, member in members.items()
            }
    except UNREADABLE as error:
        return NpzInventory(error=str(error))
    return NpzInventory(arrays=arrays)


def _member(archive: zipfile.ZipFile, name: str) -> str:
    """The zip member numpy.load reads for `name`: itself, else `name.npy`."""
    return name if name in archive.namelist() else f"{name}.npy"


def _array_facts(archive: zipfile.ZipFile, member: str, summarise: bool) -> ArrayFacts:
    """The member's header and, with `summarise`, its values' summary; what numpy.load would
    find wrong with it as `error`."""
    try:
        with archive.open(member) as stream:
            version = np.lib.format.read_magic(stream)
            read_header = (
                np.lib.format.read_array_header_1_0
                if version == (1, 0)
                else np.lib.format.read_array_header_2_0
            )
            shape, fortran, dtype = read_header(stream)
            facts = ArrayFacts(
                shape=tuple(int(n) for n in shape),
                descr=np.lib.format.dtype_to_descr(dtype),
                fortran=bool(fortran),
            )
            if dtype.hasobject:
                return facts.model_copy(
                    update={"error": "Object arrays cannot be loaded when allow_pickle=False"}
                )
            if not summarise:
                return facts
            values = _summary(_chunks(stream, dtype, math.prod(facts.shape)))
    except UNREADABLE as error:
        return ArrayFacts(error=str(error))
    return facts.model_copy(update={"values": values if dtype.kind in "biuf" else None})


def _chunks(stream: IO[bytes], dtype: np.dtype[Any], count: int) -> Iterator[np.ndarray]:
    """The array's values in order of storage, CHUNK_BYTES at a time (numbers only; other
    dtypes are read through, so that a short or corrupted member is found all the same).
    A member shorter than its header says raises EOFError."""
    total = remaining = count * dtype.itemsize
    step = max(dtype.itemsize, CHUNK_BYTES // max(dtype.itemsize, 1) * dtype.itemsize)
    numbers = dtype.kind in "biuf" and dtype.fields is None and dtype.subdtype is None
    while remaining > 0:
        wanted = min(step, remaining)
        data = stream.read(wanted)  # a zip member returns less only at its end
        if len(data) < wanted:
            got = total - remaining + len(data)
            raise EOFError(f"EOF: reading array data, expected {total} bytes got {got}")
        remaining -= wanted
        if numbers:
            yield np.frombuffer(data, dtype=dtype)


def _summary(chunks: Iterator[np.ndarray]) -> Values:
    values = Values()
    for chunk in chunks:
        if len(chunk):
            values = values.merged(_values(chunk))
    return values


def _values(chunk: np.ndarray) -> Values:
    """A chunk's summary: integers' extremes, floats' finiteness (as stored and as float32)."""
    if chunk.dtype.kind in "biu":
        return Values(low=int(chunk.min()), high=int(chunk.max()))
    with np.errstate(over="ignore", invalid="ignore"):
        return Values(
            finite=bool(np.isfinite(chunk).all()),
            finite32=bool(np.isfinite(chunk.astype(np.float32)).all()),
        )


# -- .csv ----------------------------------------------------------------------------------------
def csv_inventory(path: Path) -> CsvInventory:
    """The table's first row, width and rows, and each column's values summarised
    CSV_CELLS cells at a time, as the csv source reads them (numpy's conversions of the cells'
    text); the whole file is read, so that a bad byte at its end is found as the csv source
    finds it."""
    scan = _CsvScan()
    try:
        with path.open(newline="", encoding="utf-8") as handle:
            reader = csv.reader(handle)
            for row in reader:
                if row:
                    scan.add(row, reader.line_num)
    except (OSError, UnicodeDecodeError, csv.Error) as error:
        return CsvInventory(error=str(error))
    return scan.finish()


class _CsvScan:
    """Rows gathered into chunks whose cells, as one fixed-width string array, stay bounded."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self.width = 0
        self.rows = 0
        self.ragged: Cell | None = None
        self.head: list[ColumnFacts] = []
        self.body: list[_Column] = []
        self.pending: list[list[str]] = []
        self.lines: list[int] = []
        self.longest = 0

    def add(self, row: list[str], line: int) -> None:
        if not self.width:
            self.names, self.width = [name.strip() for name in row], len(row)
            self.head = [column.facts() for column in _summarise([row], [line], self.width)]
            self.body = [_Column() for _ in row]
            return
        self.rows += 1
        if self.ragged is not None:
            return  # the table is refused for that row; what follows is read for its bytes only
        if len(row) != self.width:
            self.ragged = Cell(line=line, text=str(len(row)))
            self.pending, self.lines = [], []
            return
        longest = max(self.longest, max(map(len, row)))
        cells = (len(self.pending) + 1) * self.width
        if self.pending and (cells > CSV_CELLS or cells * longest * 4 > CSV_ARRAY_BYTES):
            self._flush()
            longest = max(map(len, row))
        self.pending.append(row)
        self.lines.append(line)
        self.longest = longest

    def _flush(self) -> None:
        _summarise(self.pending, self.lines, self.width, self.body)
        self.pending, self.lines, self.longest = [], [], 0

    def finish(self) -> CsvInventory:
        if self.pending:
            self._flush()
        return CsvInventory(
            names=self.names,
            width=self.width,
            rows=self.rows,
            ragged=self.ragged,
            head=self.head,
            body=[column.facts() for column in self.body] if self.ragged is None else [],
        )


class _Column:
    """A column's facts while its chunks come in."""

    def __init__(self) -> None:
        self.integers = True
        self.ints: Values | None = None
        self.floats: Values | None = None
        self.not_a_number: Cell | None = None

    def facts(self) -> ColumnFacts:
        values = self.ints if self.integers else self.floats
        return ColumnFacts(
            integers=self.integers,
            values=values or Values(),
            not_a_number=self.not_a_number,
        )

    def see_floats(self, numbers: np.ndarray) -> None:
        summary = _values(numbers)
        self.floats = summary if self.floats is None else self.floats.merged(summary)

    def see_ints(self, numbers: np.ndarray) -> None:
        summary = _values(numbers)
        self.ints = summary if self.ints is None else self.ints.merged(summary)


def _summarise(
    rows: list[list[str]], lines: list[int], width: int, columns: list[_Column] | None = None
) -> list[_Column]:
    """Add the cells of `rows` (of `width` cells each) to each column's facts."""
    columns = columns if columns is not None else [_Column() for _ in range(width)]
    longest = max(max(map(len, row)) for row in rows)
    if len(rows) * width * max(longest, 1) * 4 <= CSV_ARRAY_BYTES:
        cells = np.array(rows, dtype=str)  # (R, W), as the csv source holds a table
        _see(columns, list(range(width)), cells, lines)
    else:  # one row too wide for that: a column at a time
        for index in range(width):
            _see(columns, [index], np.array([[row[index]] for row in rows], dtype=str), lines)
    return columns


def _see(columns: list[_Column], indices: list[int], cells: np.ndarray, lines: list[int]) -> None:
    """`cells` (R, len(indices)) are the cells of columns `indices`: read them as the csv
    source does, as float64 (the samples) and as int64 (a label of classes)."""
    try:
        numbers = cells.astype(np.float64)
        for at, index in enumerate(indices):
            columns[index].see_floats(numbers[:, at])
    except ValueError:
        for at, index in enumerate(indices):
            column = columns[index]
            if column.not_a_number is not None:
                continue
            try:
                column.see_floats(cells[:, at].astype(np.float64))
            except ValueError:
                column.not_a_number = _first_not_a_number(cells[:, at], lines)
    wanted = [at for at, index in enumerate(indices) if columns[indices[at]].integers]
    if not wanted:
        return
    try:
        ints = cells[:, wanted].astype(np.int64)
        for place, at in enumerate(wanted):
            columns[indices[at]].see_ints(ints[:, place])
    except (ValueError, OverflowError):
        for at in wanted:
            try:
                columns[indices[at]].see_ints(cells[:, at].astype(np.int64))
            except (ValueError, OverflowError):
                columns[indices[at]].integers = False


def _first_not_a_number(cells: np.ndarray, lines: list[int]) -> Cell:
    for row, cell in enumerate(cells):
        try:
            np.array(cell).astype(np.float64)
        except ValueError:
            return Cell(line=lines[row], text=str(cell)[:CELL_TEXT])
    raise AssertionError("a column that did not convert holds a cell that does not")
