"""A prediction run's worker pieces: the shards' rows, reading a row range of a dataset, and the
one output assembled from the shards in order."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest

from contract.prediction import output_file, shard_file, shard_rows
from workers.prediction import SampleError, assemble, read_rows, sample_layout


@pytest.mark.parametrize(("rows", "world"), [(10, 3), (2, 4), (1000, 1), (7, 7)])
def test_shards_are_disjoint_in_order_and_cover_every_row(rows: int, world: int) -> None:
    ranges = [shard_rows(rows, world, rank) for rank in range(world)]
    assert ranges[0][0] == 0 and ranges[-1][1] == rows
    assert all(a[1] == b[0] for a, b in itertools.pairwise(ranges))
    sizes = [stop - start for start, stop in ranges]
    assert max(sizes) - min(sizes) <= 1


def test_a_row_range_of_an_npz_and_a_csv(tmp_path: Path) -> None:
    x = np.arange(50 * 6, dtype=np.float32).reshape(50, 2, 3)
    np.savez(tmp_path / "d.npz", x=x, y=np.zeros(50))
    layout = sample_layout(tmp_path / "d.npz", "npz")
    assert (layout.rows, layout.row_shape, layout.key) == (50, (2, 3), "x")
    got = np.concatenate(list(read_rows(tmp_path / "d.npz", "npz", "x", 13, 41, 4)))
    np.testing.assert_array_equal(got, x[13:41])

    flat = x.reshape(50, 6)
    text = "a,b,c,d,e,f\n" + "\n".join(",".join(str(v) for v in row) for row in flat) + "\n"
    (tmp_path / "d.csv").write_text(text)
    layout = sample_layout(tmp_path / "d.csv", "csv")
    assert (layout.rows, layout.row_shape) == (50, (6,))
    got = np.concatenate(list(read_rows(tmp_path / "d.csv", "csv", "", 7, 20, 5)))
    np.testing.assert_array_equal(got, flat[7:20])

    np.savez(tmp_path / "two.npz", a=x, b=x)
    with pytest.raises(SampleError, match="one of a, b"):
        sample_layout(tmp_path / "two.npz", "npz")


def test_the_output_is_assembled_once_every_shard_is_written(tmp_path: Path) -> None:
    parts = [np.full((n, 3), rank, dtype=np.float32) for rank, n in enumerate((4, 4, 3))]
    shard_file(tmp_path, 0).parent.mkdir(parents=True)
    for rank in (0, 2):
        np.save(shard_file(tmp_path, rank), parts[rank])
    assert not assemble(tmp_path, 3) and not output_file(tmp_path).exists()
    np.save(shard_file(tmp_path, 1), parts[1])
    assert assemble(tmp_path, 3)
    np.testing.assert_array_equal(np.load(output_file(tmp_path)), np.concatenate(parts))
    assert not any(shard_file(tmp_path, rank).exists() for rank in range(3))
    assert assemble(tmp_path, 3)  # once assembled, it stays
