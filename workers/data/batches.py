"""Mini-batches: an endless, seeded, shardable stream for training and one pass for evaluation.

Every data-parallel rank builds the same `TrainBatches` (same seed, same global batch size) and
takes its own contiguous slice of each global batch, so the ranks together see exactly the batch
the single-process trainer would see, and synchronous data-parallel training reproduces it.

Each batch is gathered one step ahead. A training split of at most `RESIDENT_BYTES` is copied to
a GPU once, with each epoch's order, and its batches are gathered there: two gathers on the device
a step, where a batch gathered on the host and copied over costs the step's host thread a copy of
the batch, two pinned buffers and two transfers (bench/overhead.py measures that host time). A
larger split stays in host memory: each batch is gathered into pinned memory and copied without
blocking, so the next batch is on its way while the GPU trains on this one.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import numpy as np
import torch

Batch = tuple[torch.Tensor, torch.Tensor]

# The largest training split (samples and labels) kept on a GPU: an MNIST-sized set is 200 MB; a
# few workers sharing one GPU each hold their copy.
RESIDENT_BYTES = 512 * 2**20


class TrainBatches:
    """Infinite iterator of (x, y) training batches; the last incomplete batch of an epoch is
    dropped so every step has the same size."""

    def __init__(
        self,
        x: torch.Tensor,
        y: torch.Tensor,
        batch_size: int,
        seed: int,
        rank: int = 0,
        world: int = 1,
        shuffle: bool = True,
        device: torch.device | str = "cpu",
    ) -> None:
        """Batches of the host tensors `x` and `y`, delivered on `device`."""
        if len(x) != len(y):
            raise ValueError(f"{len(x)} samples but {len(y)} labels")
        if world < 1 or not 0 <= rank < world:
            raise ValueError(f"rank {rank} is not in a world of {world}")
        if batch_size < 1 or batch_size % world:
            raise ValueError(
                f"batch_size {batch_size} must be a positive multiple of the {world} workers "
                "that share it"
            )
        if batch_size > len(x):
            raise ValueError(
                f"batch_size {batch_size} is larger than the {len(x)} training samples"
            )
        self._x, self._y = x.contiguous(), y.contiguous()
        self._device = torch.device(device)
        self._resident = (
            self._device.type == "cuda" and self._x.nbytes + self._y.nbytes <= RESIDENT_BYTES
        )
        if self._resident:
            self._x, self._y = self._x.to(self._device), self._y.to(self._device)
        self._ahead: Batch | None = None  # the next batch, gathered (and on its way to a GPU)
        self._seed, self._shuffle = seed, shuffle
        self._global = batch_size
        part = batch_size // world
        self._part = (rank * part, part)  # (offset inside the global batch, rows)
        self._epoch, self._position = 0, 0
        self._order = self._permutation(0)

    @property
    def epoch(self) -> int:
        """The epoch the next batch comes from (0-based)."""
        return self._epoch

    @property
    def resident(self) -> bool:
        """Whether the samples were copied to the GPU, where the batches are gathered."""
        return self._resident

    @property
    def steps_per_epoch(self) -> int:
        return len(self._x) // self._global

    def state(self) -> dict[str, int]:
        """`{"epoch": e, "position": p}`: the next batch is number p of epoch e (JSON-ready)."""
        return {"epoch": self._epoch, "position": self._position}

    def restore(self, state: Mapping[str, int]) -> None:
        """Continue from `state()` of a stream with the same data, seed and batch size."""
        epoch, position = int(state["epoch"]), int(state["position"])
        if epoch < 0 or not 0 <= position < self.steps_per_epoch:
            raise ValueError(
                f"cannot restore epoch {epoch} position {position}: "
                f"an epoch here has {self.steps_per_epoch} steps"
            )
        self._epoch, self._position = epoch, position
        self._order = self._permutation(epoch)
        self._ahead = None

    def close(self) -> None:
        """Drop the batch gathered ahead (the samples are the dataset's, held by the caller)."""
        self._ahead = None

    def __iter__(self) -> Iterator[Batch]:
        return self

    def __next__(self) -> Batch:
        batch = self._ahead if self._ahead is not None else self._gather()
        self._position += 1
        if self._position == self.steps_per_epoch:
            self._epoch, self._position = self._epoch + 1, 0
            self._order = self._permutation(self._epoch)
        self._ahead = self._gather()
        return batch

    def _gather(self) -> Batch:
        """The batch at the current position, on the device."""
        offset, rows = self._part
        start = self._position * self._global + offset
        index = self._order[start : start + rows]  # on the samples' device
        if self._device.type == "cuda" and not self._resident:
            return _to_gpu(self._x, index, self._device), _to_gpu(self._y, index, self._device)
        return self._x.index_select(0, index), self._y.index_select(0, index)

    def _permutation(self, epoch: int) -> torch.Tensor:
        """The row order of `epoch`, a function of (seed, epoch) only, so restoring is O(1); on
        the samples' device."""
        if not self._shuffle:
            order = torch.arange(len(self._x))
        else:
            seed = np.random.SeedSequence([self._seed % 2**63, epoch]).generate_state(1, np.uint64)
            # Drawn on the CPU, so every device gives the same order.
            generator = torch.Generator().manual_seed(int(seed[0]))
            order = torch.randperm(len(self._x), generator=generator)
        if self._resident:  # from pinned memory, without waiting for the device
            return order.pin_memory().to(self._device, non_blocking=True)
        return order


def _to_gpu(rows: torch.Tensor, index: torch.Tensor, device: torch.device) -> torch.Tensor:
    """`rows[index]` gathered into pinned memory and copied to `device` without blocking.

    torch's pinned-memory allocator does not hand the buffer out again before the copy is done.
    """
    pinned = torch.empty((len(index), *rows.shape[1:]), dtype=rows.dtype, pin_memory=True)
    torch.index_select(rows, 0, index, out=pinned)
    return pinned.to(device, non_blocking=True)


def eval_batches(
    x: torch.Tensor, y: torch.Tensor, batch_size: int, limit_steps: int = 0
) -> Iterator[Batch]:
    """Sequential batches over the whole split (the last may be smaller), or its first
    `limit_steps` batches when that is positive."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    steps = -(-len(x) // batch_size)
    if limit_steps > 0:
        steps = min(steps, limit_steps)
    for step in range(steps):
        start = step * batch_size
        yield x[start : start + batch_size], y[start : start + batch_size]
