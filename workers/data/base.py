"""The data-source contract: what a loader returns, how it registers and how it fails.

A data source is one `DataSource` subclass registered with `@register_source(name)` under the
`source:` name of its config model in `dsl.data_config`. It turns the config into a `Dataset` of
train and test tensors (and validation tensors, where the source reads its own) plus the
`DataInfo` the compiler needs to check and size the net. A validation split drawn from the
training split (`validation_fraction`) is every source's: `hold_out_validation`, applied by
`workers.data.load_dataset` after the source loaded.
"""

from __future__ import annotations

import json
import math
import zlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, ClassVar, Generic, Literal, Protocol, TypeVar

import numpy as np
import torch

from dsl.data_config import DataSourceConfig
from dsl.errors import DataSourceError
from dsl.layers.base import BuildContext
from dsl.registry import Registry
from workers.data.batches import Batch, TrainBatches

XDtype = Literal["float32", "int64"]


@dataclass(frozen=True)
class DataInfo:
    """Facts about the samples that the compiler needs to build and check the net."""

    sample_shape: tuple[int, ...]
    num_classes: int | None  # classes, or vocabulary size for text; None for regression
    # () one index per sample, (T,) one per step, (k,) a regression target of k values
    label_shape: tuple[int, ...]
    label_is_index: bool
    x_dtype: XDtype
    # The characters behind token ids (text only), to decode what a language model generates.
    vocabulary: str | None = None
    # The samples of all its splits (None: not known before loading), for the memory estimate:
    # those a worker holds in memory (a sharded dataset's training samples are streamed).
    num_samples: int | None = None
    # A sharded dataset's training samples, read from disk while training (not held).
    streamed_samples: int | None = None
    # What the integer codes of categorical columns stood for (a dataset's categories.json):
    # {"features": {column: [values]}, "label": [values]}, carried to the model card.
    categories: dict[str, Any] | None = None

    @property
    def nbytes(self) -> int | None:
        """What a worker holding every split takes: samples and labels, as tensors."""
        if self.num_samples is None:
            return None
        x_size = 8 if self.x_dtype == "int64" else 4
        y_size = 8 if self.label_is_index else 4
        per_sample = math.prod(self.sample_shape) * x_size + math.prod(self.label_shape) * y_size
        return self.num_samples * per_sample

    def build_context(self, train_samples: int | None = None) -> BuildContext:
        """What the compiler takes from these facts (and the training split's size, if known)."""
        return BuildContext(
            sample_shape=tuple(self.sample_shape),
            num_classes=self.num_classes,
            label_shape=tuple(self.label_shape),
            label_is_index=self.label_is_index,
            train_samples=train_samples,
        )


@dataclass
class Dataset:
    info: DataInfo
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    # The validation split, when the job has one: the source's own (a file, arrays), or drawn
    # from the training split (`hold_out_validation`).
    x_val: torch.Tensor | None = None
    y_val: torch.Tensor | None = None
    # Training samples read while training (a folder of shards); x_train and y_train then hold
    # no rows, and the training split is not among `splits()`.
    stream: TrainSource | None = None

    def __post_init__(self) -> None:
        # A source that disagrees with its own DataInfo would surface as a baffling shape error
        # deep in training; fail here instead.
        x_dtype = getattr(torch, self.info.x_dtype)
        y_dtype = torch.int64 if self.info.label_is_index else torch.float32
        if (self.x_val is None) != (self.y_val is None):
            raise ValueError("a validation split needs both its samples and its labels")
        for split, x, y in self.splits():
            if len(x) == 0 or len(x) != len(y):
                raise ValueError(f"{split} split has {len(x)} samples and {len(y)} labels")
            if tuple(x.shape[1:]) != self.info.sample_shape or x.dtype != x_dtype:
                raise ValueError(
                    f"{split} samples are {x.dtype} {list(x.shape[1:])}, not {self.info}"
                )
            if tuple(y.shape[1:]) != self.info.label_shape or y.dtype != y_dtype:
                raise ValueError(
                    f"{split} labels are {y.dtype} {list(y.shape[1:])}, not {self.info}"
                )

    def splits(self) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
        """(name, samples, labels) of each split held in memory: train (unless streamed),
        test and, if any, val."""
        out = [("train", self.x_train, self.y_train)] if self.stream is None else []
        out.append(("test", self.x_test, self.y_test))
        if self.x_val is not None and self.y_val is not None:
            out.append(("val", self.x_val, self.y_val))
        return out

    @property
    def nbytes(self) -> int:
        """What its tensors take in memory."""
        return sum(t.nbytes for _, x, y in self.splits() for t in (x, y))

    @property
    def train_samples(self) -> int:
        return len(self.x_train) if self.stream is None else self.stream.samples

    def train_batches(
        self,
        batch_size: int,
        *,
        seed: int,
        rank: int = 0,
        world: int = 1,
        shuffle: bool = True,
        device: torch.device | str = "cpu",
    ) -> TrainStream:
        """The endless stream of training batches of worker `rank` of `world` (its part of
        every global batch of `batch_size`), on `device`."""
        if self.stream is not None:
            return self.stream.batches(
                batch_size, seed=seed, rank=rank, world=world, shuffle=shuffle, device=device
            )
        return TrainBatches(
            self.x_train,
            self.y_train,
            batch_size,
            seed=seed,
            rank=rank,
            world=world,
            shuffle=shuffle,
            device=device,
        )

    def split(self, name: str) -> tuple[torch.Tensor, torch.Tensor]:
        """The samples and labels of the split `name` (train, val or test)."""
        for split, x, y in self.splits():
            if split == name:
                return x, y
        raise KeyError(f"the dataset has no {name} split")


