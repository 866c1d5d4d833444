"""Datasets referred to by name (`source: dataset`): an .npz or .csv file in a dataset folder.

The service stores each user's uploads as `<name>.npz` or `<name>.csv` in that user's folder and
passes it as `base_dir`; run locally, the folder is the job file's. Loading is delegated to the
npz and csv sources, so an uploaded file reads exactly like one given by path.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from dsl.data_config import CsvData, DatasetData, NpzData
from dsl.errors import DataSourceError
from workers.data.base import (
    DATA_SOURCES,
    DataInfo,
    Dataset,
    DataSource,
    register_source,
)

KINDS: tuple[Literal["npz", "csv"], ...] = ("npz", "csv")


def as_file_source(
    config: DatasetData, kind: Literal["npz", "csv"], path: Path
) -> NpzData | CsvData:
    """The npz/csv config reading `path`; options of the other kind are a located error."""
    foreign = config.foreign_keys(kind)
    if foreign:
        raise DataSourceError(
            f"dataset '{config.name}' is a .{kind} file, which does not read {', '.join(foreign)}",
            hint=f"a .{kind} dataset reads: {', '.join(config.kind_keys[kind])}",
            field=foreign[0],
        )
    return config.as_file(kind, str(path))


def find_dataset(config: DatasetData, base_dir: Path) -> NpzData | CsvData:
    """`<name>.npz` or `<name>.csv` in `base_dir`, as the source that reads it."""
    found = [(kind, base_dir / f"{config.name}.{kind}") for kind in KINDS]
    present = [(kind, path) for kind, path in found if path.is_file()]
    if not present:
        raise DataSourceError(
            f"no dataset named '{config.name}' ({config.name}.npz or {config.name}.csv "
            f"in {base_dir})",
            hint="upload it first (POST /api/v1/datasets), or check the name",
            field="name",
        )
    if len(present) > 1:
        raise DataSourceError(
            f"dataset '{config.name}' is ambiguous: both {config.name}.npz and "
            f"{config.name}.csv are in {base_dir}",
            hint="remove or rename one of them",
            field="name",
        )
    kind, path = present[0]
    return as_file_source(config, kind, path)


@register_source("dataset")
class UploadedSource(DataSource[DatasetData]):
    def load(self, config: DatasetData, *, seed: int, cache_dir: Path, base_dir: Path) -> Dataset:
        file_config = find_dataset(config, base_dir)
        return DATA_SOURCES.get(file_config.source).load(
            file_config, seed=seed, cache_dir=cache_dir, base_dir=base_dir
        )

    def describe(
        self, config: DatasetData, *, seed: int, cache_dir: Path, base_dir: Path
    ) -> DataInfo:
        file_config = find_dataset(config, base_dir)
        return DATA_SOURCES.get(file_config.source).describe(
            file_config, seed=seed, cache_dir=cache_dir, base_dir=base_dir
        )
