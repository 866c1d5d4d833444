"""User data from files: numpy .npz archives and numeric .csv tables.

Loading reads a file whole (a worker, within its memory limit). Describing it does not: the
DataInfo a job is checked against is derived from the file's inventory (contract/inventory.py:
headers and a summary of the values, read a bounded chunk at a time), with the checks loading
makes, in the same order and words, so that a job refused by its worker is refused when it is
checked. An uploaded dataset's inventory was taken when its upload completed and is stored with
it; a file given by path is inventoried when it is described.
"""

from __future__ import annotations

import csv
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from contract.inventory import (
    ArrayFacts,
    ColumnFacts,
    CsvInventory,
    NpzInventory,
    csv_inventory,
    npz_inventory,
)
from dsl.data_config import CsvData, NpzData
from dsl.errors import DataSourceError
from workers.data.base import (
    DataInfo,
    Dataset,
    DataSource,
    XDtype,
    check_classes,
    check_splittable,
    infer_labels,
    register_source,
    resolve_file,
    samples_as,
    split_train_test,
    to_dataset,
)


@register_source("npz")
class NpzSource(DataSource[NpzData]):
    def load(self, config: NpzData, *, seed: int, cache_dir: Path, base_dir: Path) -> Dataset:
        path = resolve_file(config.path, base_dir)
        arrays = _read_npz(path, config)
        x, x_dtype = samples_as(arrays["x_key"], f"{path} '{config.x_key}'", "x_key")
        y = arrays["y_key"]
        if "x_test_key" not in arrays:
            x, y, x_test, y_test = split_train_test(x, y, config.test_fraction, seed)
        else:
            x_test, y_test = _other_split(arrays, "test", path, config, x, x_dtype, y)
        x_val, y_val = None, None
        if "x_val_key" in arrays:
            x_val, y_val = _other_split(arrays, "val", path, config, x, x_dtype, y)
        labels = infer_labels(y, y_test, f"{path} '{config.y_key}'", "y_key", y_val)
        info = DataInfo(
            sample_shape=x.shape[1:],
            num_classes=labels.num_classes,
            label_shape=labels.label_shape,
            label_is_index=labels.label_is_index,
            x_dtype=x_dtype,
        )
        return to_dataset(info, x, labels.train, x_test, labels.test, x_val, labels.val)

    def describe(self, config: NpzData, *, seed: int, cache_dir: Path, base_dir: Path) -> DataInfo:
        path = resolve_file(config.path, base_dir)
        return npz_info(npz_inventory(path, set(_npz_names(config).values())), config, path)


