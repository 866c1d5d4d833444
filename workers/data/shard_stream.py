"""The training stream of a folder of shards: each worker reads only its part, ahead of time.

An epoch's order is a function of (seed, epoch) alone, so a stream restores in O(1):
1. the training shards are put in an order drawn from (seed, epoch) (with `shuffle`);
2. their rows, end to end in that order, are cut into `world` equal contiguous ranges: worker
   `rank` reads only range `rank` (whole shards, or parts of shards at the ranges' ends, so
   the ranges stay disjoint when there are fewer shards than workers); the rows past the last
   whole batch of a range are left out of the epoch;
3. each range is cut into windows of `shuffle_buffer / world` samples (a multiple of the
   worker's batch part); a window is read and, with `shuffle`, its rows put in an order drawn
   from (seed, epoch, rank, window); consecutive batches are consecutive slices of that order.

A background thread reads and assembles the next `PREFETCH` batches while the trainer trains on
this one; the memory a worker holds for the data is a window or two (the next is read while the
batches of the last are still queued) and the queued batches, whatever the dataset's size.
Samples are read by memory-mapping just the rows of a window (npy) or by row group (parquet), and
the mapping is dropped once they are copied, so the pages read do not stay in the worker's
resident memory.

`state()` holds the epoch, the position (steps into the epoch), the world, the epoch's shard order
and each worker's position in its range (samples); `restore` continues exactly there.
"""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from contract.shards import Shard, ShardsDescription
from workers.data.batches import Batch

PREFETCH = 4  # batches the reader thread keeps ready


