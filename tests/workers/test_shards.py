"""`source: shards`: describing from headers, refusing shards that disagree, each worker's
disjoint part, exact restore, parquet, and the benchmark's SIGKILL resume (bench/data_stream.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pydantic import TypeAdapter

from contract.shards import describe_shards
from dsl.compiler import compile_job
from dsl.data_config import DataConfig
from dsl.errors import DataSourceError, JobSpecError
from harness.watched_workers import mlp_job, train, write_shards
from workers.data import DATA_SOURCES, Dataset, TrainingData, describe, load_dataset
from workers.data.shard_stream import ShardBatches
from workers.trainer import Trainer, TrainOptions

ROOT = Path(__file__).resolve().parents[2]
CONFIG: TypeAdapter[Any] = TypeAdapter(DataConfig)


def write(folder: Path, sizes: list[int], features: int = 3, first: int = 0) -> int:
    """npy shards whose x[:, 0] is the sample id; labels id % 3. Returns the next id."""
    folder.mkdir(parents=True, exist_ok=True)
    for index, rows in enumerate(sizes):
        ids = np.arange(first, first + rows)
        x = np.zeros((rows, features), dtype=np.float32)
        x[:, 0] = ids
        np.save(folder / f"{index:05d}.x.npy", x)
        np.save(folder / f"{index:05d}.y.npy", ids % 3)
        first += rows
    return first


def load(folder: Path, **data: Any) -> Dataset:
    config = CONFIG.validate_python({"source": "shards", "path": str(folder), **data})
    return load_dataset(config, seed=0, cache_dir=folder, base_dir=folder)


def epoch_ids(stream: ShardBatches) -> list[int]:
    ids: list[int] = []
    for _ in range(stream.steps_per_epoch):
        x, _ = next(stream)
        ids += x[:, 0].int().tolist()
    return ids


def test_shards_are_a_registered_source() -> None:
    assert "shards" in DATA_SOURCES.names()


def test_describe_reads_headers_not_samples(tmp_path: Path) -> None:
    """Each x file is 64 MB of (sparse) samples; describing reads a few KB of them."""
    folder = tmp_path / "big"
    folder.mkdir()
    rows, features = 4096, 4096
    for index in range(3):
        np.save(folder / f"{index:05d}.y.npy", np.arange(rows) % 5)
        header = np.lib.format.header_data_from_array_1_0(np.zeros((1, features), np.float32))
        header["shape"] = (rows, features)
        with (folder / f"{index:05d}.x.npy").open("wb") as out:
            np.lib.format.write_array_header_1_0(out, header)
            out.truncate(out.tell() + rows * features * 4)
    read_before = _bytes_read()
    info = describe(
        CONFIG.validate_python({"source": "shards", "path": str(folder)}),
        seed=0,
        cache_dir=tmp_path,
        base_dir=tmp_path,
    )
    assert _bytes_read() - read_before < 1 << 20  # the labels (96 KB) and the headers
    assert info.sample_shape == (features,) and info.num_classes == 5
    assert info.streamed_samples == 2 * rows and info.num_samples == rows  # the test shard


def _bytes_read() -> int:
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise AssertionError("no rchar in /proc/self/io")


def test_a_shard_that_disagrees_is_refused_with_its_name(tmp_path: Path) -> None:
    write(tmp_path / "d", [10, 10, 10])
    np.save(tmp_path / "d" / "00001.x.npy", np.zeros((10, 4), dtype=np.float32))
    with pytest.raises(DataSourceError, match=r"00001\.x\.npy: shard 00001 holds samples") as e:
        load(tmp_path / "d")
    assert e.value.field == "path"
    np.save(tmp_path / "d" / "00001.x.npy", np.zeros((10, 3), dtype=np.float64))
    with pytest.raises(DataSourceError, match="float64"):
        load(tmp_path / "d")
    np.save(tmp_path / "d" / "00001.x.npy", np.zeros((9, 3), dtype=np.float32))
    with pytest.raises(
        DataSourceError, match=r"00001\.x\.npy has 9 samples but 00001\.y\.npy has 10"
    ):
        load(tmp_path / "d")
    # Through the compiler: a located error at data.path.
    document = job({"source": "shards", "path": str(tmp_path / "d"), "batch_size": 4})
    with pytest.raises(JobSpecError) as located:
        compile_job(document, TrainingData(cache_dir=tmp_path, base_dir=tmp_path))
    assert located.value.issues[0].path == "data.path"


def test_each_worker_reads_its_disjoint_part(tmp_path: Path) -> None:
    total = write(tmp_path / "d", [50, 17, 64, 33, 40, 20])  # the last is the test shard
    data = load(tmp_path / "d", shuffle_buffer=24)
    train = total - 20
    for world in (1, 2, 4):
        per_worker = [
            epoch_ids(data.train_batches(8, seed=3, rank=rank, world=world))
            for rank in range(world)
        ]
        seen = [i for ids in per_worker for i in ids]
        assert len(seen) == len(set(seen))  # nothing twice, across the workers
        assert len(seen) == (train // world) // (8 // world) * 8  # the epoch's whole batches
        assert set(seen) <= set(range(train))
    # Fewer shards than workers: disjoint row ranges of the one training shard.
    write(tmp_path / "one", [64, 8])
    one = load(tmp_path / "one")
    parts = [set(epoch_ids(one.train_batches(8, seed=0, rank=r, world=4))) for r in range(4)]
    assert set().union(*parts) == set(range(64)) and sum(map(len, parts)) == 64


def test_epochs_reshuffle_and_restore_goes_on_exactly(tmp_path: Path) -> None:
    write(tmp_path / "d", [30, 30, 30, 30, 10])
    data = load(tmp_path / "d", shuffle_buffer=16)
    stream = data.train_batches(8, seed=1)
    first = [next(stream)[0][:, 0].tolist() for _ in range(40)]
    assert first[:15] != first[15:30]  # another order in the second epoch
    again = data.train_batches(8, seed=1)
    for _ in range(22):
        next(again)
    state = json.loads(json.dumps(again.state()))
    assert state["epoch"] == 1 and state["position"] == 7 and state["positions"] == [56]
    resumed = data.train_batches(8, seed=1)
    resumed.restore(state)
    assert [next(resumed)[0][:, 0].tolist() for _ in range(18)] == first[22:40]
    with pytest.raises(ValueError, match="the dataset changed"):
        resumed.restore({**state, "shard_order": list(reversed(state["shard_order"]))})
    with pytest.raises(ValueError, match="saved by 2 workers"):
        resumed.restore({**state, "world": 2})


def test_whole_shards_for_validation_and_test(tmp_path: Path) -> None:
    write(tmp_path / "d", [10] * 10)
    data = load(tmp_path / "d", validation_fraction=0.25, test={"shards": 2})
    assert data.x_val is not None and len(data.x_val) == 20  # round(0.25 x 8 shards)
    assert set(data.x_test[:, 0].int().tolist()) == set(range(80, 100))
    assert data.train_samples == 60
    streamed = set(epoch_ids(data.train_batches(10, seed=0)))
    assert streamed.isdisjoint(data.x_val[:, 0].int().tolist()) and len(streamed) == 60
    write(tmp_path / "t", [7], first=1000)
    separate = load(tmp_path / "d", test_path=str(tmp_path / "t"))
    assert separate.x_test[:, 0].int().tolist() == list(range(1000, 1007))
    with pytest.raises(DataSourceError, match="leaves none to train on") as e:
        load(tmp_path / "d", test={"shards": 10})
    assert e.value.field == "test"


def test_parquet_shards_with_categories(tmp_path: Path) -> None:
    folder = tmp_path / "p"
    folder.mkdir()
    for index in range(3):
        ids = np.arange(index * 40, (index + 1) * 40)
        table = pa.table(
            {
                "size": pa.array(ids.astype(np.float64)),
                "colour": pa.array(ids % 4),
                "y": pa.array(ids % 2),
            }
        )
        pq.write_table(table, folder / f"part-{index}.parquet", row_group_size=16)
    categories = {"features": {"colour": ["r", "g", "b", "w"]}, "label": ["no", "yes"]}
    (folder / "categories.json").write_text(json.dumps(categories))
    data = load(folder, format="parquet", batch_size=8)
    assert data.info.sample_shape == (2,) and data.info.num_classes == 2
    assert data.info.categories == categories
    ids = epoch_ids(data.train_batches(8, seed=0))
    assert sorted(ids) == list(range(80))
    # The categories reach the model card of every checkpoint.
    document = job({"source": "shards", "path": str(folder), "format": "parquet"})
    loaded = TrainingData(cache_dir=tmp_path, base_dir=tmp_path)
    trainer = Trainer(compile_job(document, loaded), loaded.dataset, TrainOptions(tmp_path))
    assert json.loads(trainer.checkpointing.model_card)["data"]["categories"] == categories
    fixed = tmp_path / "fixed"
    fixed.mkdir()
    for index in range(2):
        x = pa.FixedSizeListArray.from_arrays(pa.array(np.arange(60, dtype=np.float32)), 3)
        pq.write_table(pa.table({"x": x, "y": pa.array([0.5] * 20)}), fixed / f"{index}.parquet")
    regression = load(fixed, format="parquet", batch_size=4)
    assert regression.info.sample_shape == (3,) and regression.info.label_shape == (1,)
    assert regression.info.num_classes is None
    x, y = next(regression.train_batches(4, seed=0))
    assert x.shape == (4, 3) and y.shape == (4, 1)
    pq.write_table(
        pa.table({"x": pa.array([[1.0, 2.0]] * 20, pa.list_(pa.float32(), 2)), "y": [1] * 20}),
        fixed / "2.parquet",
    )
    with pytest.raises(DataSourceError, match=r"2\.parquet: shard 2 holds samples"):
        load(fixed, format="parquet")
    assert describe_shards(folder, "parquet").rows == 120


def job(data: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": "shards",
        "data": data,
        "neuralnet": {
            "layers": [
                {"name": "data", "type": "input"},
                {"name": "fc", "type": "dense", "srclayers": ["data"], "units": 3},
                {"name": "loss", "type": "softmax_loss", "srclayers": ["fc"]},
            ]
        },
        "train_one_batch": {"alg": "bp"},
        "updater": {"type": "sgd", "lr": {"base": 0.01}},
        "train_steps": 4,
    }


@pytest.mark.slow
def test_the_benchmark_smoke_resumes_exactly_after_sigkill() -> None:
    """bench/data_stream.py --smoke: real training processes, two of them SIGKILLed at random
    steps and restarted from their restart points; every sample once per epoch."""
    done = subprocess.run(
        [sys.executable, "-m", "bench.data_stream", "--smoke", "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    assert figures["resume_kills"] == 2 and figures["resume_attempts"] == 3
    assert figures["every_sample_once_per_epoch"] is True
    assert figures["same_batches_as_uninterrupted"] is True


SHARD_ROWS, SHARD_FEATURES, SHARDS = 1024, 1024, 40  # 4 MB shards, 160 MB in all
BATCH, HIDDEN = 32, 32  # bench/data_stream.py's smoke sizes


@pytest.mark.slow
def test_a_streaming_worker_holds_a_few_shards_not_the_dataset(tmp_path: Path) -> None:
    """A real worker process streams an epoch of 40 shards of 4 MB, its shuffle buffer a
    shard's rows; its peak resident memory, less that of the same worker trained on a
    one-batch array, stays within 8 shards (the window read, the one read ahead, its shuffled
    copy, the queued batches): far below the 160 MB the dataset takes. The worker processes
    and their watch (resident memory sampled every 20 ms) are bench/data_stream.py's, in
    harness/watched_workers.py."""
    folder, test = tmp_path / "shards", tmp_path / "test"
    ids = write_shards(folder, shards=SHARDS, rows=SHARD_ROWS, features=SHARD_FEATURES)
    write_shards(test, shards=1, rows=SHARD_ROWS, features=SHARD_FEATURES, first_id=ids)
    x = np.load(folder / "00000.x.npy")
    shard_bytes = x.nbytes
    batch = x[:BATCH]
    np.savez(
        tmp_path / "one_batch.npz",
        x=batch,
        y=(np.arange(len(batch)) % 10).astype(np.int64),
        x_test=np.load(test / "00000.x.npy"),
        y_test=np.load(test / "00000.y.npy"),
    )
    steps = SHARDS * SHARD_ROWS // BATCH  # one epoch
    streamed_data = {
        "source": "shards",
        "path": str(folder),
        "test_path": str(test),
        "shuffle_buffer": SHARD_ROWS,
    }
    [streamed] = train(
        mlp_job(streamed_data, steps, batch_size=BATCH, hidden=HIDDEN), tmp_path, "streamed"
    )
    one_batch = {"source": "npz", "path": str(tmp_path / "one_batch.npz")}
    [control] = train(
        mlp_job(one_batch, steps, batch_size=BATCH, hidden=HIDDEN), tmp_path, "control"
    )
    data = streamed.peak_rss - control.peak_rss
    assert data <= 8 * shard_bytes, (
        f"streaming {SHARDS} shards of {shard_bytes / 2**20:.1f} MB took {data / 2**20:.1f} MB "
        f"(peak {streamed.peak_rss / 2**20:.0f} MB, control {control.peak_rss / 2**20:.0f} MB)"
    )
