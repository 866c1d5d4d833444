"""A submitted job's data as its workers will read it, and its description: a named dataset
resolved to its stored file (which must lie in its owner's folder), relative paths made
absolute (workers run elsewhere), and the data described without loading it (an uploaded .npz
or .csv from the inventory its intake stored with it, nothing read; other files from their
headers, a bounded chunk at a time), remembered while the files are unchanged."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session

from contract.inventory import INVENTORY
from dsl.data_config import (
    CsvData,
    DatasetData,
    DataSourceConfig,
    NpzData,
    ShardsData,
    TextData,
)
from dsl.errors import DataSourceError
from dsl.schema import JobSpec
from scheduler.store.datasets import (
    dataset_file,
    dataset_names,
    get_dataset,
    inventory_of_file,
)
from scheduler.store.models import DatasetRecord, User
from workers.data import DataInfo, describe, describe_from_inventory
from workers.data.uploaded import as_file_source


@dataclass(frozen=True)
class DataToRun:
    """The data config workers get, and the stored inventory of the file it names (an
    uploaded .npz's or .csv's), which describes it without reading it."""

    config: DataSourceConfig
    inventory: dict[str, Any] | None = None


def data_to_run(
    session: Session, owner: User, spec: JobSpec, base_dir: Path, artifacts: Path
) -> DataToRun:
    """The data config workers get: a named dataset becomes its stored file (which must lie
    in its owner's folder), and relative paths become absolute (workers run elsewhere)."""
    data = spec.data
    if isinstance(data, DatasetData):
        record = _own_dataset(session, owner, data.name, "name")
        stored = dataset_file(record, artifacts)
        if record.kind == "text":
            raise DataSourceError(
                f"dataset '{data.name}' is a text, which the text source reads",
                f"data: {{source: text, dataset: {data.name}}}",
                field="name",
            )
        if record.kind == "shards":
            return DataToRun(data.model_copy(update={"path": str(stored)}))
        file = as_file_source(data, "npz" if record.kind == "npz" else "csv", stored)
        return DataToRun(file, record.inventory)
    if isinstance(data, TextData) and data.dataset is not None:
        record = _own_dataset(session, owner, data.dataset, "dataset")
        if record.kind != "text":
            raise DataSourceError(
                f"dataset '{data.dataset}' is a {record.kind} dataset, not a text",
                f"data: {{source: dataset, name: {data.dataset}}} reads it",
                field="dataset",
            )
        return DataToRun(
            data.model_copy(update={"path": str(dataset_file(record, artifacts)), "dataset": None})
        )
    if isinstance(data, ShardsData) and data.dataset is not None:
        # The stored folder by path, with only the keys that were written.
        values = data.model_dump(mode="json", exclude_unset=True, exclude={"dataset"})
        values["path"] = str(_shards_folder(session, owner, data, artifacts))
        return DataToRun(ShardsData.model_validate(values))
    if isinstance(data, NpzData | CsvData | TextData | ShardsData):
        files = {
            key: str((base_dir / path).expanduser().resolve())
            for key in ("path", "val_path", "test_path")
            if (path := getattr(data, key, None))
        }
        return DataToRun(data.model_copy(update=files) if files else data)
    return DataToRun(data)


def stored_inventory(session: Session, data: DataSourceConfig) -> dict[str, Any] | None:
    """The inventory of the uploaded file a stored execution spec reads, if it reads one."""
    if not isinstance(data, NpzData | CsvData) or (isinstance(data, CsvData) and data.val_path):
        return None
    return inventory_of_file(session, data.path)


def _own_dataset(session: Session, owner: User, name: str, field: str) -> DatasetRecord:
    record = get_dataset(session, owner.id, name)
    if record is None:
        yours = dataset_names(session, owner.id)
        raise DataSourceError(
            f"you have no dataset named '{name}'",
            f"your datasets: {', '.join(yours)}"
            if yours
            else "upload it first: trainyard datasets upload FILE --name NAME",
            field=field,
        )
    return record


def _shards_folder(session: Session, owner: User, data: ShardsData, artifacts: Path) -> Path:
    """The folder of shards of the owner's dataset `data.dataset` (inside their folder)."""
    assert data.dataset is not None
    record = _own_dataset(session, owner, data.dataset, "dataset")
    folder = dataset_file(record, artifacts)
    if not folder.is_dir():
        raise DataSourceError(
            f"dataset '{data.dataset}' is a .{record.kind} file, not a folder of shards",
            hint=f"read it with data: {{source: dataset, name: {data.dataset}}}",
            field="dataset",
        )
    return folder


def as_dataset_error(exc: DataSourceError) -> DataSourceError:
    """The stored file's own keys (its path) are not the user's to fix: point at the name."""
    field = exc.field or "source"
    if field not in DatasetData.model_fields:
        field = "name"
    return DataSourceError(exc.message, exc.hint, field=field)


def data_info(
    data: DataSourceConfig, seed: int, cache_dir: Path, inventory: dict[str, Any] | None = None
) -> DataInfo:
    """The data's DataInfo: an uploaded file's from its stored inventory (nothing is read),
    anything else described (a file inventoried a bounded chunk at a time), remembered."""
    if inventory is not None:
        assert isinstance(data, NpzData | CsvData)  # the kinds an inventory is stored for
        return describe_from_inventory(data, INVENTORY.validate_python(inventory))
    stamps: list[tuple[int, int] | None] = []
    for key in ("path", "val_path", "test_path"):
        path = getattr(data, key, None)
        if path:
            try:
                stat = Path(path).stat()
                stamps.append((stat.st_mtime_ns, stat.st_size))
            except OSError:
                stamps.append(None)  # describe reports the missing file
    stamp = tuple(stamps) or None
    return _describe_cached(
        data.model_dump_json(exclude_unset=True), type(data), seed, str(cache_dir), stamp
    )


@functools.lru_cache(maxsize=256)
def _describe_cached(
    config_json: str,
    config_type: type[DataSourceConfig],
    seed: int,
    cache_dir: str,
    stamp: tuple[tuple[int, int] | None, ...] | None,
) -> DataInfo:
    """Describing the built-in text corpus or a file reads it; a warm API answers from memory.
    The files' mtimes and sizes are in the key, so a changed file is read again."""
    config = config_type.model_validate_json(config_json)
    return describe(config, seed=seed, cache_dir=Path(cache_dir), base_dir=Path(cache_dir))
