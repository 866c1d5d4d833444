"""Describing an .npz archive or a .csv table (what a job is checked against) gives what
loading it gives, refusals included, without loading it: from the file's inventory, read a
bounded chunk at a time (contract/inventory.py, workers/data/files.py)."""

from __future__ import annotations

import io
import tracemalloc
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from pydantic import TypeAdapter

from contract.inventory import INVENTORY, csv_inventory, npz_inventory
from dsl.data_config import DataConfig
from dsl.errors import DataSourceError
from tests.helpers.data_bombs import MB, npz_bomb, widening_csv
from workers.data import DATA_SOURCES, DataInfo, DataSource, describe, describe_from_inventory

# The loader's own casts of values past float32 warn; the descriptions' do not.
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered in cast")
CONFIG: TypeAdapter[Any] = TypeAdapter(DataConfig)
X = np.random.default_rng(0).normal(size=(30, 2, 3))
Y = np.arange(30) % 2


def outcome(run: Callable[[], DataInfo]) -> DataInfo | tuple[str, str | None, str | None]:
    """What describing or loading gives: the DataInfo, or the refusal's words."""
    try:
        return run()
    except DataSourceError as error:
        return (error.message, error.hint, error.field)


def loaded(config: Any, folder: Path) -> Any:
    """The description as loading makes it, every array read: DataSource.describe's default,
    which the npz and csv sources used before."""
    source = DATA_SOURCES.get(config.source)
    return outcome(
        lambda: DataSource.describe(source, config, seed=0, cache_dir=folder, base_dir=folder)
    )


def described(config: Any, folder: Path) -> Any:
    return outcome(lambda: describe(config, seed=0, cache_dir=folder, base_dir=folder))


def member(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.lib.format.write_array(buffer, array, allow_pickle=True)
    return buffer.getvalue()


# Each case: the file's members (arrays, saved with numpy.savez, or raw bytes) and options.
NPZ_CASES: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "classes": ({"x": X, "y": np.arange(30) % 5}, {}),
    "regression with its own test split": (
        {"f": X, "t": X.sum(axis=(1, 2)), "ft": X[:4], "tt": np.ones(4)},
        {"x_key": "f", "y_key": "t", "x_test_key": "ft", "y_test_key": "tt"},
    ),
    "token ids": ({"x": np.arange(40).reshape(10, 4), "y": np.arange(10) % 2}, {}),
    "validation arrays": (
        {"x": X, "y": Y, "xv": X[:5], "yv": np.arange(5) + 3},
        {"x_val_key": "xv", "y_val_key": "yv"},
    ),
    "booleans, fortran order, big-endian": (
        {"x": np.asfortranarray(X > 0), "y": (np.arange(30) % 3).astype(">u2")},
        {},
    ),
    "boolean and float16 labels": (
        {"x": X, "y": Y == 0, "x_test": X[:3], "y_test": np.ones(3, np.float16)},
        {},
    ),
    "one-dimensional samples": ({"x": np.arange(9.0), "y": np.arange(9) % 2}, {}),
    "no array y": ({"x": X, "labels": Y}, {}),
    "a named test key missing": ({"x": X, "y": Y}, {"x_test_key": "xt"}),
    "one class": ({"x": X, "y": np.zeros(30, int)}, {}),
    "negative classes": ({"x": X, "y": np.arange(30) - 1}, {}),
    "samples with NaN": ({"x": np.where(X > 1, np.nan, X), "y": Y}, {}),
    "samples past float32": ({"x": X * 1e300, "y": Y}, {}),
    "labels with infinity": ({"x": X, "y": np.full(30, np.inf)}, {}),
    "float64 labels past float32": ({"x": X, "y": np.full(30, 1e300)}, {}),
    "complex samples": ({"x": X + 1j, "y": Y}, {}),
    "text labels": ({"x": X, "y": np.array(["a", "b"] * 15)}, {}),
    "a scalar": ({"x": np.float32(1), "y": np.arange(3)}, {}),
    "more samples than labels": ({"x": X, "y": Y[:29]}, {}),
    "test samples of another shape": (
        {"x": X, "y": Y, "x_test": X[:3, :1], "y_test": Y[:3]},
        {},
    ),
    "test samples of another dtype": (
        {"x": X, "y": Y, "x_test": np.ones((3, 2, 3), int), "y_test": Y[:3]},
        {},
    ),
    "test labels of another shape": (
        {"x": X, "y": Y, "x_test": X[:3], "y_test": np.ones((3, 2), int)},
        {},
    ),
    "int labels and float test labels": (
        {"x": X, "y": Y, "x_test": X[:3], "y_test": np.ones(3)},
        {},
    ),
    "int64 and uint64 labels make floats": (
        {"x": X, "y": Y, "x_test": X[:3], "y_test": np.ones(3, np.uint64)},
        {},
    ),
    "one sample": ({"x": X[:1], "y": Y[:1]}, {}),
    "an object array": ({"x.npy": member(np.array([{}, None])), "y.npy": member(Y[:2])}, {}),
    "a truncated member": ({"x.npy": member(X)[:-8], "y.npy": member(Y)}, {}),
    "an object array nobody reads": (
        {"x.npy": member(X), "y.npy": member(Y), "o.npy": member(np.array([{}]))},
        {},
    ),
}


