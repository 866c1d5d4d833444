"""Datasets referred to by name (`source: dataset`): an .npz or .csv file, or a shard folder,
in a dataset folder.

The service stores each user's uploads as `<name>.npz`, `<name>.csv` or the folder `<name>/`
of npy shards (a table with text columns or a Parquet file, converted at upload) in that user's
folder; run locally, the folder is the job file's. Files are delegated to the npz and csv
sources, so an uploaded file reads exactly like one given by path; a shard folder is read
here, into memory, with the categories behind its indices (they go into the model card).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Literal

import numpy as np

from contract.rundir import CATEGORIES
from contract.shards import MAX_CATEGORIES_BYTES, ShardError, npy_header, npy_rows
from dsl.data_config import CsvData, DatasetData, NpzData
from dsl.errors import DataSourceError
from workers.data.base import (
    DATA_SOURCES,
    DataInfo,
    Dataset,
    DataSource,
    infer_labels,
    register_source,
    samples_as,
    split_train_test,
    to_dataset,
)

KINDS: tuple[Literal["npz", "csv"], ...] = ("npz", "csv")
_SHARD = re.compile(r"^(\d{5,})\.x\.npy$")


def as_file_source(
    config: DatasetData, kind: Literal["npz", "csv"], path: Path
) -> NpzData | CsvData:
    """The npz/csv config reading `path`; options of the other kind are a located error."""
    _refuse_foreign(config, kind)
    return config.as_file(kind, str(path))


def _refuse_foreign(config: DatasetData, kind: str) -> None:
    foreign = config.foreign_keys(kind)
    if foreign:
        reads = ", ".join(config.kind_keys[kind]) or "none of the file options"
        raise DataSourceError(
            f"dataset '{config.name}' is a {kind} dataset, which does not read "
            f"{', '.join(foreign)}",
            hint=f"a {kind} dataset reads: {reads}",
            field=foreign[0],
        )


def find_dataset(config: DatasetData, base_dir: Path) -> NpzData | CsvData | Path:
    """`<name>.npz` or `<name>.csv` in `base_dir`, as the source that reads it, or the shard
    folder `<name>/` (the service's checked job names it as `path`)."""
    if config.path is not None:
        return shard_folder(config, Path(config.path))
    found: list[tuple[str, Path]] = [(kind, base_dir / f"{config.name}.{kind}") for kind in KINDS]
    found.append(("shards", base_dir / config.name))
    present = [(kind, path) for kind, path in found if path.exists()]
    if not present:
        text = base_dir / f"{config.name}.txt"
        hint = "upload it first (POST /api/v1/datasets/uploads), or check the name"
        if text.is_file():
            hint = f"'{config.name}' is a text: data: {{source: text, dataset: {config.name}}}"
        raise DataSourceError(
            f"no dataset named '{config.name}' ({config.name}.npz, {config.name}.csv or the "
            f"folder {config.name}/ in {base_dir})",
            hint=hint,
            field="name",
        )
    if len(present) > 1:
        raise DataSourceError(
            f"dataset '{config.name}' is ambiguous: {' and '.join(p.name for _, p in present)} "
            f"are in {base_dir}",
            hint="remove or rename all but one of them",
            field="name",
        )
    kind, path = present[0]
    if kind == "shards":
        return shard_folder(config, path)
    return as_file_source(config, kind, path)  # type: ignore[arg-type]


def shard_folder(config: DatasetData, folder: Path) -> Path:
    _refuse_foreign(config, "shards")
    if not folder.is_dir():
        raise DataSourceError(f"dataset '{config.name}': {folder} is not a folder", field="name")
    return folder


def shard_pairs(folder: Path) -> list[tuple[Path, Path]]:
    """The folder's `NNNNN.x.npy` files with their `NNNNN.y.npy`, in order."""
    xs = sorted(path for path in folder.iterdir() if _SHARD.fullmatch(path.name))
    if not xs:
        raise DataSourceError(f"{folder} holds no NNNNN.x.npy shards", field="name")
    pairs = []
    for x in xs:
        y = x.with_name(x.name.replace(".x.npy", ".y.npy"))
        if not y.is_file():
            raise DataSourceError(f"{folder}: shard {x.name} has no {y.name}", field="name")
        pairs.append((x, y))
    return pairs


def read_categories(folder: Path) -> dict[str, Any] | None:
    path = folder / CATEGORIES
    if not path.is_file():
        return None
    if path.stat().st_size > MAX_CATEGORIES_BYTES:
        raise DataSourceError(
            f"{path} takes {path.stat().st_size} bytes, more than the {MAX_CATEGORIES_BYTES} read",
            field="name",
        )
    try:
        categories = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise DataSourceError(f"{path} cannot be read: {error}", field="name") from None
    if not isinstance(categories, dict):
        raise DataSourceError(f"{path} is not a JSON object", field="name")
    return categories


def load_shard_folder(config: DatasetData, folder: Path, seed: int) -> Dataset:
    """Every shard of the folder in memory, split like the other sources' samples."""
    xs: list[np.ndarray] = []
    ys: list[np.ndarray] = []
    for x_path, y_path in shard_pairs(folder):
        try:
            x, y = np.load(x_path, allow_pickle=False), np.load(y_path, allow_pickle=False)
        except (OSError, ValueError) as error:
            raise DataSourceError(f"{x_path.parent}: cannot read {x_path.name}: {error}") from None
        if len(x) != len(y):
            raise DataSourceError(
                f"{folder}: shard {x_path.name} has {len(x)} samples but {y_path.name} "
                f"{len(y)} labels",
                field="name",
            )
        if xs and (x.shape[1:] != xs[0].shape[1:] or x.dtype != xs[0].dtype):
            raise DataSourceError(
                f"{folder}: shard {x_path.name} holds {x.dtype} {list(x.shape[1:])}, the first "
                f"shard {xs[0].dtype} {list(xs[0].shape[1:])}",
                field="name",
            )
        xs.append(x)
        ys.append(y)
    where = f"dataset '{config.name}'"
    x_all, x_dtype = samples_as(np.concatenate(xs), where, "name")
    x_train, y_train, x_test, y_test = split_train_test(
        x_all, np.concatenate(ys), config.test_fraction, seed
    )
    labels = infer_labels(y_train, y_test, where, "name")
    info = DataInfo(
        sample_shape=x_all.shape[1:],
        num_classes=labels.num_classes,
        label_shape=labels.label_shape,
        label_is_index=labels.label_is_index,
        x_dtype=x_dtype,
        categories=read_categories(folder),
    )
    return to_dataset(info, x_train, labels.train, x_test, labels.test)


def describe_shard_folder(config: DatasetData, folder: Path) -> DataInfo:
    """The folder's facts from its shards' headers: nothing of x is read, and the labels are
    read a chunk at a time for their classes (never memory-mapped, whose pages would stay
    in the describing process)."""
    samples, shape, dtype, high, low, y_kind = 0, None, None, 0, 0, "i"
    for x_path, y_path in shard_pairs(folder):
        try:
            x_shape, x_dtype, _ = npy_header(x_path)
            y_shape, y_dtype, y_offset = npy_header(y_path)
        except ShardError as error:
            raise DataSourceError(f"{folder}: {error.message}") from None
        if shape is None:
            shape, dtype = x_shape[1:], x_dtype
        elif (x_shape[1:], x_dtype) != (shape, dtype):
            raise DataSourceError(
                f"{folder}: shard {x_path.name} holds {x_dtype} {list(x_shape[1:])}, the first "
                f"shard {dtype} {list(shape)}",
                field="name",
            )
        samples += x_shape[0]
        y_kind = y_dtype.kind
        if y_kind in "iu":
            for chunk in npy_rows(y_path, y_offset, y_dtype, y_shape[0], y_shape[1:]):
                high, low = max(high, int(chunk.max())), min(low, int(chunk.min()))
    assert shape is not None and dtype is not None  # shard_pairs found at least one
    if low < 0:
        raise DataSourceError(
            f"dataset '{config.name}': class labels must be 0 or more, found {low}", field="name"
        )
    index = y_kind in "iu"
    return DataInfo(
        sample_shape=tuple(shape),
        num_classes=high + 1 if index else None,
        label_shape=() if index else (1,),
        label_is_index=index,
        x_dtype="int64" if dtype.kind in "iu" else "float32",
        num_samples=samples,
        categories=read_categories(folder),
    )


@register_source("dataset")
class UploadedSource(DataSource[DatasetData]):
    def load(self, config: DatasetData, *, seed: int, cache_dir: Path, base_dir: Path) -> Dataset:
        found = find_dataset(config, base_dir)
        if isinstance(found, Path):
            return load_shard_folder(config, found, seed)
        return DATA_SOURCES.get(found.source).load(
            found, seed=seed, cache_dir=cache_dir, base_dir=base_dir
        )

    def describe(
        self, config: DatasetData, *, seed: int, cache_dir: Path, base_dir: Path
    ) -> DataInfo:
        found = find_dataset(config, base_dir)
        if isinstance(found, Path):
            return describe_shard_folder(config, found)
        return DATA_SOURCES.get(found.source).describe(
            found, seed=seed, cache_dir=cache_dir, base_dir=base_dir
        )
