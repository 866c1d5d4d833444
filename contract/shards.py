"""A folder of shards, the on-disk format that the upload path writes and the workers stream.

Two formats:
- `npy`: pairs `NNNNN.x.npy` (samples, (rows, ...)) and `NNNNN.y.npy` (labels, (rows, ...)),
  read by memory map;
- `parquet`: `*.parquet` files with a column `x` (a fixed-size list, possibly nested) or scalar
  feature columns, and a column `y`, read by row group.

An optional `categories.json` ({"features": {column: [values]}, "label": [values]}) names what
the integer codes of categorical columns stood for; it travels with the dataset's description.

`describe_shards` reads only the npy headers and the parquet footers (and the labels' extremes,
from parquet statistics or the label arrays, LABEL_CHUNK rows at a time), never the samples, so
that describing a dataset of any size is fast and holds megabytes. Shards that disagree in shape
or dtype are refused with the shard's name. Imports numpy and pyarrow only (the store validates
uploaded shards with it).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import numpy as np

ShardFormat = Literal["npy", "parquet"]
FORMATS: tuple[ShardFormat, ...] = ("npy", "parquet")
CATEGORIES_FILE = "categories.json"
NPY_PATTERN = re.compile(r"^(\d{1,9})\.(x|y)\.npy$")
# The most shards one folder may hold: each is opened once per description.
MAX_SHARDS = 100_000
# Labels are scanned for their extremes in chunks of this many rows (npy: no statistics).
LABEL_CHUNK = 1 << 20
# The largest categories.json read: 10,000 values of a few columns (it travels with jobs).
MAX_CATEGORIES_BYTES = 16 * 2**20


class ShardError(ValueError):
    """The folder is not a valid set of shards; `shard` names the offending file, if one."""

    def __init__(self, message: str, shard: str | None = None) -> None:
        super().__init__(message)
        self.message, self.shard = message, shard


@dataclass(frozen=True)
class Shard:
    name: str  # the stem that orders the shards: "00003" (npy) or the file's stem (parquet)
    rows: int
    x_path: Path  # npy: NNNNN.x.npy; parquet: the file (x_path == y_path)
    y_path: Path
    # npy: where the array data starts in each file (after the header)
    x_offset: int = 0
    y_offset: int = 0
    # parquet: the rows of each row group
    row_groups: tuple[int, ...] = ()


@dataclass(frozen=True)
class ShardsDescription:
    """What a folder of shards holds, from headers and metadata."""

    folder: Path
    format: ShardFormat
    shards: tuple[Shard, ...]
    sample_shape: tuple[int, ...]
    x_dtype: str  # numpy dtype as stored ("float32", "int64", ...); parquet scalar columns: float
    y_shape: tuple[int, ...]
    y_dtype: str
    y_min: float
    y_max: float
    feature_columns: tuple[str, ...] = ()  # parquet without an `x` column: the scalar features
    categories: dict[str, Any] | None = field(default=None)

    @property
    def rows(self) -> int:
        return sum(shard.rows for shard in self.shards)

    @property
    def x_row_bytes(self) -> int:
        return math.prod(self.sample_shape) * np.dtype(self.x_dtype).itemsize

    @property
    def y_row_bytes(self) -> int:
        return math.prod(self.y_shape) * np.dtype(self.y_dtype).itemsize

    @property
    def labels_are_indices(self) -> bool:
        return np.dtype(self.y_dtype).kind in "iub"


def describe_shards(folder: Path, format: ShardFormat) -> ShardsDescription:
    """The description of the shards in `folder` (see the module), or a ShardError."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ShardError(f"'{folder}' is not a folder of shards")
    if format == "npy":
        description = _describe_npy(folder)
    elif format == "parquet":
        description = _describe_parquet(folder)
    else:
        raise ShardError(f"unknown shard format '{format}'; the formats are {', '.join(FORMATS)}")
    categories = _read_categories(folder)
    if categories is not None:
        labels = categories.get("label")
        if isinstance(labels, list) and labels and description.y_max >= len(labels):
            raise ShardError(
                f"{CATEGORIES_FILE} names {len(labels)} label values, but a label is "
                f"{int(description.y_max)}",
                CATEGORIES_FILE,
            )
    return replace(description, categories=categories)


