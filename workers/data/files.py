"""User data from files: numpy .npz archives and numeric .csv tables."""

from __future__ import annotations

import csv
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dsl.data_config import CsvData, NpzData
from dsl.errors import DataSourceError
from workers.data.base import (
    DataInfo,
    Dataset,
    DataSource,
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


def _read_npz(path: Path, config: NpzData) -> dict[str, np.ndarray]:
    """The configured arrays by config key (`"x_key"`...); the test pair only when present,
    the validation pair when named."""
    names = ("x_key", "y_key", "x_test_key", "y_test_key", "x_val_key", "y_val_key")
    keys = {key: getattr(config, key) for key in names if getattr(config, key) is not None}
    try:
        with np.load(path, allow_pickle=False) as archive:
            present = sorted(archive.files)
            arrays = {key: archive[name] for key, name in keys.items() if name in present}
    except (OSError, ValueError, zipfile.BadZipFile) as error:
        raise DataSourceError(
            f"cannot read {path} as a numpy .npz archive: {error}",
            hint="write it with numpy.savez(path, x=..., y=...); object arrays are not accepted",
            field="path",
        ) from error
    test_keys = {"x_test_key", "y_test_key"}
    # Test keys left at their defaults are optional; keys the user named must exist.
    required = {"x_key", "y_key", *(key for key in ("x_val_key", "y_val_key") if key in keys)}
    if test_keys & (arrays.keys() | config.model_fields_set):
        required |= test_keys
    missing = sorted(required - arrays.keys())
    if missing:
        key = missing[0]
        raise DataSourceError(
            f"{path} has no array '{keys[key]}'",
            hint=f"the file holds: {', '.join(present) or 'nothing'}",
            field=key,
        )
    for key, array in arrays.items():
        if array.ndim == 0:
            raise DataSourceError(
                f"{path} '{keys[key]}' is a scalar, not one row per sample", field=key
            )
    pairs = (("x_key", "y_key"), ("x_test_key", "y_test_key"), ("x_val_key", "y_val_key"))
    for x_key, y_key in pairs:
        if x_key in arrays and len(arrays[x_key]) != len(arrays[y_key]):
            raise DataSourceError(
                f"{path}: '{keys[x_key]}' has {len(arrays[x_key])} samples but "
                f"'{keys[y_key]}' has {len(arrays[y_key])} labels",
                field=y_key,
            )
    return arrays


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
