"""Small dataset files that something reading them whole turns into hundreds of megabytes: an
.npz of zeros deflated a thousandfold, a numeric .csv with one very long cell (a table of
strings is as wide as its longest cell in every cell), a Parquet table of zeros a text label
makes the service convert to shards. Each is written a piece at a time: building one never
holds what it unpacks to."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

MB = 2**20
FEATURES = 1024  # of the .npz's samples


def npy_bytes(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


def npz_bomb(path: Path, nbytes: int = 512 * MB) -> Path:
    """An .npz whose `x` is `nbytes` of float32 zeros ((nbytes / 4096, 1024): its rows are
    samples) and whose `y` labels them with 2 classes; about nbytes / 1000 on disk."""
    rows = nbytes // (4 * FEATURES)
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        header, {"descr": "<f4", "fortran_order": False, "shape": (rows, FEATURES)}
    )
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        with archive.open("x.npy", "w", force_zip64=True) as member:
            member.write(header.getvalue())
            zeros = bytes(MB)
            for _ in range(nbytes // MB):
                member.write(zeros)
        archive.writestr("y.npy", npy_bytes(np.arange(rows, dtype=np.int64) % 2))
    return path


def widening_csv(path: Path, rows: int = 2048, digits: int = 65_536) -> Path:
    """A numeric .csv of `rows` rows "feature,label", one feature written with `digits`
    digits (the number 1): about (rows x 4 + digits) bytes, which as one fixed-width string
    array (what the csv source makes of a table) takes rows x 2 x digits x 4 bytes."""
    lines = ["a,label", "0" * (digits - 1) + "1,1"]
    lines += [f"{i % 7},{i % 2}" for i in range(rows - 1)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def parquet_bomb(path: Path, rows: int = 2**18, columns: int = 512) -> Path:
    """A Parquet table of `rows` rows of `columns` int8 zeros and a text label (two values),
    in one row group: its shards (float32 features) take rows x columns x 4 bytes; the file,
    about 0.5 MB. Every column is the same array, so building it holds `rows` bytes."""
    zeros = pa.array(np.zeros(rows, dtype=np.int8))
    labels = pa.DictionaryArray.from_arrays(
        pa.array(np.arange(rows, dtype=np.int32) % 2), pa.array(["cat", "dog"])
    )
    names = [f"f{index}" for index in range(columns)]
    table = pa.table([*(zeros for _ in names), labels], names=[*names, "label"])
    pq.write_table(table, path, row_group_size=rows, compression="zstd")
    return path