def _read_categories(folder: Path) -> dict[str, Any] | None:
    path = folder / CATEGORIES_FILE
    if not path.is_file():
        return None
    size = path.stat().st_size
    if size > MAX_CATEGORIES_BYTES:
        raise ShardError(
            f"{CATEGORIES_FILE} takes {size} bytes, more than the {MAX_CATEGORIES_BYTES} read",
            CATEGORIES_FILE,
        )
    try:
        categories = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ShardError(f"cannot read {CATEGORIES_FILE}: {error}", CATEGORIES_FILE) from None
    features = categories.get("features", {}) if isinstance(categories, dict) else None
    label = categories.get("label", []) if isinstance(categories, dict) else None
    if (
        not isinstance(features, dict)
        or not all(isinstance(v, list) for v in features.values())
        or not isinstance(label, list)
    ):
        raise ShardError(
            f'{CATEGORIES_FILE} must be {{"features": {{column: [values]}}, "label": [values]}}',
            CATEGORIES_FILE,
        )
    return {"features": features, "label": label}


def _too_many(count: int) -> None:
    if count > MAX_SHARDS:
        raise ShardError(f"the folder holds {count} shards, more than the {MAX_SHARDS} allowed")


def npy_header(path: Path) -> tuple[tuple[int, ...], np.dtype[Any], int]:
    """(shape, dtype, data offset) of an .npy file, from its header alone."""
    try:
        with path.open("rb") as handle:
            version = np.lib.format.read_magic(handle)
            if version == (1, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_1_0(handle)
            else:
                shape, fortran, dtype = np.lib.format.read_array_header_2_0(handle)
            offset = handle.tell()
    except (OSError, ValueError, EOFError) as error:
        raise ShardError(f"{path.name} is not a readable .npy file: {error}", path.name) from None
    if fortran and len(shape) > 1:
        raise ShardError(f"{path.name} is stored in Fortran order; write it C-ordered", path.name)
    if dtype.hasobject or dtype.kind not in "iufb" or dtype.fields is not None:
        raise ShardError(f"{path.name} holds {dtype} values; shards hold numbers", path.name)
    if len(shape) == 0:
        raise ShardError(f"{path.name} is a scalar, not one row per sample", path.name)
    expected = offset + math.prod(shape) * dtype.itemsize
    if path.stat().st_size < expected:
        raise ShardError(
            f"{path.name} is truncated: its header promises {expected} bytes, the file has "
            f"{path.stat().st_size}",
            path.name,
        )
    return tuple(int(n) for n in shape), dtype, offset


def _describe_npy(folder: Path) -> ShardsDescription:
    found: dict[str, dict[str, Path]] = {}
    for path in folder.iterdir():
        match = NPY_PATTERN.match(path.name)
        if match:
            found.setdefault(match.group(1), {})[match.group(2)] = path
    if not found:
        raise ShardError(f"'{folder.name}' holds no NNNNN.x.npy / NNNNN.y.npy shards")
    _too_many(len(found))
    shards, first = [], None
    for name in sorted(found, key=lambda n: (int(n), n)):
        pair = found[name]
        for part in ("x", "y"):
            if part not in pair:
                other = "x" if part == "y" else "y"
                raise ShardError(
                    f"shard {name} has {name}.{other}.npy but no {name}.{part}.npy",
                    f"{name}.{other}.npy",
                )
        x_shape, x_dtype, x_offset = npy_header(pair["x"])
        y_shape, y_dtype, y_offset = npy_header(pair["y"])
        if x_shape[0] != y_shape[0]:
            raise ShardError(
                f"shard {name}: {pair['x'].name} has {x_shape[0]} samples but "
                f"{pair['y'].name} has {y_shape[0]} labels",
                pair["y"].name,
            )
        facts = (x_shape[1:], x_dtype, y_shape[1:], y_dtype)
        if first is None:
            first = (name, facts)
        elif facts != first[1]:
            raise ShardError(_disagree(name, facts, first[0], first[1]), pair["x"].name)
        shards.append(Shard(name, x_shape[0], pair["x"], pair["y"], x_offset, y_offset))
    assert first is not None
    sample_shape, x_dtype, y_shape, y_dtype = first[1]
    low, high = _npy_label_range(shards, y_shape, y_dtype)
    return ShardsDescription(
        folder, "npy", tuple(shards), sample_shape, x_dtype.name, y_shape, y_dtype.name, low, high
    )


def _disagree(name: str, facts: tuple[Any, ...], first: str, want: tuple[Any, ...]) -> str:
    def words(f: tuple[Any, ...]) -> str:
        return f"samples {f[1]} {list(f[0])}, labels {f[3]} {list(f[2])}"

    return f"shard {name} holds {words(facts)}, but shard {first} holds {words(want)}"


def _npy_label_range(
    shards: list[Shard], y_shape: tuple[int, ...], y_dtype: np.dtype[Any]
) -> tuple[float, float]:
    """The smallest and largest label, read LABEL_CHUNK rows at a time (not memory-mapped:
    the pages of a map would stay resident in this process); the samples are not read."""
    low, high = math.inf, -math.inf
    for shard in shards:
        for chunk in npy_rows(shard.y_path, shard.y_offset, y_dtype, shard.rows, y_shape):
            if chunk.dtype.kind == "f" and not np.isfinite(chunk).all():
                raise ShardError(
                    f"shard {shard.name}: labels contain NaN or infinity", shard.y_path.name
                )
            low, high = min(low, float(chunk.min())), max(high, float(chunk.max()))
    if low == math.inf:
        raise ShardError("the shards hold no samples")
    return low, high


def npy_rows(
    path: Path, offset: int, dtype: np.dtype[Any], rows: int, shape: tuple[int, ...] = ()
) -> Iterator[np.ndarray]:
    """The rows of an .npy file's array (of per-row `shape`, its data at `offset`), read
    LABEL_CHUNK rows at a time."""
    per_row = math.prod(shape)
    with path.open("rb") as handle:
        handle.seek(offset)
        for start in range(0, rows, LABEL_CHUNK):
            count = min(LABEL_CHUNK, rows - start)
            chunk = np.fromfile(handle, dtype=dtype, count=count * per_row)
            if len(chunk) < count * per_row:
                raise ShardError(f"{path.name} is shorter than its header says", path.name)
            yield chunk.reshape(count, *shape)


def _describe_parquet(folder: Path) -> ShardsDescription:
    import pyarrow as pa
    import pyarrow.parquet as pq

    files = sorted(path for path in folder.iterdir() if path.suffix == ".parquet")
    if not files:
        raise ShardError(f"'{folder.name}' holds no .parquet shards")
    _too_many(len(files))
    shards, first = [], None
    low, high = math.inf, -math.inf
    for path in files:
        try:
            meta = pq.ParquetFile(path)
        except (OSError, pa.ArrowException) as error:
            raise ShardError(
                f"{path.name} is not a readable Parquet file: {error}", path.name
            ) from None
        with meta:
            facts = _parquet_columns(path.name, meta.schema_arrow)
            if first is None:
                first = (path.stem, facts)
            elif facts != first[1]:
                raise ShardError(
                    f"shard {path.stem} holds {_columns_words(facts)}, but shard {first[0]} "
                    f"holds {_columns_words(first[1])}",
                    path.name,
                )
            metadata = meta.metadata
            groups = tuple(metadata.row_group(i).num_rows for i in range(metadata.num_row_groups))
            shards.append(Shard(path.stem, metadata.num_rows, path, path, row_groups=groups))
            group_low, group_high = _parquet_label_range(meta, path.name)
            low, high = min(low, group_low), max(high, group_high)
    assert first is not None
    if low == math.inf:
        raise ShardError("the shards hold no samples")
    sample_shape, x_dtype, y_shape, y_dtype, features = first[1]
    return ShardsDescription(
        folder,
        "parquet",
        tuple(shards),
        sample_shape,
        x_dtype,
        y_shape,
        y_dtype,
        low,
        high,
        features,
    )


def _columns_words(facts: tuple[Any, ...]) -> str:
    return f"samples {facts[1]} {list(facts[0])}, labels {facts[3]} {list(facts[2])}"


def _list_shape(kind: Any) -> tuple[tuple[int, ...], Any]:
    """(shape, value type) of a (nested) fixed-size list type."""
    import pyarrow as pa

    shape: list[int] = []
    while pa.types.is_fixed_size_list(kind):
        shape.append(kind.list_size)
        kind = kind.value_type
    return tuple(shape), kind


def _numeric(kind: Any) -> str | None:
    """The numpy dtype name of a numeric arrow type, or None."""
    import pyarrow as pa

    if pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_boolean(kind):
        return str(np.dtype(kind.to_pandas_dtype()))
    return None


def _parquet_columns(name: str, schema: Any) -> tuple[Any, ...]:
    """(sample shape, x dtype, y shape, y dtype, feature columns) from a file's schema."""
    if "y" not in schema.names:
        raise ShardError(f"{name} has no column 'y' (the labels)", name)
    y_shape, y_value = _list_shape(schema.field("y").type)
    y_dtype = _numeric(y_value)
    if y_dtype is None:
        raise ShardError(f"{name} column 'y' holds {y_value}; labels are numbers", name)
    if "x" in schema.names:
        x_shape, x_value = _list_shape(schema.field("x").type)
        x_dtype = _numeric(x_value)
        if not x_shape or x_dtype is None:
            raise ShardError(
                f"{name} column 'x' is {schema.field('x').type}; it must be a fixed-size list "
                "of numbers (or give scalar feature columns instead of 'x')",
                name,
            )
        return x_shape, x_dtype, y_shape, y_dtype, ()
    features = tuple(column for column in schema.names if column != "y")
    if not features:
        raise ShardError(f"{name} has no feature columns besides 'y'", name)
    for column in features:
        if _numeric(schema.field(column).type) is None:
            raise ShardError(
                f"{name} column '{column}' holds {schema.field(column).type}; feature columns "
                "hold numbers (categories as integer codes)",
                name,
            )
    return (len(features),), "float32", y_shape, y_dtype, features


def _parquet_label_range(meta: Any, name: str) -> tuple[float, float]:
    """The labels' extremes from the row groups' statistics; the label column alone is read,
    LABEL_CHUNK rows at a time, where a writer left no statistics."""
    import pyarrow as pa
    import pyarrow.compute as pc

    low, high = math.inf, -math.inf
    index = meta.schema_arrow.get_field_index("y")
    for group in range(meta.metadata.num_row_groups):
        if meta.metadata.row_group(group).num_rows == 0:
            continue
        column = meta.metadata.row_group(group).column(index)
        stats = column.statistics
        if (
            stats is not None
            and stats.has_min_max
            and column.path_in_schema == "y"
            and stats.null_count == 0
        ):
            low, high = min(low, float(stats.min)), max(high, float(stats.max))
            continue
        batches = meta.iter_batches(LABEL_CHUNK, row_groups=[group], columns=["y"])
        for batch in batches:
            labels = batch.column("y")
            if labels.null_count:
                raise ShardError(f"{name} column 'y' has empty cells", name)
            while pa.types.is_fixed_size_list(labels.type):
                labels = labels.flatten()
            extremes = pc.min_max(labels)
            low = min(low, float(extremes["min"].as_py()))
            high = max(high, float(extremes["max"].as_py()))
    if low != math.inf and not (math.isfinite(low) and math.isfinite(high)):
        raise ShardError(f"{name}: labels contain NaN or infinity", name)
    return low, high