class ShardReader:
    """Rows of the shards of one folder as numpy arrays of the dtypes the net takes."""

    def __init__(self, description: ShardsDescription, x_dtype: str, y_dtype: str) -> None:
        self.description = description
        self.x_dtype, self.y_dtype = np.dtype(x_dtype), np.dtype(y_dtype)
        self._label_shape: tuple[int, ...] | None = None
        self._group: tuple[str, int, np.ndarray, np.ndarray] | None = None  # parquet cache

    def label_shape(self, shape: tuple[int, ...]) -> None:
        """The labels' shape per sample as the net takes it ((1,) for a scalar target)."""
        self._label_shape = shape

    def read(self, shard: Shard, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        """Rows [start, stop) of `shard`: (x, y) copies, converted."""
        if self.description.format == "npy":
            x, y = self._read_npy(shard, start, stop)
        else:
            x, y = self._read_parquet(shard, start, stop)
        x = x.astype(self.x_dtype, copy=False)
        y = y.astype(self.y_dtype, copy=False)
        if self._label_shape is not None:
            y = y.reshape(len(y), *self._label_shape)
        return x, y

    def _read_npy(self, shard: Shard, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        d = self.description

        def rows(path: Any, offset: int, dtype: str, shape: tuple[int, ...], size: int) -> Any:
            # Only these rows are mapped, and unmapped when the copy is made.
            mapped = np.memmap(
                path,
                dtype=dtype,
                mode="r",
                offset=offset + start * size,
                shape=(stop - start, *shape),
            )
            out = np.array(mapped)
            del mapped
            return out

        x = rows(shard.x_path, shard.x_offset, d.x_dtype, d.sample_shape, d.x_row_bytes)
        y = rows(shard.y_path, shard.y_offset, d.y_dtype, d.y_shape, d.y_row_bytes)
        return x, y

    def _read_parquet(self, shard: Shard, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        xs, ys = [], []
        first = 0
        for group, rows in enumerate(shard.row_groups):
            end = first + rows
            if end > start and first < stop:
                x, y = self._row_group(shard, group)
                xs.append(x[max(start, first) - first : min(stop, end) - first])
                ys.append(y[max(start, first) - first : min(stop, end) - first])
            first = end
        return np.concatenate(xs), np.concatenate(ys)

    def _row_group(self, shard: Shard, group: int) -> tuple[np.ndarray, np.ndarray]:
        """One row group as arrays; the last one read is kept, since consecutive windows
        usually read on in the same group."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        if self._group is not None and self._group[:2] == (shard.name, group):
            return self._group[2], self._group[3]
        d = self.description
        columns = list(d.feature_columns) if d.feature_columns else ["x"]
        with pq.ParquetFile(shard.x_path) as handle:
            table = handle.read_row_group(group, columns=[*columns, "y"])

        def numbers(name: str, shape: tuple[int, ...]) -> np.ndarray:
            array = table.column(name).combine_chunks()
            if array.null_count:
                raise ValueError(f"shard {shard.name}: column '{name}' has empty cells")
            while pa.types.is_fixed_size_list(array.type):
                array = array.flatten()
            return np.asarray(array.to_numpy(zero_copy_only=False)).reshape(len(table), *shape)

        if d.feature_columns:
            x = np.stack([numbers(name, ()) for name in d.feature_columns], axis=1)
        else:
            x = numbers("x", d.sample_shape)
        y = numbers("y", d.y_shape)
        self._group = (shard.name, group, x, y)
        return x, y


@dataclass(frozen=True)
class ShardedTrain:
    """The training shards of a dataset; `batches` gives a worker its stream of them."""

    reader: ShardReader
    shards: tuple[Shard, ...]
    shuffle_buffer: int

    @property
    def samples(self) -> int:
        return sum(shard.rows for shard in self.shards)

    def batches(
        self,
        batch_size: int,
        *,
        seed: int,
        rank: int,
        world: int,
        shuffle: bool,
        device: torch.device | str,
    ) -> ShardBatches:
        return ShardBatches(
            self,
            batch_size,
            seed=seed,
            rank=rank,
            world=world,
            shuffle=shuffle,
            device=device,
        )


class ShardBatches:
    """Worker `rank`'s endless stream of its part of every global batch (see the module)."""

    def __init__(
        self,
        train: ShardedTrain,
        batch_size: int,
        *,
        seed: int,
        rank: int = 0,
        world: int = 1,
        shuffle: bool = True,
        device: torch.device | str = "cpu",
    ) -> None:
        if world < 1 or not 0 <= rank < world:
            raise ValueError(f"rank {rank} is not in a world of {world}")
        if batch_size < 1 or batch_size % world:
            raise ValueError(
                f"batch_size {batch_size} must be a positive multiple of the {world} workers "
                "that share it"
            )
        self._train, self._seed, self._shuffle = train, seed, shuffle
        self._rank, self._world = rank, world
        self._part = batch_size // world
        self._range = train.samples // world  # the rows of each worker's range
        if self._range < self._part:
            raise ValueError(
                f"batch_size {batch_size} is larger than the {train.samples} training samples "
                f"shared by {world} worker(s)"
            )
        self._steps = self._range // self._part
        # Windows are whole batch parts, so that no batch spans two of them.
        share = max(1, train.shuffle_buffer // world)
        self._window = max(1, share // self._part) * self._part
        self._device = torch.device(device)
        self._epoch, self._position = 0, 0
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._queue: queue.Queue[tuple[Batch | None, BaseException | None]] = queue.Queue(
            maxsize=PREFETCH
        )

    @property
    def epoch(self) -> int:
        return self._epoch

    @property
    def steps_per_epoch(self) -> int:
        return self._steps

    def shard_order(self, epoch: int) -> list[int]:
        """Indices of the training shards in `epoch`'s order, a function of (seed, epoch)."""
        count = len(self._train.shards)
        if not self._shuffle:
            return list(range(count))
        state = np.random.SeedSequence([self._seed % 2**63, epoch, 1]).generate_state(1)
        return [int(i) for i in np.random.default_rng(state).permutation(count)]

    def state(self) -> dict[str, Any]:
        order = [self._train.shards[i].name for i in self.shard_order(self._epoch)]
        return {
            "epoch": self._epoch,
            "position": self._position,
            "world": self._world,
            "shard_order": order,
            "positions": [self._position * self._part] * self._world,
        }

    def restore(self, state: Mapping[str, Any]) -> None:
        """Continue from `state()` of a stream of the same shards, seed, batch size and world."""
        epoch, position = int(state["epoch"]), int(state["position"])
        if epoch < 0 or not 0 <= position < self._steps:
            raise ValueError(
                f"cannot restore epoch {epoch} position {position}: "
                f"an epoch here has {self._steps} steps"
            )
        if "world" in state and int(state["world"]) != self._world:
            raise ValueError(
                f"the stream was saved by {state['world']} workers and is restored by "
                f"{self._world}: their ranges differ, so the epoch cannot go on exactly"
            )
        if "shard_order" in state:
            order = [self._train.shards[i].name for i in self.shard_order(epoch)]
            if list(state["shard_order"]) != order:
                raise ValueError(
                    "the shards are not those the stream was saved with (the epoch's shard "
                    "order differs): the dataset changed"
                )
        positions = state.get("positions")
        if positions is not None and int(positions[self._rank]) != position * self._part:
            raise ValueError(
                f"worker {self._rank}'s saved position {positions[self._rank]} is not step "
                f"{position} of batch parts of {self._part}"
            )
        self._halt()
        self._epoch, self._position = epoch, position

    def close(self) -> None:
        """Stop the reader thread."""
        self._halt()

    def __iter__(self) -> Iterator[Batch]:
        return self

    def __next__(self) -> Batch:
        if self._thread is None:
            self._start()
        batch, error = self._queue.get()
        if error is not None:
            self._thread = None
            raise error
        assert batch is not None
        self._position += 1
        if self._position == self._steps:
            self._epoch, self._position = self._epoch + 1, 0
        x, y = batch
        if self._device.type != "cpu":
            return x.to(self._device, non_blocking=True), y.to(self._device, non_blocking=True)
        return x, y

    # -- the reader thread ---------------------------------------------------------------------
    def _start(self) -> None:
        self._stop = threading.Event()
        self._queue = queue.Queue(maxsize=PREFETCH)
        self._thread = threading.Thread(
            target=self._read,
            args=(self._epoch, self._position, self._stop, self._queue),
            name=f"shard-reader-{self._rank}",
            daemon=True,
        )
        self._thread.start()

    def _halt(self) -> None:
        if self._thread is None:
            return
        self._stop.set()
        while self._thread.is_alive():
            with contextlib.suppress(queue.Empty):  # unblock a put waiting for room
                self._queue.get(timeout=0.05)
        self._thread = None

    def _read(
        self,
        epoch: int,
        position: int,
        stop: threading.Event,
        out: queue.Queue[tuple[Batch | None, BaseException | None]],
    ) -> None:
        pin = self._device.type == "cuda"
        try:
            while not stop.is_set():
                for batch in self._epoch_batches(epoch, position):
                    if pin:
                        batch = (batch[0].pin_memory(), batch[1].pin_memory())
                    while not stop.is_set():
                        try:
                            out.put((batch, None), timeout=0.1)
                            break
                        except queue.Full:
                            continue
                    if stop.is_set():
                        return
                epoch, position = epoch + 1, 0
        except BaseException as error:  # handed to the trainer, which raises it
            out.put((None, error))

    def _epoch_batches(self, epoch: int, position: int) -> Iterator[Batch]:
        """Batches `position`.. of `epoch` of this worker's range."""
        order = self.shard_order(epoch)
        sizes = np.array([self._train.shards[i].rows for i in order], dtype=np.int64)
        starts = np.concatenate([[0], np.cumsum(sizes)])  # where each shard begins, end to end
        begin = self._rank * self._range
        used = self._steps * self._part
        sample = position * self._part
        while sample < used:
            window = sample // self._window
            low = window * self._window
            high = min(low + self._window, used)
            x, y = self._rows(order, starts, begin + low, begin + high)
            rows: np.ndarray | None = None  # the window's order, drawn with the seed
            if self._shuffle:
                key = [self._seed % 2**63, epoch, self._rank, window, 2]
                rows = np.random.default_rng(np.random.SeedSequence(key)).permutation(len(x))
            for at in range(sample - low, high - low, self._part):
                # A gather per batch (one copy), not a permuted copy of the whole window.
                pick = slice(at, at + self._part) if rows is None else rows[at : at + self._part]
                yield (
                    torch.from_numpy(np.ascontiguousarray(x[pick])),
                    torch.from_numpy(np.ascontiguousarray(y[pick])),
                )
            sample = high

    def _rows(
        self, order: list[int], starts: np.ndarray, low: int, high: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """Rows [low, high) of the shards end to end in `order`."""
        xs, ys = [], []
        index = int(np.searchsorted(starts, low, side="right")) - 1
        while low < high:
            shard = self._train.shards[order[index]]
            first = int(starts[index])
            stop = min(high, first + shard.rows)
            if stop > low:
                x, y = self._train.reader.read(shard, low - first, stop - first)
                xs.append(x)
                ys.append(y)
            low = stop
            index += 1
        if len(xs) == 1:
            return xs[0], ys[0]
        return np.concatenate(xs), np.concatenate(ys)
