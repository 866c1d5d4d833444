"""Generated toy problems: gaussian blobs, bar images and the adding problem."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from dsl.data_config import SyntheticData
from workers.data.base import (
    DataInfo,
    Dataset,
    DataSource,
    register_source,
    rng,
    split_train_test,
    to_dataset,
)


@register_source("synthetic")
class SyntheticSource(DataSource[SyntheticData]):
    def load(self, config: SyntheticData, *, seed: int, cache_dir: Path, base_dir: Path) -> Dataset:
        gen = rng(seed, f"synthetic-{config.task}")
        if config.task == "classification":
            x, y = _blobs(config, gen)
        elif config.task == "images":
            x, y = _bars(config, gen)
        else:
            x, y = _adding(config, gen)
        info = self.describe(config, seed=seed, cache_dir=cache_dir, base_dir=base_dir)
        return to_dataset(info, *split_train_test(x, y, config.test_fraction, seed))

    def describe(
        self, config: SyntheticData, *, seed: int, cache_dir: Path, base_dir: Path
    ) -> DataInfo:
        if config.task == "sequence":
            return DataInfo(
                sample_shape=(config.seq_len, 2),
                num_classes=None,
                label_shape=(1,),
                label_is_index=False,
                x_dtype="float32",
                num_samples=config.num_samples,
            )
        if config.task == "images":
            size = config.image_size
            shape: tuple[int, ...] = (config.channels, size, size)
        else:
            shape = (config.num_features,)
        return DataInfo(
            sample_shape=shape,
            num_classes=config.num_classes,
            label_shape=(),
            label_is_index=True,
            x_dtype="float32",
            num_samples=config.num_samples,
        )


def _balanced_labels(config: SyntheticData, gen: np.random.Generator) -> np.ndarray:
    return gen.permutation(np.arange(config.num_samples) % config.num_classes)


def _blobs(config: SyntheticData, gen: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """One unit-variance gaussian centre per class; `noise` is the spread around it."""
    centres = gen.normal(size=(config.num_classes, config.num_features))
    y = _balanced_labels(config, gen)
    x = centres[y] + config.noise * gen.normal(size=(config.num_samples, config.num_features))
    return x, y  # (N, F), (N,)


def bar_templates(num_classes: int, size: int) -> np.ndarray:
    """(K, size, size) one-pixel bars: class k has orientation k % 4 at the (k // 4)-th offset.

    Orientations are horizontal, vertical, diagonal and anti-diagonal; the offsets are spread
    evenly over the image so no two classes share a bar.
    """
    per_orientation = math.ceil(num_classes / 4)
    offsets = [(j + 1) * size // (per_orientation + 1) for j in range(per_orientation)]
    rows, cols = np.indices((size, size))
    templates = np.zeros((num_classes, size, size))
    for k in range(num_classes):
        offset = offsets[k // 4]
        shift = offset - size // 2  # diagonals move off the main diagonal by this much
        masks = (
            rows == offset,
            cols == offset,
            rows - cols == shift,
            rows + cols == size - 1 + shift,
        )
        templates[k][masks[k % 4]] = 1.0
    return templates


def _bars(config: SyntheticData, gen: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Each image is its class's bar at a random brightness in every channel, plus noise."""
    n, c, size = config.num_samples, config.channels, config.image_size
    templates = bar_templates(config.num_classes, size)
    y = _balanced_labels(config, gen)
    brightness = gen.uniform(0.5, 1.5, size=(n, c, 1, 1))
    x = templates[y][:, None] * brightness  # (N, 1, S, S) * (N, C, 1, 1) -> (N, C, S, S)
    x = x + config.noise * gen.normal(size=x.shape)
    return x, y


def _adding(config: SyntheticData, gen: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """The adding problem (Hochreiter & Schmidhuber 1997): sum the two marked values.

    Channel 0 holds uniform values, channel 1 marks one step in each half of the sequence; the
    target needs memory across the whole sequence.
    """
    n, t = config.num_samples, config.seq_len
    values = gen.uniform(size=(n, t))
    half = t // 2
    first = gen.integers(0, half, size=n)
    second = gen.integers(half, t, size=n)
    marks = np.zeros((n, t))
    marks[np.arange(n), first] = 1.0
    marks[np.arange(n), second] = 1.0
    x = np.stack([values, marks], axis=-1)  # (N, T, 2)
    y = (values * marks).sum(axis=1, keepdims=True)  # (N, 1)
    return x, y