class TrainStream(Protocol):
    """What a trainer draws its batches from: endless, seeded, restorable in O(1)."""

    @property
    def epoch(self) -> int: ...

    @property
    def steps_per_epoch(self) -> int: ...

    def state(self) -> dict[str, Any]:
        """Where the stream stands (JSON-ready): at least {"epoch": e, "position": p}."""
        ...

    def restore(self, state: Mapping[str, Any]) -> None: ...

    def close(self) -> None:
        """Release what reads ahead (a reader thread); the stream may not be drawn from after."""
        ...

    def __iter__(self) -> Iterator[Batch]: ...

    def __next__(self) -> Batch: ...


# The checkpoint metadata key of a stream's whole state (JSON): a sharded stream's shard order
# and each worker's position in its range besides the epoch and position.
STREAM_KEY = "data_stream"


def stream_meta(stream: TrainStream) -> dict[str, str]:
    """A checkpoint's metadata for where `stream` stands."""
    state = stream.state()
    return {
        "epoch": str(state["epoch"]),
        "position": str(state["position"]),
        STREAM_KEY: json.dumps(state),
    }


def restore_stream(stream: TrainStream, meta: Mapping[str, str]) -> None:
    """Put `stream` where a checkpoint's metadata says it stood (older checkpoints hold only
    the epoch and position)."""
    saved = meta.get(STREAM_KEY)
    if saved:
        stream.restore(json.loads(saved))
    else:
        stream.restore({"epoch": int(meta["epoch"]), "position": int(meta["position"])})


class TrainSource(Protocol):
    """Training samples that are read while training instead of held (workers/data/shards.py)."""

    @property
    def samples(self) -> int: ...

    def batches(
        self,
        batch_size: int,
        *,
        seed: int,
        rank: int,
        world: int,
        shuffle: bool,
        device: torch.device | str,
    ) -> TrainStream: ...


C = TypeVar("C", bound=DataSourceConfig)


class DataSource(ABC, Generic[C]):
    """Loads one kind of `data:` section. Instances are stateless; one is registered per name."""

    # Whether the source holds out `validation_fraction` itself (a sharded dataset: whole
    # shards), instead of `hold_out_validation` on the training split it loaded.
    own_validation: ClassVar[bool] = False

    @abstractmethod
    def load(self, config: C, *, seed: int, cache_dir: Path, base_dir: Path) -> Dataset:
        """Both splits as tensors; the same seed gives identical tensors."""

    def describe(self, config: C, *, seed: int, cache_dir: Path, base_dir: Path) -> DataInfo:
        """Shapes, classes and sample count. Sources that know them from the config alone skip
        the loading."""
        return counted(self.load(config, seed=seed, cache_dir=cache_dir, base_dir=base_dir)).info


DATA_SOURCES: Registry[DataSource[Any]] = Registry("data source")

S = TypeVar("S", bound=type[DataSource[Any]])


def register_source(*names: str) -> Callable[[S], S]:
    """`@register_source("digits")` on a DataSource subclass registers one instance of it."""

    def decorate(cls: S) -> S:
        DATA_SOURCES.register(*names)(cls())
        return cls

    return decorate


def rng(seed: int, purpose: str) -> np.random.Generator:
    """A generator per (seed, purpose), so generating and splitting draw independent streams."""
    return np.random.default_rng([seed % 2**63, zlib.crc32(purpose.encode())])


def resolve_file(path: str, base_dir: Path, field: str = "path") -> Path:
    """`path` relative to the job's folder; a clear error when it is not a readable file."""
    resolved = (base_dir / path).expanduser()
    if not resolved.is_file():
        what = "is a folder, not a file" if resolved.is_dir() else "does not exist"
        raise DataSourceError(
            f"data file '{resolved}' {what}",
            hint=f"paths are relative to the job file's folder ({base_dir})",
            field=field,
        )
    return resolved


