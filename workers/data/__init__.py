"""Data sources of the `data:` section and the batch streams the trainers draw from.

Importing the package registers every built-in source in `DATA_SOURCES`.
"""

from __future__ import annotations

from pathlib import Path

from dsl.data_config import DataSourceConfig
from dsl.layers.base import BuildContext
from dsl.schema import JobSpec

# Imported for their side effect: each module registers its sources.
from workers.data import builtin, files, shards, synthetic, text, uploaded  # noqa: F401
from workers.data.base import (
    DATA_SOURCES,
    STREAM_KEY,
    DataInfo,
    Dataset,
    DataSource,
    TrainSource,
    TrainStream,
    counted,
    hold_out_validation,
    restore_stream,
    stream_meta,
)
from workers.data.batches import TrainBatches, eval_batches
from workers.data.files import describe_from_inventory

__all__ = [
    "DATA_SOURCES",
    "STREAM_KEY",
    "DataInfo",
    "DataSource",
    "Dataset",
    "TrainBatches",
    "TrainSource",
    "TrainStream",
    "TrainingData",
    "describe",
    "describe_from_inventory",
    "eval_batches",
    "load_dataset",
    "restore_stream",
    "stream_meta",
]


def load_dataset(
    config: DataSourceConfig, *, seed: int, cache_dir: Path, base_dir: Path | None = None
) -> Dataset:
    """Train, test and (if the job has one) validation tensors for `config`; relative file
    paths resolve against `base_dir` (default: the working directory), generated data is cached
    in `cache_dir`. A `validation_fraction` is drawn from the training split the source loaded,
    with the seed, whatever the source."""
    source = DATA_SOURCES.get(config.source)
    dataset = source.load(
        config, seed=seed, cache_dir=Path(cache_dir), base_dir=Path(base_dir or Path.cwd())
    )
    if config.validation_fraction > 0 and not source.own_validation:
        dataset = hold_out_validation(dataset, config.validation_fraction, seed)
    return counted(dataset)


def describe(
    config: DataSourceConfig, *, seed: int, cache_dir: Path, base_dir: Path | None = None
) -> DataInfo:
    """Shapes and classes of `config`'s data, without loading it where the config suffices."""
    source = DATA_SOURCES.get(config.source)
    return source.describe(
        config, seed=seed, cache_dir=Path(cache_dir), base_dir=Path(base_dir or Path.cwd())
    )


class TrainingData:
    """`compile_job`'s data for a run that trains: loads the job's samples and describes them.

        data = TrainingData(cache_dir=cache)
        compiled = compile_job(document, data)
        trainer = Trainer(compiled, data.dataset, options)

    Relative file paths resolve against `base_dir` (default: the working directory).
    """

    def __init__(self, *, cache_dir: Path, base_dir: Path | None = None) -> None:
        self.cache_dir, self.base_dir = Path(cache_dir), base_dir
        self._dataset: Dataset | None = None

    def __call__(self, spec: JobSpec) -> BuildContext:
        dataset = load_dataset(
            spec.data, seed=spec.seed, cache_dir=self.cache_dir, base_dir=self.base_dir
        )
        self._dataset = dataset
        return dataset.info.build_context(train_samples=dataset.train_samples)

    @property
    def dataset(self) -> Dataset:
        if self._dataset is None:
            raise RuntimeError("the samples are loaded when compile_job calls TrainingData")
        return self._dataset