def _other_split(
    arrays: dict[str, np.ndarray],
    split: str,
    path: Path,
    config: NpzData,
    x: np.ndarray,
    x_dtype: str,
    y: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """The npz's own `split` ("test" or "val") samples and labels, refused unless their
    per-sample shapes and dtype are the training split's."""
    x_field, y_field = f"x_{split}_key", f"y_{split}_key"
    where = f"{path} '{getattr(config, x_field)}'"
    x_other, x_other_dtype = samples_as(arrays[x_field], where, x_field)
    y_other = arrays[y_field]
    if x_other.shape[1:] != x.shape[1:] or x_other_dtype != x_dtype:
        raise DataSourceError(
            f"{where} holds {x_other_dtype} samples of shape {list(x_other.shape[1:])} but "
            f"'{config.x_key}' holds {x_dtype} {list(x.shape[1:])}",
            field=x_field,
        )
    if y_other.shape[1:] != y.shape[1:]:
        raise DataSourceError(
            f"{path} '{getattr(config, y_field)}' holds labels of shape "
            f"{list(y_other.shape[1:])} but '{config.y_key}' {list(y.shape[1:])}",
            field=y_field,
        )
    return x_other, y_other


NPZ_KEYS = ("x_key", "y_key", "x_test_key", "y_test_key", "x_val_key", "y_val_key")
PAIRS = (("x_key", "y_key"), ("x_test_key", "y_test_key"), ("x_val_key", "y_val_key"))


def _npz_names(config: NpzData) -> dict[str, str]:
    """The array each configured key names, by key (`"x_key"`...)."""
    return {key: getattr(config, key) for key in NPZ_KEYS if getattr(config, key) is not None}


def _read_npz(path: Path, config: NpzData) -> dict[str, np.ndarray]:
    """The configured arrays by config key (`"x_key"`...); the test pair only when present,
    the validation pair when named."""
    keys = _npz_names(config)
    try:
        with np.load(path, allow_pickle=False) as archive:
            present = sorted(archive.files)
            arrays = {key: archive[name] for key, name in keys.items() if name in present}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as error:
        raise _unreadable_npz(path, str(error)) from error
    _check_npz_keys(path, config, present, {key: array.shape for key, array in arrays.items()})
    return arrays


def _unreadable_npz(path: Path, error: str) -> DataSourceError:
    return DataSourceError(
        f"cannot read {path} as a numpy .npz archive: {error}",
        hint="write it with numpy.savez(path, x=..., y=...); object arrays are not accepted",
        field="path",
    )


def _check_npz_keys(
    path: Path, config: NpzData, present: list[str], shapes: dict[str, tuple[int, ...]]
) -> None:
    """The configured arrays (their shapes by key) are there, one row per sample, as many
    samples as labels."""
    keys = _npz_names(config)
    test_keys = {"x_test_key", "y_test_key"}
    # Test keys left at their defaults are optional; keys the user named must exist.
    required = {"x_key", "y_key", *(key for key in ("x_val_key", "y_val_key") if key in keys)}
    if test_keys & (shapes.keys() | config.model_fields_set):
        required |= test_keys
    missing = sorted(required - shapes.keys())
    if missing:
        key = missing[0]
        raise DataSourceError(
            f"{path} has no array '{keys[key]}'",
            hint=f"the file holds: {', '.join(present) or 'nothing'}",
            field=key,
        )
    for key, shape in shapes.items():
        if len(shape) == 0:
            raise DataSourceError(
                f"{path} '{keys[key]}' is a scalar, not one row per sample", field=key
            )
    for x_key, y_key in PAIRS:
        if x_key in shapes and shapes[x_key][0] != shapes[y_key][0]:
            raise DataSourceError(
                f"{path}: '{keys[x_key]}' has {shapes[x_key][0]} samples but "
                f"'{keys[y_key]}' has {shapes[y_key][0]} labels",
                field=y_key,
            )


def npz_info(inventory: NpzInventory, config: NpzData, path: Path) -> DataInfo:
    """The DataInfo loading `config` from the archive at `path` gives, from the archive's
    inventory: the same checks in the same order, each refusal the same DataSourceError."""
    keys = _npz_names(config)
    if inventory.error is not None:
        raise _unreadable_npz(path, inventory.error)
    arrays = {key: inventory.arrays[name] for key, name in keys.items() if name in inventory.arrays}
    for facts in arrays.values():
        if facts.error is not None:
            raise _unreadable_npz(path, facts.error)
    present = sorted(inventory.arrays)
    _check_npz_keys(path, config, present, {key: facts.shape for key, facts in arrays.items()})
    x = arrays["x_key"]
    x_dtype = _sample_dtype(x, f"{path} '{config.x_key}'", "x_key")
    samples = x.shape[0]
    splits = ("test", "val") if "x_test_key" in arrays else ("val",)
    if "x_test_key" not in arrays:
        check_splittable(samples)
    for split in splits:
        x_field, y_field = f"x_{split}_key", f"y_{split}_key"
        if x_field not in arrays:
            continue
        where = f"{path} '{keys[x_field]}'"
        other, other_dtype = arrays[x_field], _sample_dtype(arrays[x_field], where, x_field)
        if other.shape[1:] != x.shape[1:] or other_dtype != x_dtype:
            raise DataSourceError(
                f"{where} holds {other_dtype} samples of shape {list(other.shape[1:])} but "
                f"'{config.x_key}' holds {x_dtype} {list(x.shape[1:])}",
                field=x_field,
            )
        y, y_other = arrays["y_key"], arrays[y_field]
        if y_other.shape[1:] != y.shape[1:]:
            raise DataSourceError(
                f"{path} '{keys[y_field]}' holds labels of shape {list(y_other.shape[1:])} but "
                f"'{config.y_key}' {list(y.shape[1:])}",
                field=y_field,
            )
        if other.shape[0] == 0:
            raise DataSourceError(f"{where} holds no samples", field=x_field)
        samples += other.shape[0]
    if samples == 0 or x.shape[0] == 0:
        raise DataSourceError(f"{path} '{config.x_key}' holds no samples", field="x_key")
    labels = [arrays[key] for key in ("y_key", "y_test_key", "y_val_key") if key in arrays]
    kind, classes, shape = _label_facts(labels, f"{path} '{config.y_key}'", "y_key")
    return DataInfo(
        sample_shape=x.shape[1:],
        num_classes=classes,
        label_shape=shape,
        label_is_index=kind == "index",
        x_dtype=x_dtype,
        num_samples=samples,
    )


def _sample_dtype(facts: ArrayFacts, where: str, field: str) -> XDtype:
    """What `samples_as` makes of the array: its dtype, or its refusal."""
    dtype = facts.dtype
    if dtype.kind in "iu":
        return "int64"
    if dtype.kind in "fb":
        assert facts.values is not None  # a summarised array of numbers
        if not facts.values.finite32:
            raise DataSourceError(f"{where}: samples contain NaN or infinity", field=field)
        return "float32"
    raise DataSourceError(f"{where}: samples have dtype {dtype}; expected numbers", field=field)


def _label_facts(
    labels: list[ArrayFacts], where: str, field: str
) -> tuple[str, int | None, tuple[int, ...]]:
    """What `infer_labels` makes of the label arrays of every split: ("index", classes,
    shape) or ("target", None, shape), or its refusal."""
    dtype = np.result_type(*(facts.dtype for facts in labels))  # what concatenating gives
    if dtype.kind in "iubf":
        values = [facts.values for facts in labels]
        assert all(summary is not None for summary in values)  # summarised arrays of numbers
    if dtype.kind in "iub":
        low = min(summary.low for summary in values if summary and summary.low is not None)
        high = max(summary.high for summary in values if summary and summary.high is not None)
        check_classes(low, high, where, field)
        return "index", high + 1, labels[0].shape[1:]
    if dtype.kind == "f":
        if not all(summary and summary.finite for summary in values):
            raise DataSourceError(f"{where}: labels contain NaN or infinity", field=field)
        return "target", None, labels[0].shape[1:] or (1,)
    raise DataSourceError(
        f"{where}: labels have dtype {dtype}; expected integers (classes) or floats",
        field=field,
    )


@register_source("csv")
class CsvSource(DataSource[CsvData]):
    def load(self, config: CsvData, *, seed: int, cache_dir: Path, base_dir: Path) -> Dataset:
        path = resolve_file(config.path, base_dir)
        table = _read_table(path, config.header, "path")
        label = _label_index(path, config.label_column, table.names, table.cells.shape[1])
        x, y = _features_and_labels(table, label, "path")
        x, y, x_test, y_test = split_train_test(x, y, config.test_fraction, seed)
        x, _ = samples_as(x, str(path), "path")
        x_test, _ = samples_as(x_test, str(path), "path")
        x_val, y_val = None, None
        if config.val_path is not None:
            x_val, y_val = _validation_table(config, base_dir, table)
        labels = infer_labels(y, y_test, f"{path} column {label + 1}", "label_column", y_val)
        info = DataInfo(
            sample_shape=x.shape[1:],
            num_classes=labels.num_classes,
            label_shape=labels.label_shape,
            label_is_index=labels.label_is_index,
            x_dtype="float32",
        )
        return to_dataset(info, x, labels.train, x_test, labels.test, x_val, labels.val)

    def describe(self, config: CsvData, *, seed: int, cache_dir: Path, base_dir: Path) -> DataInfo:
        path = resolve_file(config.path, base_dir)

        def read_validation() -> tuple[Path, CsvInventory]:
            assert config.val_path is not None
            val_path = resolve_file(config.val_path, base_dir, field="val_path")
            return val_path, csv_inventory(val_path)

        return csv_info(csv_inventory(path), config, path, read_validation)


def _features_and_labels(table: _Table, label: int, field: str) -> tuple[np.ndarray, np.ndarray]:
    """(N, F) features and (N,) labels of the table's rows."""
    features = [col for col in range(table.cells.shape[1]) if col != label]
    x = _parse(table, features, field)  # (N, F)
    try:
        # Labels written as whole numbers are class indices; anything else is a target.
        y = table.cells[:, label].astype(np.int64)
    except ValueError:
        y = _parse(table, [label], "label_column" if field == "path" else field)[:, 0]
    return x, y


def _validation_table(
    config: CsvData, base_dir: Path, train: _Table
) -> tuple[np.ndarray, np.ndarray]:
    """The validation file's features and labels, read as the main file is; its columns must
    be the main file's."""
    assert config.val_path is not None
    path = resolve_file(config.val_path, base_dir, field="val_path")
    table = _read_table(path, config.header, "val_path")
    if table.cells.shape[1] != train.cells.shape[1] or table.names != train.names:
        what = ", ".join(table.names) if table.names else f"{table.cells.shape[1]} columns"
        want = ", ".join(train.names) if train.names else f"{train.cells.shape[1]} columns"
        raise DataSourceError(
            f"{path} has {what}; the validation file needs the columns of {train.path} ({want})",
            field="val_path",
        )
    label = _label_index(path, config.label_column, table.names, table.cells.shape[1])
    x, y = _features_and_labels(table, label, "val_path")
    x, _ = samples_as(x, str(path), "val_path")
    return x, y


@dataclass(frozen=True)
class _Table:
    path: Path
    names: list[str] | None
    cells: np.ndarray  # (N, columns) of str
    lines: list[int]  # the file line of each row, for error messages


def _read_table(path: Path, header: bool, field: str) -> _Table:
    try:
        with path.open(newline="", encoding="utf-8") as handle:
            reader = csv.reader(handle)
            rows, lines = [], []
            for row in reader:
                if row:
                    rows.append(row)
                    lines.append(reader.line_num)
    except (OSError, UnicodeDecodeError, csv.Error) as error:
        raise DataSourceError(f"cannot read {path} as CSV: {error}", field=field) from error
    names = [name.strip() for name in rows.pop(0)] if header and rows else None
    lines = lines[1:] if names is not None else lines
    if not rows:
        raise DataSourceError(f"{path} holds no data rows", field=field)
    width = len(names) if names is not None else len(rows[0])
    for row, line in zip(rows, lines, strict=True):
        if len(row) != width:
            raise DataSourceError(
                f"{path} line {line} has {len(row)} columns, expected {width}", field=field
            )
    if width < 2:
        raise DataSourceError(
            f"{path} has {width} column; it needs features and a label column", field=field
        )
    return _Table(path, names, np.array(rows, dtype=str), lines)


def _label_index(path: Path, column: int | str, names: list[str] | None, width: int) -> int:
    if isinstance(column, str):
        if names is None or column not in names:
            raise DataSourceError(
                f"{path} has no column named '{column}'",
                hint=f"the header names: {', '.join(names or [])}",
                field="label_column",
            )
        return names.index(column)
    if not -width <= column < width:
        raise DataSourceError(
            f"{path} has {width} columns, so label_column {column} does not exist",
            hint=f"use 0..{width - 1}, or a negative index counting from the end",
            field="label_column",
        )
    return column % width


def _parse(table: _Table, columns: list[int], field: str) -> np.ndarray:
    """The cells of `columns` as numbers, parsed in one go; on failure name the first bad cell."""
    cells = table.cells[:, columns]
    try:
        return cells.astype(np.float64)
    except ValueError:
        for (row, col), cell in np.ndenumerate(cells):
            try:
                np.array(cell).astype(np.float64)
            except ValueError:
                raise DataSourceError(
                    f"{table.path} line {table.lines[row]}, column {columns[col] + 1}: "
                    f"'{cell}' is not a number",
                    hint="columns must be numeric; encode categories as numbers 0..K-1",
                    field=field,
                ) from None
        raise


# -- describing a table from its inventory -----------------------------------------------------
@dataclass(frozen=True)
class _TableFacts:
    """What `_read_table` finds, from a file's inventory."""

    path: Path
    names: list[str] | None
    width: int
    rows: int
    columns: list[ColumnFacts]


def _table_facts(inventory: CsvInventory, path: Path, header: bool, field: str) -> _TableFacts:
    """`_read_table`'s checks on the inventory of `path`."""
    if inventory.error is not None:
        raise DataSourceError(f"cannot read {path} as CSV: {inventory.error}", field=field)
    names = inventory.names if header and inventory.width else None
    rows = inventory.rows if names is not None else inventory.rows + bool(inventory.width)
    if not rows:
        raise DataSourceError(f"{path} holds no data rows", field=field)
    width = inventory.width
    if inventory.ragged is not None:
        line, found = inventory.ragged.line, inventory.ragged.text
        raise DataSourceError(
            f"{path} line {line} has {found} columns, expected {width}", field=field
        )
    if width < 2:
        raise DataSourceError(
            f"{path} has {width} column; it needs features and a label column", field=field
        )
    return _TableFacts(path, names, width, rows, inventory.columns(header))


def _check_numbers(table: _TableFacts, label: int, field: str) -> ColumnFacts:
    """`_features_and_labels`'s refusals: the first cell of the features (in the order of
    the file) that is no number, then the label's; the label column's facts."""
    features = [index for index in range(table.width) if index != label]
    bad = [
        (cell.line, index, cell.text)
        for index in features
        if (cell := table.columns[index].not_a_number) is not None
    ]
    labels = table.columns[label]
    if not bad and not labels.integers and labels.not_a_number is not None:
        bad = [(labels.not_a_number.line, label, labels.not_a_number.text)]
        field = "label_column" if field == "path" else field
    if bad:
        line, index, text = min(bad)
        raise DataSourceError(
            f"{table.path} line {line}, column {index + 1}: '{text}' is not a number",
            hint="columns must be numeric; encode categories as numbers 0..K-1",
            field=field,
        )
    return labels


def _check_samples(table: _TableFacts, label: int, field: str) -> None:
    """`samples_as`'s refusal: a feature that is not finite as float32."""
    features = [index for index in range(table.width) if index != label]
    if not all(table.columns[index].values.finite32 for index in features):
        raise DataSourceError(f"{table.path}: samples contain NaN or infinity", field=field)


def csv_info(
    inventory: CsvInventory,
    config: CsvData,
    path: Path,
    read_validation: Callable[[], tuple[Path, CsvInventory]] | None = None,
) -> DataInfo:
    """The DataInfo loading `config` from the table at `path` gives, from the table's
    inventory (and the validation file's, read by `read_validation` where the config names
    one): the same checks in the same order, each refusal the same DataSourceError."""
    table = _table_facts(inventory, path, config.header, "path")
    label = _label_index(path, config.label_column, table.names, table.width)
    labels = [_check_numbers(table, label, "path")]
    samples = table.rows
    check_splittable(samples)
    _check_samples(table, label, "path")
    if config.val_path is not None:
        assert read_validation is not None
        val_path, val_inventory = read_validation()
        val = _table_facts(val_inventory, val_path, config.header, "val_path")
        if val.width != table.width or val.names != table.names:
            what = ", ".join(val.names) if val.names else f"{val.width} columns"
            want = ", ".join(table.names) if table.names else f"{table.width} columns"
            raise DataSourceError(
                f"{val_path} has {what}; the validation file needs the columns of {path} ({want})",
                field="val_path",
            )
        val_label = _label_index(val_path, config.label_column, val.names, val.width)
        labels.append(_check_numbers(val, val_label, "val_path"))
        _check_samples(val, val_label, "val_path")
        samples += val.rows
    where, field = f"{path} column {label + 1}", "label_column"
    classes: int | None = None
    shape: tuple[int, ...] = (1,)
    if all(column.integers for column in labels):
        low = min(column.values.low for column in labels if column.values.low is not None)
        high = max(column.values.high for column in labels if column.values.high is not None)
        check_classes(low, high, where, field)
        classes, shape = high + 1, ()
    elif not all(column.values.finite for column in labels):
        raise DataSourceError(f"{where}: labels contain NaN or infinity", field=field)
    return DataInfo(
        sample_shape=(table.width - 1,),
        num_classes=classes,
        label_shape=shape,
        label_is_index=classes is not None,
        x_dtype="float32",
        num_samples=samples,
    )


def describe_from_inventory(
    config: NpzData | CsvData, inventory: NpzInventory | CsvInventory
) -> DataInfo:
    """The DataInfo of `config`'s file from its stored inventory (an uploaded dataset's):
    what describing the file gives, without reading it."""
    path = Path(config.path)
    if isinstance(config, NpzData) and isinstance(inventory, NpzInventory):
        return npz_info(inventory, config, path)
    if isinstance(config, CsvData) and isinstance(inventory, CsvInventory):
        return csv_info(inventory, config, path)
    raise ValueError(f"a {inventory.format} inventory does not describe a {config.source} file")
