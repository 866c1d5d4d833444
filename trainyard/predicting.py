"""Scoring samples with a loaded model (trainyard/loading.py) on this machine.

`predict_array` scores an array in memory; `predict_file` streams a file in batches to a `.npy`
file, so that memory stays flat whatever the input's size: a `.npy` is read through a memory
map, one array of a `.npz` and a `.csv` a batch of rows at a time, and the output is written
through a memory map of the `.npy` it becomes. Torch loads when scoring starts.
"""

from __future__ import annotations

import csv
import zipfile
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import numpy as np

from trainyard.model_files import ModelError

if TYPE_CHECKING:
    from dsl.inference import InferenceNet

BATCH_SIZE = 1024
Batches = tuple[int, Iterator[np.ndarray]]  # how many samples, and their batches
INPUT_SUFFIXES = (".npy", ".npz", ".csv")


def predict_array(model: InferenceNet, x: Any, *, batch_size: int = BATCH_SIZE) -> np.ndarray:
    """The model's scores of the samples `x` (an array or tensor, (N, *sample_shape) or flat
    rows of as many values), as a float32 array (N, *score_shape)."""
    import torch

    array = x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)
    out = np.empty((len(array), *model.score_shape), dtype=np.float32)
    for start in range(0, len(array), batch_size):
        out[start : start + batch_size] = _score(model, array[start : start + batch_size])
    return out


def _score(model: InferenceNet, rows: np.ndarray) -> np.ndarray:
    import torch

    from dsl.inference import InferenceError

    if rows.dtype.kind not in "biuf":
        raise ModelError(f"the input holds {rows.dtype} values, not numbers")
    if not rows.flags.writeable or not rows.flags.c_contiguous:
        rows = np.array(rows)  # a memory map's or a buffer's rows: torch takes a copy of its own
    try:
        batch = model.check_input(torch.from_numpy(rows))
    except InferenceError as exc:
        raise ModelError(str(exc)) from None
    with torch.inference_mode():
        scores: np.ndarray = model(batch).float().numpy()
    return scores


def predict_file(
    model: InferenceNet,
    source: Path,
    output: Path,
    *,
    batch_size: int = BATCH_SIZE,
    key: str | None = None,
) -> int:
    """Score every sample of `source` (.npy, .npz: the array `key`, by default `x` or its only
    one, .csv: one sample a row, numbers only, an optional header) into the `.npy` file
    `output`, `batch_size` samples at a time; returns how many samples were scored."""
    if source.suffix not in INPUT_SUFFIXES:
        raise ModelError(f"{source}: the input is a {', '.join(INPUT_SUFFIXES)} file")
    if not source.is_file():
        raise ModelError(f"{source}: no such file")
    with ExitStack() as stack:
        count, batches = _batches(stack, source, batch_size, key)
        partial = output.with_name(output.name + ".part")
        out = np.lib.format.open_memmap(
            partial, mode="w+", dtype=np.float32, shape=(count, *model.score_shape)
        )
        done = 0
        try:
            for rows in batches:
                out[done : done + len(rows)] = _score(model, rows)
                done += len(rows)
            out.flush()
        except BaseException:
            del out
            partial.unlink(missing_ok=True)
            raise
        del out
        partial.replace(output)
    return done


def _batches(stack: ExitStack, source: Path, batch_size: int, key: str | None) -> Batches:
    if source.suffix == ".npy":
        array = np.load(source, mmap_mode="r")
        return len(array), _slices(array, batch_size)
    if source.suffix == ".npz":
        archive = stack.enter_context(zipfile.ZipFile(source))
        names = [n.removesuffix(".npy") for n in archive.namelist() if n.endswith(".npy")]
        chosen = key or ("x" if "x" in names else names[0] if len(names) == 1 else None)
        if chosen is None or chosen not in names:
            raise ModelError(
                f"{source}: say which array holds the samples (--key), one of {', '.join(names)}"
            )
        handle = stack.enter_context(archive.open(chosen + ".npy"))
        return _npy_stream(handle, batch_size, source)
    return _csv_stream(stack, source, batch_size)


def _slices(array: np.ndarray, batch_size: int) -> Iterator[np.ndarray]:
    for start in range(0, len(array), batch_size):
        yield np.asarray(array[start : start + batch_size])


def _npy_stream(handle: IO[bytes], batch_size: int, source: Path) -> Batches:
    """An `.npy` member of an archive read a batch of rows at a time (no seeking)."""
    version = np.lib.format.read_magic(handle)
    if version == (1, 0):
        shape, fortran, dtype = np.lib.format.read_array_header_1_0(handle)
    elif version == (2, 0):
        shape, fortran, dtype = np.lib.format.read_array_header_2_0(handle)
    else:
        raise ModelError(f"{source}: .npy format {version} is not read here (1.0 and 2.0 are)")
    if fortran or dtype.hasobject or not shape:
        raise ModelError(f"{source}: its samples must be a C-ordered array of numbers")
    row_bytes = dtype.itemsize * int(np.prod(shape[1:], dtype=np.int64))

    def rows() -> Iterator[np.ndarray]:
        left = shape[0]
        while left:
            take = min(batch_size, left)
            data = handle.read(take * row_bytes)
            yield np.frombuffer(data, dtype=dtype).reshape(take, *shape[1:])
            left -= take

    return int(shape[0]), rows()


def _csv_stream(stack: ExitStack, source: Path, batch_size: int) -> Batches:
    """A CSV file of numbers, one sample a row (a first row that is not numbers is a header):
    counted in one pass, read in a second."""
    header = _has_header(source)
    with source.open(newline="") as handle:
        count = sum(1 for row in csv.reader(handle) if row) - header
    handle = stack.enter_context(source.open(newline=""))
    reader = csv.reader(handle)
    if header:
        next(reader)

    def rows() -> Iterator[np.ndarray]:
        batch: list[list[str]] = []
        for line, row in enumerate(reader, start=1 + header):
            if not row:
                continue
            batch.append(row)
            if len(batch) == batch_size:
                yield _numbers(batch, source, line)
                batch = []
        if batch:
            yield _numbers(batch, source, line)

    return count, rows()


def _has_header(source: Path) -> bool:
    with source.open(newline="") as handle:
        first = next(csv.reader(handle), [])
    try:
        [float(cell) for cell in first]
    except ValueError:
        return True
    return False


def _numbers(batch: list[list[str]], source: Path, line: int) -> np.ndarray:
    try:
        return np.asarray(batch, dtype=np.float32)
    except ValueError:
        raise ModelError(
            f"{source}: the rows up to line {line} are not all numbers of one length"
        ) from None
