"""Data sources of the `data:` section and the batch streams the trainers draw from.

Importing the package registers every built-in source in `DATA_SOURCES`.
"""

from __future__ import annotations

from pathlib import Path

from dsl.data_config import DataSourceConfig

# Imported for their side effect: each module registers its sources.
from workers.data import builtin, files, synthetic, text, uploaded  # noqa: F401
from workers.data.base import DATA_SOURCES, DataInfo, Dataset, DataSource, DataSourceError
from workers.data.batches import TrainBatches, eval_batches

__all__ = [
    "DATA_SOURCES",
    "DataInfo",
    "DataSource",
    "DataSourceError",
    "Dataset",
    "TrainBatches",
    "describe",
    "eval_batches",
    "load_dataset",
]


def load_dataset(
    config: DataSourceConfig, *, seed: int, cache_dir: Path, base_dir: Path | None = None
) -> Dataset:
    """Train and test tensors for `config`; relative file paths resolve against `base_dir`
    (default: the working directory), generated data is cached in `cache_dir`."""
    source = DATA_SOURCES.get(config.source)
    return source.load(
        config, seed=seed, cache_dir=Path(cache_dir), base_dir=Path(base_dir or Path.cwd())
    )


def describe(
    config: DataSourceConfig, *, seed: int, cache_dir: Path, base_dir: Path | None = None
) -> DataInfo:
    """Shapes and classes of `config`'s data, without loading it where the config suffices."""
    source = DATA_SOURCES.get(config.source)
    return source.describe(
        config, seed=seed, cache_dir=Path(cache_dir), base_dir=Path(base_dir or Path.cwd())
    )
