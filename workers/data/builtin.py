"""Small benchmark datasets that need no download: sklearn's digits and generated MNIST-1D."""

from __future__ import annotations

import os
import random
import tempfile
from dataclasses import replace
from pathlib import Path

import numpy as np

from dsl.data_config import DigitsData, Mnist1dData
from workers.data.base import (
    DataInfo,
    Dataset,
    DataSource,
    register_source,
    split_train_test,
    to_dataset,
)

DIGITS_INFO = DataInfo(
    sample_shape=(1, 8, 8), num_classes=10, label_shape=(), label_is_index=True, x_dtype="float32"
)
DIGITS_SAMPLES = 1797
MNIST1D_LENGTH = 40


@register_source("digits")
class DigitsSource(DataSource[DigitsData]):
    def load(self, config: DigitsData, *, seed: int, cache_dir: Path, base_dir: Path) -> Dataset:
        # Imported here: scikit-learn takes about a second to import and only this source needs it.
        from sklearn.datasets import load_digits

        bunch = load_digits()
        x = (bunch.data / 16.0).reshape(-1, *DIGITS_INFO.sample_shape)  # (N, 1, 8, 8) in [0, 1]
        return to_dataset(
            DIGITS_INFO, *split_train_test(x, bunch.target, config.test_fraction, seed)
        )

    def describe(
        self, config: DigitsData, *, seed: int, cache_dir: Path, base_dir: Path
    ) -> DataInfo:
        return replace(DIGITS_INFO, num_samples=DIGITS_SAMPLES)


@register_source("mnist1d")
class Mnist1dSource(DataSource[Mnist1dData]):
    """MNIST-1D with the paper's generator settings; only the sample count and seed vary."""

    def load(self, config: Mnist1dData, *, seed: int, cache_dir: Path, base_dir: Path) -> Dataset:
        arrays = self._arrays(config.num_samples, seed, cache_dir)
        info = self.describe(config, seed=seed, cache_dir=cache_dir, base_dir=base_dir)
        # (N, 40) -> (N, 1, 40) channels-first for conv1d, or (N, 40, 1) time-major for rnns
        axis = 2 if config.sequence else 1
        return to_dataset(
            info,
            np.expand_dims(arrays["x"], axis),
            arrays["y"],
            np.expand_dims(arrays["x_test"], axis),
            arrays["y_test"],
        )

    def describe(
        self, config: Mnist1dData, *, seed: int, cache_dir: Path, base_dir: Path
    ) -> DataInfo:
        shape = (MNIST1D_LENGTH, 1) if config.sequence else (1, MNIST1D_LENGTH)
        return DataInfo(
            sample_shape=shape,
            num_classes=10,
            label_shape=(),
            label_is_index=True,
            x_dtype="float32",
            num_samples=config.num_samples,
        )

    def _arrays(self, num_samples: int, seed: int, cache_dir: Path) -> dict[str, np.ndarray]:
        cache = cache_dir / f"mnist1d-v1-n{num_samples}-s{seed}.npz"
        if cache.is_file():
            with np.load(cache) as stored:
                return {key: stored[key] for key in stored.files}
        arrays = _generate(num_samples, seed)
        cache_dir.mkdir(parents=True, exist_ok=True)
        # Written under a temporary name and renamed, so workers sharing the cache folder never
        # read a half-written file.
        fd, tmp = tempfile.mkstemp(dir=cache_dir, suffix=".npz.tmp")
        with os.fdopen(fd, "wb") as out:
            np.savez(
                out, x=arrays["x"], y=arrays["y"], x_test=arrays["x_test"], y_test=arrays["y_test"]
            )
        os.replace(tmp, cache)
        return arrays


def _generate(num_samples: int, seed: int) -> dict[str, np.ndarray]:
    # Imported here: mnist1d pulls in plotting libraries and takes over a second to import.
    from mnist1d.data import get_dataset_args, make_dataset

    args = get_dataset_args()
    args.num_samples, args.seed = num_samples, seed % 2**32
    # make_dataset seeds the global `random` and numpy generators; keep the caller's streams.
    py_state, np_state = random.getstate(), np.random.get_state()
    try:
        data = make_dataset(args)
    finally:
        random.setstate(py_state)
        np.random.set_state(np_state)
    return {
        "x": data["x"].astype(np.float32),
        "y": data["y"].astype(np.int64),
        "x_test": data["x_test"].astype(np.float32),
        "y_test": data["y_test"].astype(np.int64),
    }
