"""`source: shards`: a folder of shards (contract/shards.py) streamed while training.

Describing reads the shards' headers only. Loading holds the test split (whole shards: the last
`test.shards` by name, or the folder `test_path`) and the validation split (whole shards, chosen
with the seed) in memory, and gives the trainer the rest as a stream (workers/data/
shard_stream.py) that each worker reads its own part of.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from contract.shards import Shard, ShardError, ShardsDescription, describe_shards
from dsl.data_config import ShardsData
from dsl.errors import DataSourceError
from workers.data.base import DataInfo, Dataset, DataSource, XDtype, register_source, rng
from workers.data.shard_stream import ShardedTrain, ShardReader

# What a worker may hold of a sharded dataset: its test and validation shards, and one window
# of the shuffle buffer. The training shards are streamed.
MAX_HELD_BYTES = 1 << 30
MAX_WINDOW_BYTES = 256 << 20


@dataclass(frozen=True)
class ShardPlan:
    """Which shards are which split, and the facts the compiler needs."""

    info: DataInfo
    description: ShardsDescription
    train: tuple[Shard, ...]
    val: tuple[Shard, ...]
    test: tuple[Shard, ...]
    test_description: ShardsDescription  # the folder the test shards are in

    def reader(self, description: ShardsDescription) -> ShardReader:
        info = self.info
        reader = ShardReader(
            description, info.x_dtype, "int64" if info.label_is_index else "float32"
        )
        reader.label_shape(info.label_shape)
        return reader


def folder_of(config: ShardsData, base_dir: Path) -> tuple[Path, str]:
    """The folder of shards and the config key that named it."""
    if config.path is not None:
        return (base_dir / config.path).expanduser(), "path"
    assert config.dataset is not None
    return base_dir / config.dataset, "dataset"


def described(folder: Path, config: ShardsData, field: str) -> ShardsDescription:
    if not folder.is_dir():
        raise DataSourceError(
            f"'{folder}' is not a folder of shards",
            hint="path is a folder relative to the job file's folder"
            if field != "dataset"
            else "upload the shards first (a .tar of them), or check the name",
            field=field,
        )
    try:
        return describe_shards(folder, config.format)
    except ShardError as error:
        where = f"{folder}/{error.shard}: " if error.shard else f"{folder}: "
        raise DataSourceError(
            where + error.message,
            hint=f"every shard holds the same shapes and dtypes ({config.format} format, "
            "docs/data.md)",
            field=field,
        ) from None


def plan_shards(config: ShardsData, seed: int, base_dir: Path) -> ShardPlan:
    """The splits of `config`'s shards and their description, from headers alone."""
    folder, field = folder_of(config, base_dir)
    description = described(folder, config, field)
    shards = list(description.shards)
    test_description = description
    if config.test_path is not None:
        test_description = described(
            (base_dir / config.test_path).expanduser(), config, "test_path"
        )
        _agree(description, test_description)
        test = list(test_description.shards)
    else:
        count = config.test.shards if config.test is not None else 1
        if count >= len(shards):
            raise DataSourceError(
                f"{folder} holds {len(shards)} shard(s); a test split of {count} leaves none "
                "to train on",
                hint="write more, smaller shards, or give a test_path",
                field="test",
            )
        test, shards = shards[-count:], shards[:-count]
    if not any(shard.rows for shard in test):
        raise DataSourceError(
            f"the test shards of {folder} hold no samples",
            hint="the test split is whole shards: the last test.shards by name, or test_path",
            field="test_path" if config.test_path is not None else "test",
        )
    val: list[Shard] = []
    if config.validation_fraction > 0:
        count = max(1, round(len(shards) * config.validation_fraction))
        if count >= len(shards):
            raise DataSourceError(
                f"validation_fraction {config.validation_fraction} of the {len(shards)} "
                "training shard(s) leaves none to train on (the validation split is whole "
                "shards)",
                hint="use a smaller validation_fraction, or write more, smaller shards",
                field="validation_fraction",
            )
        chosen = set(rng(seed, "validation").permutation(len(shards))[:count].tolist())
        val = [shard for i, shard in enumerate(shards) if i in chosen]
        shards = [shard for i, shard in enumerate(shards) if i not in chosen]
    info = _info(config, description, test_description, val, test, shards)
    return ShardPlan(info, description, tuple(shards), tuple(val), tuple(test), test_description)


