"""Taking an upload in (scheduler/store/intake.py), in a real process of its own: what it keeps
and inventories, and the bounds it holds to (bytes unpacked, memory, CPU time), each refusal
located and leaving nothing behind."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from contract.inventory import INVENTORY, CsvInventory, NpzInventory
from scheduler.store.errors import TooLarge, UnsupportedKind
from scheduler.store.intake import Bound, Intake, IntakeBounds, take_in
from scheduler.store.tables import parquet_batches, survey_table, write_shards
from tests.helpers.data_bombs import MB, npz_bomb, parquet_bomb

ROOMY = IntakeBounds(Bound(2**40, "max_dataset_unpacked_bytes"), 1024 * MB, 600.0)


def taken(source: Path, kind: str, bounds: IntakeBounds = ROOMY) -> Intake:
    """What taking `source` in gives; what is kept goes to `staged` beside it."""
    return take_in(kind, source, source.parent / "staged", filename=source.name, bounds=bounds)


def leftovers(folder: Path, *keep: str) -> list[str]:
    return sorted(path.name for path in folder.iterdir() if path.name not in keep)


def test_an_npz_and_a_csv_are_kept_with_their_inventories(tmp_path: Path) -> None:
    np.savez(tmp_path / "d.npz", x=np.ones((6, 2), np.float32), y=np.arange(6) % 3)
    intake = taken(tmp_path / "d.npz", "npz")
    assert intake.kind == "npz"
    inventory = INVENTORY.validate_python(intake.inventory)
    assert isinstance(inventory, NpzInventory)
    assert inventory.arrays["y"].values is not None and inventory.arrays["y"].values.high == 2
    assert inventory.arrays["x"].shape == (6, 2)
    assert leftovers(tmp_path) == ["staged"]  # the file moved; no answer file is left
    (tmp_path / "staged").unlink()
    (tmp_path / "t.csv").write_text("a,b\n1,0\n2,1\n", encoding="utf-8")
    intake = taken(tmp_path / "t.csv", "csv")
    assert intake.kind == "csv"
    inventory = INVENTORY.validate_python(intake.inventory)
    assert isinstance(inventory, CsvInventory) and inventory.names == ["a", "b"]
    assert inventory.rows == 2 and inventory.body[1].values.high == 1


def test_an_archive_that_unpacks_past_the_bound_is_refused_before_unpacking(
    tmp_path: Path,
) -> None:
    npz_bomb(tmp_path / "bomb.npz", nbytes=64 * MB)
    bounds = IntakeBounds(Bound(10 * MB, "what your quota dataset_bytes leaves"), 256 * MB, 60.0)
    with pytest.raises(TooLarge) as refused:
        taken(tmp_path / "bomb.npz", "npz", bounds)
    message = str(refused.value)
    assert message.startswith("bomb.npz: ")
    assert "member 'x.npy' alone declares 67108992 bytes" in message
    assert "more than the limit of 10485760 bytes (what your quota dataset_bytes leaves)" in message
    assert leftovers(tmp_path) == ["bomb.npz"]


def test_a_table_whose_shards_would_pass_the_bound_is_refused_before_writing(
    tmp_path: Path,
) -> None:
    parquet_bomb(tmp_path / "zeros.parquet")  # 262,144 rows of 512 features: 512 MB of shards
    bounds = IntakeBounds(Bound(100 * MB, "max_dataset_unpacked_bytes"), 512 * MB, 600.0)
    with pytest.raises(TooLarge) as refused:
        taken(tmp_path / "zeros.parquet", "parquet", bounds)
    message = str(refused.value)
    assert message.startswith("zeros.parquet converts to 262144 rows of 512 features: ")
    assert "more than the limit of 104857600 bytes (max_dataset_unpacked_bytes)" in message
    assert leftovers(tmp_path) == ["zeros.parquet"]


def test_the_writer_holds_the_shards_to_the_bound_as_it_writes(tmp_path: Path) -> None:
    """Should the second pass read more rows than the first counted, the writer stops at
    the bound: the prediction alone is not what bounds the output."""
    path = parquet_bomb(tmp_path / "zeros.parquet", rows=2**16, columns=64)
    survey = survey_table(
        parquet_batches(path), pq.ParquetFile(path).schema_arrow, label_column=None
    )
    undercounted = type(survey)(**{**survey.__dict__, "rows": 100})
    with pytest.raises(TooLarge, match="the shards passed the limit of 1000000 bytes"):
        write_shards(
            undercounted, parquet_batches(path), tmp_path / "out",
            max_bytes=1_000_000, limit="the limit of 1000000 bytes (a test's)",
        )  # fmt: skip
    written = sum(file.stat().st_size for file in (tmp_path / "out").iterdir())
    assert written < 1_000_000


def test_a_conversion_past_its_memory_is_refused(tmp_path: Path) -> None:
    parquet_bomb(tmp_path / "zeros.parquet")
    # Its one row group is decoded whole: 134 MB of int8 zeros.
    bounds = IntakeBounds(Bound(2**40, "max_dataset_unpacked_bytes"), 128 * MB, 600.0)
    with pytest.raises(TooLarge, match="needed more than 128 MB of memory") as refused:
        taken(tmp_path / "zeros.parquet", "parquet", bounds)
    assert "zeros.parquet" in str(refused.value)
    assert leftovers(tmp_path, "zeros.parquet", "staged") == []


def test_a_conversion_past_its_cpu_time_is_stopped(tmp_path: Path) -> None:
    parquet_bomb(tmp_path / "zeros.parquet")
    bounds = IntakeBounds(Bound(2**40, "max_dataset_unpacked_bytes"), 1024 * MB, 1.0)
    with pytest.raises(TooLarge, match=r"took more than 1 s of CPU time"):
        taken(tmp_path / "zeros.parquet", "parquet", bounds)
    assert leftovers(tmp_path, "zeros.parquet", "staged") == []


def test_the_intake_answers_a_kind_it_does_not_take(tmp_path: Path) -> None:
    (tmp_path / "d.bin").write_bytes(b"12")
    with pytest.raises(UnsupportedKind, match="uploads of kind bin are not taken"):
        taken(tmp_path / "d.bin", "bin")
    assert leftovers(tmp_path) == ["d.bin"]