def split_train_test(
    x: np.ndarray, y: np.ndarray, test_fraction: float, seed: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """A random split drawn from the seed: at least one sample on each side."""
    n = len(x)
    check_splittable(n)
    n_test = min(n - 1, max(1, round(n * test_fraction)))
    order = rng(seed, "split").permutation(n)
    test, train = order[:n_test], order[n_test:]
    return x[train], y[train], x[test], y[test]


def check_splittable(samples: int) -> None:
    """A train and a test split drawn from `samples` samples need two of them."""
    if samples < 2:
        raise DataSourceError(
            f"the data holds {samples} sample(s); a train and a test split need at least 2",
            field="path",
        )


def hold_out_validation(dataset: Dataset, fraction: float, seed: int) -> Dataset:
    """The dataset with `fraction` of its training split moved to a validation split, drawn
    with the seed (the test split is left as it is, so figures on it stay comparable): at least
    one sample on each side."""
    n = len(dataset.x_train)
    n_val = max(1, round(n * fraction))
    if n_val >= n:
        raise DataSourceError(
            f"validation_fraction {fraction} of the {n} training samples leaves none to train on",
            hint="use a smaller validation_fraction",
            field="validation_fraction",
        )
    order = torch.from_numpy(rng(seed, "validation").permutation(n))
    val, train = order[:n_val], order[n_val:]
    return replace(
        dataset,
        x_train=dataset.x_train[train],
        y_train=dataset.y_train[train],
        x_val=dataset.x_train[val],
        y_val=dataset.y_train[val],
    )


@dataclass(frozen=True)
class Labels:
    """Labels of every split converted together, so the splits agree on their kind."""

    train: np.ndarray
    test: np.ndarray
    num_classes: int | None
    label_shape: tuple[int, ...]
    label_is_index: bool
    val: np.ndarray | None = None


def infer_labels(
    y_train: np.ndarray,
    y_test: np.ndarray,
    where: str,
    field: str,
    y_val: np.ndarray | None = None,
) -> Labels:
    """Integer labels are class indices 0..max; float labels are regression targets."""
    given = [y_train, y_test] if y_val is None else [y_train, y_test, y_val]
    both = np.concatenate(given)
    if both.dtype.kind in "iub":
        high = int(both.max())
        check_classes(int(both.min()), high, where, field)
        return Labels(
            y_train.astype(np.int64),
            y_test.astype(np.int64),
            high + 1,
            y_train.shape[1:],
            True,
            None if y_val is None else y_val.astype(np.int64),
        )
    if both.dtype.kind == "f":
        if not np.isfinite(both).all():
            raise DataSourceError(f"{where}: labels contain NaN or infinity", field=field)
        shape = y_train.shape[1:] or (1,)
        return Labels(
            y_train.astype(np.float32).reshape(-1, *shape),
            y_test.astype(np.float32).reshape(-1, *shape),
            None,
            shape,
            False,
            None if y_val is None else y_val.astype(np.float32).reshape(-1, *shape),
        )
    raise DataSourceError(
        f"{where}: labels have dtype {both.dtype}; expected integers (classes) or floats",
        field=field,
    )


def check_classes(low: int, high: int, where: str, field: str) -> None:
    """Class labels are 0..K-1 with K at least 2."""
    if low < 0:
        raise DataSourceError(
            f"{where}: class labels must be 0 or more, found {low}",
            hint="number the classes 0..K-1, or store float labels for regression",
            field=field,
        )
    if high < 1:
        raise DataSourceError(
            f"{where}: every label is {high}, so there is only one class",
            hint="store float labels for regression",
            field=field,
        )


def samples_as(x: np.ndarray, where: str, field: str) -> tuple[np.ndarray, XDtype]:
    """Float (and bool) samples as float32, integer samples as int64 token ids."""
    if x.dtype.kind in "iu":
        return x.astype(np.int64), "int64"
    if x.dtype.kind in "fb":
        x = x.astype(np.float32)
        if not np.isfinite(x).all():
            raise DataSourceError(f"{where}: samples contain NaN or infinity", field=field)
        return x, "float32"
    raise DataSourceError(f"{where}: samples have dtype {x.dtype}; expected numbers", field=field)


def counted(dataset: Dataset) -> Dataset:
    """`dataset` with its info's sample count (every split) filled in."""
    held = sum(len(x) for _, x, _ in dataset.splits())
    return replace(dataset, info=replace(dataset.info, num_samples=held))


def to_dataset(
    info: DataInfo,
    x_train: np.ndarray,
    y_train: np.ndarray,
    x_test: np.ndarray,
    y_test: np.ndarray,
    x_val: np.ndarray | None = None,
    y_val: np.ndarray | None = None,
) -> Dataset:
    """Tensors of the dtypes `info` promises: samples as `x_dtype`, labels int64 or float32;
    a validation split when the source has its own."""
    x_dtype = np.dtype(info.x_dtype)
    y_dtype = np.dtype(np.int64 if info.label_is_index else np.float32)

    def tensor(a: np.ndarray, dtype: np.dtype[Any]) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(a, dtype=dtype))

    return Dataset(
        info,
        tensor(x_train, x_dtype),
        tensor(y_train, y_dtype),
        tensor(x_test, x_dtype),
        tensor(y_test, y_dtype),
        None if x_val is None else tensor(x_val, x_dtype),
        None if y_val is None else tensor(y_val, y_dtype),
    )
