"""One worker of a prediction run (contract/prediction.py): scores its shard of a dataset.

The node agent starts it like a training worker (workers/entry.py reads the run's kind).
It rebuilds the net from the checkpoint with the one inference function
(dsl.inference.load_inference_net), reads its rows [start, stop) of the uploaded dataset a batch
at a time (an .npz array through its member's stream, a .csv's rows), scores them and writes
them to its shard file, renamed into place once complete, so a shard file is always whole. It
reports the rows it has scored on the run's stream. A worker restarted after a failure scores
its shard again, unless its file was already complete. The worker that finds every shard
written assembles them, in input order, into the output `.npy` (written beside it and renamed:
a reader never sees half of it).

Reading the samples is here too (`sample_layout`): the service checks a dataset with it before
it places a run. Torch is imported when scoring starts.
"""

from __future__ import annotations

import csv
import os
import sys
import time
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import numpy as np

from contract.allocation import AllocationInfo, ExitCode
from contract.prediction import (
    ROWS_METRIC,
    PredictionTask,
    output_file,
    shard_file,
    shard_rows,
)
from contract.stream import JobStream, MetricRecord

PROGRESS_SECONDS = 0.5  # a worker reports its rows scored at most this often


class SampleError(ValueError):
    """The dataset's samples cannot be read as asked; `str()` says why."""


@dataclass(frozen=True)
class SampleLayout:
    rows: int
    row_shape: tuple[int, ...]  # one sample's shape as stored (a .csv row: (columns,))
    key: str  # the .npz array ("" for a .csv)


def sample_layout(path: Path, kind: str, key: str = "") -> SampleLayout:
    """How many samples `path` holds and their stored shape, read from the .npy header of an
    .npz archive's array `key` (default `x`, or its only one) or by counting a .csv's rows."""
    if kind == "npz":
        with zipfile.ZipFile(path) as archive:
            names = [n.removesuffix(".npy") for n in archive.namelist() if n.endswith(".npy")]
            chosen = key or ("x" if "x" in names else names[0] if len(names) == 1 else "")
            if chosen not in names:
                raise SampleError(
                    f"say which array of the .npz holds the samples (key), one of "
                    f"{', '.join(names)}"
                )
            with archive.open(chosen + ".npy") as handle:
                shape, _ = _npy_header(handle)
        return SampleLayout(rows=int(shape[0]), row_shape=tuple(shape[1:]), key=chosen)
    _, width, rows = _csv_facts(path)
    return SampleLayout(rows=rows, row_shape=(width,), key="")


def read_rows(
    path: Path, kind: str, key: str, start: int, stop: int, batch_size: int
) -> Iterator[np.ndarray]:
    """The samples [start, stop) of the dataset, `batch_size` rows at a time."""
    if kind == "npz":
        yield from _npz_rows(path, key, start, stop, batch_size)
    else:
        yield from _csv_rows(path, start, stop, batch_size)


def _npy_header(handle: IO[bytes]) -> tuple[tuple[int, ...], np.dtype]:
    version = np.lib.format.read_magic(handle)
    if version == (1, 0):
        shape, fortran, dtype = np.lib.format.read_array_header_1_0(handle)
    elif version == (2, 0):
        shape, fortran, dtype = np.lib.format.read_array_header_2_0(handle)
    else:
        raise SampleError(f".npy format {version} is not read here (1.0 and 2.0 are)")
    if fortran or dtype.hasobject or not shape or dtype.kind not in "biuf":
        raise SampleError("the samples must be a C-ordered array of numbers, one sample a row")
    return tuple(int(s) for s in shape), dtype


def _npz_rows(path: Path, key: str, start: int, stop: int, batch_size: int) -> Iterator[np.ndarray]:
    with zipfile.ZipFile(path) as archive, archive.open(key + ".npy") as handle:
        shape, dtype = _npy_header(handle)
        row_bytes = dtype.itemsize * int(np.prod(shape[1:], dtype=np.int64))
        # A stored member seeks without reading; a compressed one reads up to the offset.
        handle.seek(start * row_bytes, os.SEEK_CUR)
        left = stop - start
        while left > 0:
            take = min(batch_size, left)
            data = handle.read(take * row_bytes)
            yield np.frombuffer(data, dtype=dtype).reshape(take, *shape[1:]).copy()
            left -= take


def _csv_facts(path: Path) -> tuple[bool, int, int]:
    """Whether the first row is a header (not numbers), the row width and the sample count."""
    with path.open(newline="") as handle:
        reader = csv.reader(handle)
        first = next(reader, [])
        try:
            [float(cell) for cell in first]
            header = False
        except ValueError:
            header = True
        rows = sum(1 for row in reader if row) + (0 if header or not first else 1)
    return header, len(first), rows