def _agree(main: ShardsDescription, test: ShardsDescription) -> None:
    mine = (main.sample_shape, main.x_dtype, main.y_shape, main.y_dtype)
    theirs = (test.sample_shape, test.x_dtype, test.y_shape, test.y_dtype)
    if mine != theirs:
        raise DataSourceError(
            f"the test shards in {test.folder} hold samples {test.x_dtype} "
            f"{list(test.sample_shape)}, labels {test.y_dtype} {list(test.y_shape)}; the "
            f"training shards samples {main.x_dtype} {list(main.sample_shape)}, labels "
            f"{main.y_dtype} {list(main.y_shape)}",
            field="test_path",
        )


def _info(
    config: ShardsData,
    main: ShardsDescription,
    test_folder: ShardsDescription,
    val: list[Shard],
    test: list[Shard],
    train: list[Shard],
) -> DataInfo:
    where = str(main.folder)
    low, high = min(main.y_min, test_folder.y_min), max(main.y_max, test_folder.y_max)
    num_classes: int | None = None
    if main.labels_are_indices:
        if low < 0:
            raise DataSourceError(
                f"{where}: class labels must be 0 or more, found {int(low)}",
                hint="number the classes 0..K-1, or store float labels for regression",
                field="format",
            )
        labels = (main.categories or {}).get("label") or []
        num_classes = max(int(high) + 1, len(labels))
        if num_classes < 2:
            raise DataSourceError(
                f"{where}: every label is {int(high)}, so there is only one class",
                hint="store float labels for regression",
                field="format",
            )
        label_shape = main.y_shape
    else:
        label_shape = main.y_shape or (1,)
    x_dtype: XDtype = "int64" if np.dtype(main.x_dtype).kind in "iu" else "float32"
    held = sum(shard.rows for shard in (*val, *test))
    x_size = 8 if x_dtype == "int64" else 4
    per_sample = int(np.prod(main.sample_shape)) * x_size + int(np.prod(label_shape)) * 8
    if held * per_sample > MAX_HELD_BYTES:
        raise DataSourceError(
            f"the test and validation shards hold {held} samples ({held * per_sample} bytes); "
            f"a worker holds them in memory, and may hold at most {MAX_HELD_BYTES} bytes",
            hint="use fewer or smaller test shards, or a smaller validation_fraction",
            field="test" if config.validation_fraction == 0 else "validation_fraction",
        )
    if config.shuffle_buffer * per_sample > MAX_WINDOW_BYTES:
        raise DataSourceError(
            f"a shuffle_buffer of {config.shuffle_buffer} samples takes "
            f"{config.shuffle_buffer * per_sample} bytes, more than the {MAX_WINDOW_BYTES} "
            "a worker may hold for it",
            hint=f"use at most {MAX_WINDOW_BYTES // per_sample} samples",
            field="shuffle_buffer",
        )
    return DataInfo(
        sample_shape=main.sample_shape,
        num_classes=num_classes,
        label_shape=label_shape,
        label_is_index=main.labels_are_indices,
        x_dtype=x_dtype,
        num_samples=held,
        streamed_samples=sum(shard.rows for shard in train),
        categories=main.categories,
    )


@register_source("shards")
class ShardsSource(DataSource[ShardsData]):
    own_validation = True  # whole shards, chosen in plan_shards

    def describe(
        self, config: ShardsData, *, seed: int, cache_dir: Path, base_dir: Path
    ) -> DataInfo:
        return plan_shards(config, seed, base_dir).info

    def load(self, config: ShardsData, *, seed: int, cache_dir: Path, base_dir: Path) -> Dataset:
        plan = plan_shards(config, seed, base_dir)
        info = plan.info
        x_test, y_test = _held(plan.reader(plan.test_description), plan.test)
        x_val, y_val = _held(plan.reader(plan.description), plan.val) if plan.val else (None, None)
        x_dtype = getattr(torch, info.x_dtype)
        y_dtype = torch.int64 if info.label_is_index else torch.float32
        train = ShardedTrain(plan.reader(plan.description), plan.train, config.shuffle_buffer)
        return Dataset(
            info,
            torch.empty((0, *info.sample_shape), dtype=x_dtype),
            torch.empty((0, *info.label_shape), dtype=y_dtype),
            x_test,
            y_test,
            x_val,
            y_val,
            stream=train,
        )


def _held(reader: ShardReader, shards: tuple[Shard, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """The rows of `shards`, in memory (an evaluation split)."""
    parts = [reader.read(shard, 0, shard.rows) for shard in shards if shard.rows]
    x = np.concatenate([x for x, _ in parts])
    y = np.concatenate([y for _, y in parts])
    return torch.from_numpy(x), torch.from_numpy(y)