def write_npz(path: Path, members: dict[str, Any]) -> None:
    if all(isinstance(value, bytes) for value in members.values()):
        with zipfile.ZipFile(path, "w") as archive:
            for name, content in members.items():
                archive.writestr(name, content)
    else:
        np.savez(path, **members)


@pytest.mark.parametrize("case", sorted(NPZ_CASES))
def test_an_npz_is_described_as_loading_it_would(case: str, tmp_path: Path) -> None:
    members, options = NPZ_CASES[case]
    write_npz(tmp_path / "d.npz", members)
    config = CONFIG.validate_python({"source": "npz", "path": "d.npz", **options})
    expected = loaded(config, tmp_path)
    assert described(config, tmp_path) == expected
    # As stored with an uploaded dataset: every array summarised, kept as JSON.
    stored = INVENTORY.validate_json(npz_inventory(tmp_path / "d.npz").model_dump_json())
    config = config.model_copy(update={"path": str(tmp_path / "d.npz")})
    assert outcome(lambda: describe_from_inventory(config, stored)) == expected


def zip_of(members: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, content in members.items():
            archive.writestr(name, content)
    return buffer.getvalue()


@pytest.mark.parametrize(
    ("content", "words", "as_loaded"),
    [
        (b"not a zip", "pickled (object) data", True),
        (b"", "No data left in file", True),
        # numpy.load gives an .npy's array, or a member's bytes, which the loader cannot use.
        (member(X), "one .npy array, not an .npz archive", False),
        (zip_of({"x.npy": member(X), "y": b"labels"}), "reading magic string", False),
    ],
)
def test_a_file_that_is_no_archive_of_arrays_is_refused(
    content: bytes, words: str, as_loaded: bool, tmp_path: Path
) -> None:
    (tmp_path / "d.npz").write_bytes(content)
    config = CONFIG.validate_python({"source": "npz", "path": "d.npz"})
    message, _, field = described(config, tmp_path)
    assert "as a numpy .npz archive" in message and words in message and field == "path"
    if as_loaded:
        assert described(config, tmp_path) == loaded(config, tmp_path)


def rows(*lines: str) -> str:
    return "".join(f"{line}\n" for line in lines)


TABLE = rows("a,b,label", *(f"{i},{i * 0.5},{i % 3}" for i in range(20)))
# Each case: the table, the options, and a validation file (or None).
CSV_CASES: dict[str, tuple[str, dict[str, Any], str | None]] = {
    "classes by name": (TABLE, {"label_column": "label"}, None),
    "regression by index": (TABLE, {"label_column": 1}, None),
    "no header": (TABLE.split("\n", 1)[1], {"header": False}, None),
    "a header read as data": (TABLE, {"header": False}, None),
    "numbers as numpy reads them": (rows("a,b,y", " 3,1_0,+1", "1e3,-2,0", "4,5,2"), {}, None),
    "infinity as a feature": (rows("a,y", "inf,1", "2,0", "3,1"), {}, None),
    "a feature past float32": (rows("a,y", "1e39,1", "2,0", "3,1"), {}, None),
    "a label past float32": (rows("a,y", "1,1e39", "2,0.5", "3,1"), {}, None),
    "a label of NaN": (rows("a,y", "1,nan", "2,0.5", "3,1"), {}, None),
    "a cell that is no number": (rows("a,b", "1,2", "3,x"), {"label_column": 0}, None),
    "the first bad cell of the file": (rows("a,b,c", "1,z,2", "y,2,3"), {}, None),
    "a label that is no number": (rows("a,b", "1,2", "3,x"), {}, None),
    "a bad label before a bad feature": (rows("a,y", "1,x", "z,1"), {}, None),
    "no such column": (rows("a,b", "1,2"), {"label_column": "c"}, None),
    "no such index": (rows("a,b", "1,2"), {"label_column": 5}, None),
    "one data row": (rows("a,b", "1,2"), {}, None),
    "no data rows": (rows("a,b"), {}, None),
    "an empty file": ("", {}, None),
    "blank lines": (rows("a,b", "", "1,0", "", "2,1", ""), {}, None),
    "ragged rows": (rows("a,b", "1,2", "1,2,3", "4"), {}, None),
    "a ragged row after a bad cell": (rows("a,b", "x,2", "1,2,3"), {}, None),
    "one column": (rows("a", "1", "2"), {}, None),
    "negative classes": (rows("a,y", "1,-1", "2,0"), {}, None),
    "one class": (rows("a,y", "1,0", "2,0"), {}, None),
    "a validation file": (TABLE, {}, rows("a,b,label", "1,2,3", "4,5,0")),
    "a validation file of floats": (TABLE, {}, rows("a,b,label", "1,2,0.5", "4,5,0")),
    "a validation file of other columns": (TABLE, {}, rows("a,label", "1,0")),
    "a validation file with a bad cell": (TABLE, {}, rows("a,b,label", "1,q,0")),
    "a validation file with a bad label": (TABLE, {}, rows("a,b,label", "1,2,q")),
    "a validation file with NaN": (TABLE, {}, rows("a,b,label", "1,nan,0")),
}


@pytest.mark.parametrize("case", sorted(CSV_CASES))
def test_a_csv_is_described_as_loading_it_would(case: str, tmp_path: Path) -> None:
    text, options, validation = CSV_CASES[case]
    (tmp_path / "t.csv").write_text(text, encoding="utf-8")
    if validation is not None:
        (tmp_path / "v.csv").write_text(validation, encoding="utf-8")
        options = {**options, "val_path": "v.csv"}
    config = CONFIG.validate_python({"source": "csv", "path": "t.csv", **options})
    expected = loaded(config, tmp_path)
    assert described(config, tmp_path) == expected
    if validation is None:
        stored = INVENTORY.validate_json(csv_inventory(tmp_path / "t.csv").model_dump_json())
        config = config.model_copy(update={"path": str(tmp_path / "t.csv")})
        assert outcome(lambda: describe_from_inventory(config, stored)) == expected


def test_a_csv_that_is_no_utf8_is_refused_where_the_loader_refuses_it(tmp_path: Path) -> None:
    # The bad byte comes after the first block the reader decodes.
    (tmp_path / "t.csv").write_bytes(TABLE.encode() * 1000 + b"1,2,\xff\n")
    config = CONFIG.validate_python({"source": "csv", "path": "t.csv"})
    refused = described(config, tmp_path)
    assert "cannot read" in refused[0] and "utf-8" in refused[0]
    assert refused == loaded(config, tmp_path)


def peak_bytes(run: Callable[[], object]) -> tuple[object, int]:
    tracemalloc.start()
    try:
        result = run()
        return result, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_an_archive_that_inflates_a_thousandfold_is_described_in_megabytes(
    tmp_path: Path,
) -> None:
    npz_bomb(tmp_path / "bomb.npz", nbytes=256 * MB)
    assert (tmp_path / "bomb.npz").stat().st_size < MB
    config = CONFIG.validate_python({"source": "npz", "path": "bomb.npz"})
    info, peak = peak_bytes(lambda: describe(config, seed=0, cache_dir=tmp_path, base_dir=tmp_path))
    assert isinstance(info, DataInfo)
    assert (info.sample_shape, info.num_classes, info.num_samples) == ((1024,), 2, 65536)
    assert peak < 32 * MB  # the 256 MB array was read 4 MB at a time, never held


def test_a_table_with_one_long_cell_is_described_in_megabytes(tmp_path: Path) -> None:
    # 74 kB, which as one array of strings as wide as its longest cell takes 1 GB.
    widening_csv(tmp_path / "wide.csv")
    config = CONFIG.validate_python({"source": "csv", "path": "wide.csv"})
    info, peak = peak_bytes(lambda: describe(config, seed=0, cache_dir=tmp_path, base_dir=tmp_path))
    assert isinstance(info, DataInfo)
    assert (info.sample_shape, info.num_classes, info.num_samples) == ((1,), 2, 2048)
    # numpy converts a string array to numbers through a buffer of 512 x its longest cell
    # (32 MB here, at most 64 MB: the csv reader takes cells of 131,072 characters at most).
    assert peak < 48 * MB