def _csv_rows(path: Path, start: int, stop: int, batch_size: int) -> Iterator[np.ndarray]:
    header, _, _ = _csv_facts(path)
    with path.open(newline="") as handle:
        reader = (row for row in csv.reader(handle) if row)
        if header:
            next(reader)
        batch: list[list[str]] = []
        for index, row in enumerate(reader):
            if index < start:
                continue
            if index >= stop:
                break
            batch.append(row)
            if len(batch) == batch_size:
                yield _numbers(batch, index)
                batch = []
        if batch:
            yield _numbers(batch, stop)


def _numbers(batch: list[list[str]], row: int) -> np.ndarray:
    try:
        return np.asarray(batch, dtype=np.float32)
    except ValueError:
        raise SampleError(f"the rows up to row {row} are not all numbers of one length") from None


# -- the worker ----------------------------------------------------------------------------------
def predict_shard(info: AllocationInfo, stream: JobStream, should_stop: Callable[[], bool]) -> int:
    """Score this worker's shard of the run's dataset into its shard file; assemble the output
    when every shard is written. Returns the process's exit code."""
    if output_file(info.run_dir).is_file():  # assembled already: a restart after the end
        return ExitCode.OK
    if info.prediction is None:
        print("a prediction run's worker was given no task to score", file=sys.stderr)
        return ExitCode.INVALID
    task = PredictionTask.from_dict(info.prediction)
    if not shard_file(info.run_dir, info.rank).is_file():  # else written before a restart
        code = _score_shard(info, task, stream, should_stop)
        if code != ExitCode.OK:
            return code
    assemble(info.run_dir, info.world)
    return ExitCode.OK


def _score_shard(
    info: AllocationInfo,
    task: PredictionTask,
    stream: JobStream,
    should_stop: Callable[[], bool],
) -> int:
    """The shard's rows scored a batch at a time into a file of this process's own, renamed
    to the shard's name once complete (removed if not)."""
    import torch

    from dsl.inference import InferenceError, load_inference_net

    torch.set_num_threads(max(info.slots, 1))
    start, stop = shard_rows(task.rows, info.world, info.rank)
    try:
        model = load_inference_net(task.checkpoint, probabilities=task.probabilities)
    except InferenceError as exc:
        print(f"the model cannot be built here: {exc}", file=sys.stderr)
        return ExitCode.INVALID
    target = shard_file(info.run_dir, info.rank)
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f"{target.name}.{info.allocation_id}.part")
    out = np.lib.format.open_memmap(
        partial, mode="w+", dtype=np.float32, shape=(stop - start, *model.score_shape)
    )
    done, reported, complete = 0, time.monotonic(), False
    try:
        for rows in read_rows(
            Path(task.dataset), task.format, task.key, start, stop, task.batch_size
        ):
            if should_stop():
                return ExitCode.CANCELLED
            with torch.inference_mode():
                batch = model.check_input(torch.from_numpy(rows))  # (B, *sample_shape)
                out[done : done + len(rows)] = model(batch).float().numpy()  # (B, *score_shape)
            done += len(rows)
            if time.monotonic() >= reported + PROGRESS_SECONDS:
                reported = time.monotonic()
                stream.publish(_progress(info, done))
        out.flush()
        complete = True
    except (InferenceError, SampleError) as exc:
        print(f"rows {start}..{stop} cannot be scored: {exc}", file=sys.stderr)
        return ExitCode.INVALID
    finally:
        del out
        if not complete:
            partial.unlink(missing_ok=True)
    partial.replace(target)
    stream.publish(_progress(info, stop - start))
    return ExitCode.OK


def _progress(info: AllocationInfo, done: int) -> MetricRecord:
    """The rows of its shard scored so far, as its step too: the run's job shows the progress
    of its furthest worker, over the largest shard's rows (scheduler/store/predictions.py
    progress_ends)."""
    return MetricRecord(
        step=done, values={ROWS_METRIC: float(done)}, group=info.group, rank=info.rank
    )


def assemble(run_dir: Path, world: int) -> bool:
    """The shards, in rank order, as the run's one output `.npy`, once every shard is written
    (False: some are still to come); the shards are removed then. Two workers finishing
    together may both assemble: each writes a file of its own and renames it into place, both
    with the same rows."""
    output = output_file(run_dir)
    shards = [shard_file(run_dir, rank) for rank in range(world)]
    if output.is_file() or not all(shard.is_file() for shard in shards):
        return output.is_file()
    try:
        parts = [np.load(shard, mmap_mode="r") for shard in shards]
    except FileNotFoundError:  # another worker assembled them, and removed them, meanwhile
        return output.is_file()
    total = sum(len(part) for part in parts)
    partial = output.with_name(f"{output.name}.{os.getpid()}.part")
    out = np.lib.format.open_memmap(
        partial, mode="w+", dtype=np.float32, shape=(total, *parts[0].shape[1:])
    )
    at = 0
    for part in parts:
        out[at : at + len(part)] = part
        at += len(part)
    out.flush()
    del out
    partial.replace(output)
    for shard in shards:  # their rows are in the output now: the disk holds them once
        shard.unlink(missing_ok=True)
    return True
