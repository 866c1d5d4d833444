"""Data sources (shapes, determinism, errors) and the train/eval batch streams."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any

import mnist1d.data
import numpy as np
import pytest
import torch
from pydantic import TypeAdapter, ValidationError

from dsl.data_config import DataConfig, SyntheticData
from dsl.errors import DataSourceError
from workers.data import (
    DATA_SOURCES,
    Dataset,
    TrainBatches,
    describe,
    eval_batches,
    load_dataset,
)
from workers.data.text import builtin_corpus

CONFIG: TypeAdapter[Any] = TypeAdapter(DataConfig)


def load(tmp: Path, seed: int = 0, **data: Any) -> Dataset:
    return load_dataset(CONFIG.validate_python(data), seed=seed, cache_dir=tmp, base_dir=tmp)


def same(a: Dataset, b: Dataset) -> bool:
    return all(
        torch.equal(getattr(a, name), getattr(b, name))
        for name in ("x_train", "y_train", "x_test", "y_test")
    )


def test_every_config_source_has_a_loader() -> None:
    assert DATA_SOURCES.names() == [
        "csv",
        "dataset",
        "digits",
        "mnist1d",
        "npz",
        "shards",
        "synthetic",
        "text",
    ]
    with pytest.raises(ValidationError):
        CONFIG.validate_python({"source": "imagenet"})


def test_digits_shapes_and_range(tmp_path: Path) -> None:
    data = load(tmp_path, source="digits", test_fraction=0.25)
    assert data.info.sample_shape == (1, 8, 8) and data.info.num_classes == 10
    assert data.x_train.dtype == torch.float32 and data.y_train.dtype == torch.int64
    assert len(data.x_train) + len(data.x_test) == 1797
    assert len(data.x_test) == round(1797 * 0.25)
    assert data.x_train.min() >= 0.0 and data.x_train.max() == 1.0
    assert set(data.y_train.tolist()) == set(range(10))
    info = describe(CONFIG.validate_python({"source": "digits"}), seed=0, cache_dir=tmp_path)
    assert info == data.info


def test_same_seed_same_tensors_other_seed_other_split(tmp_path: Path) -> None:
    for data in ({"source": "digits"}, {"source": "synthetic"}, {"source": "text"}):
        assert same(load(tmp_path, 3, **data), load(tmp_path, 3, **data))
        assert not same(load(tmp_path, 3, **data), load(tmp_path, 4, **data))


@pytest.fixture(scope="module")
def mnist_cache(cache_dir: Path) -> tuple[Path, Dataset]:
    return cache_dir, load(cache_dir, 5, source="mnist1d", num_samples=1000)


def test_mnist1d_uses_its_own_split(mnist_cache: tuple[Path, Dataset]) -> None:
    _, data = mnist_cache
    assert data.info.sample_shape == (1, 40) and data.info.num_classes == 10
    assert data.x_train.shape == (800, 1, 40) and data.x_test.shape == (200, 1, 40)
    assert data.x_train.dtype == torch.float32 and data.y_test.dtype == torch.int64
    assert set(data.y_train.tolist()) == set(range(10))


def test_mnist1d_second_load_reads_the_cache(
    mnist_cache: tuple[Path, Dataset], monkeypatch: pytest.MonkeyPatch
) -> None:
    cache, first = mnist_cache
    (stored,) = cache.glob("mnist1d-*n1000-s5.npz")
    mtime = stored.stat().st_mtime_ns

    def no_generation(*args: object, **kwargs: object) -> None:
        raise AssertionError("make_dataset ran although the cache holds the arrays")

    monkeypatch.setattr(mnist1d.data, "make_dataset", no_generation)
    start = time.perf_counter()
    again = load(cache, 5, source="mnist1d", num_samples=1000, test_fraction=0.5)
    assert time.perf_counter() - start < 0.5
    assert same(first, again) and stored.stat().st_mtime_ns == mtime
    seq = load(cache, 5, source="mnist1d", num_samples=1000, sequence=True)
    assert seq.info.sample_shape == (40, 1)
    assert torch.equal(seq.x_train, first.x_train.transpose(1, 2))


def test_mnist1d_seed_changes_data_and_keeps_global_random_state(tmp_path: Path) -> None:
    np.random.seed(123)
    expected = np.random.rand()
    np.random.seed(123)
    a = load(tmp_path, 1, source="mnist1d", num_samples=100)
    assert np.random.rand() == expected
    b = load(tmp_path, 2, source="mnist1d", num_samples=100)
    assert not torch.equal(a.x_train, b.x_train)
    assert len(list(tmp_path.glob("mnist1d-*.npz"))) == 2


def test_synthetic_classification_and_images(tmp_path: Path) -> None:
    blobs = load(tmp_path, source="synthetic", num_features=7, num_classes=3, num_samples=300)
    assert blobs.x_train.shape == (240, 7) and blobs.info.num_classes == 3
    assert torch.bincount(torch.cat([blobs.y_train, blobs.y_test])).tolist() == [100] * 3
    images = load(tmp_path, source="synthetic", task="images", channels=3, image_size=10)
    assert images.info.sample_shape == (3, 10, 10) and images.info.label_shape == ()
    assert images.x_test.dtype == torch.float32
    quiet = load(tmp_path, source="synthetic", task="images", num_classes=8, noise=0.0)
    # Without noise every class is its own bar: one distinct pixel pattern per class.
    patterns = {tuple((x[0] > 0).flatten().tolist()) for x in quiet.x_train}
    assert len(patterns) == 8


def test_synthetic_adding_problem_targets(tmp_path: Path) -> None:
    data = load(tmp_path, source="synthetic", task="sequence", seq_len=12, num_samples=50)
    info = data.info
    assert info.sample_shape == (12, 2) and info.label_shape == (1,)
    assert info.num_classes is None and not info.label_is_index
    assert data.y_train.dtype == torch.float32
    marks = data.x_train[:, :, 1]
    assert torch.equal(marks.sum(1), torch.full((40,), 2.0))
    target = (data.x_train[:, :, 0] * marks).sum(1, keepdim=True)
    torch.testing.assert_close(data.y_train, target)


def test_synthetic_rejects_keys_of_another_task() -> None:
    with pytest.raises(ValidationError, match="num_features"):
        SyntheticData(source="synthetic", task="sequence", num_features=3)
    with pytest.raises(ValidationError, match="at most 16"):
        SyntheticData(source="synthetic", task="images", image_size=8, num_classes=17)


def test_npz_classification_regression_and_given_test_split(tmp_path: Path) -> None:
    x = np.random.default_rng(0).normal(size=(30, 2, 3))
    np.savez(tmp_path / "cls.npz", x=x, y=np.arange(30) % 5)
    data = load(tmp_path, source="npz", path="cls.npz", test_fraction=0.1)
    assert data.info.sample_shape == (2, 3) and data.info.num_classes == 5
    assert data.x_train.shape == (27, 2, 3) and data.y_train.dtype == torch.int64
    np.savez(tmp_path / "reg.npz", feats=x, t=x.sum(axis=(1, 2)), t_test=np.ones(4), f_test=x[:4])
    reg = load(
        tmp_path, source="npz", path="reg.npz", x_key="feats", y_key="t",
        x_test_key="f_test", y_test_key="t_test",
    )  # fmt: skip
    assert reg.info.num_classes is None and reg.info.label_shape == (1,)
    assert reg.x_train.shape == (30, 2, 3) and reg.y_test.shape == (4, 1)
    torch.testing.assert_close(reg.x_test, torch.from_numpy(x[:4]).float())
    np.savez(tmp_path / "tokens.npz", x=np.arange(40).reshape(10, 4), y=np.arange(10) % 2)
    assert load(tmp_path, source="npz", path="tokens.npz").x_train.dtype == torch.int64


def test_npz_errors_name_the_file_and_key(tmp_path: Path) -> None:
    with pytest.raises(DataSourceError, match=r"missing\.npz' does not exist") as error:
        load(tmp_path, source="npz", path="missing.npz")
    assert error.value.field == "path"
    np.savez(tmp_path / "d.npz", x=np.zeros((5, 2)), labels=np.zeros(5, dtype=int))
    with pytest.raises(DataSourceError, match=r"d\.npz has no array 'y'") as error:
        load(tmp_path, source="npz", path="d.npz")
    assert error.value.field == "y_key" and error.value.hint == "the file holds: labels, x"
    with pytest.raises(DataSourceError, match="no array 'xt'") as error:
        load(tmp_path, source="npz", path="d.npz", y_key="labels", x_test_key="xt")
    assert error.value.field == "x_test_key"
    with pytest.raises(DataSourceError, match="only one class"):
        load(tmp_path, source="npz", path="d.npz", y_key="labels")
    (tmp_path / "junk.npz").write_text("not a zip")
    with pytest.raises(DataSourceError, match="cannot read"):
        load(tmp_path, source="npz", path="junk.npz")


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def test_csv_by_name_by_index_and_regression(tmp_path: Path) -> None:
    rows = "\n".join(f"{i},{i * 0.5},{i % 3}" for i in range(20))
    write(tmp_path / "t.csv", "a,b,label\n" + rows + "\n")
    data = load(tmp_path, source="csv", path="t.csv", label_column="label")
    assert data.info.sample_shape == (2,) and data.info.num_classes == 3
    assert data.x_train.dtype == torch.float32 and len(data.x_test) == 4
    torch.testing.assert_close(data.x_train[:, 1], data.x_train[:, 0] * 0.5)
    by_index = load(tmp_path, source="csv", path="t.csv", label_column=1)
    assert by_index.info.num_classes is None and by_index.info.label_shape == (1,)
    torch.testing.assert_close(by_index.y_train[:, 0], by_index.x_train[:, 0] * 0.5)
    write(tmp_path / "n.csv", rows)
    assert load(tmp_path, source="csv", path="n.csv", header=False).info.num_classes == 3


def test_csv_errors(tmp_path: Path) -> None:
    write(tmp_path / "bad.csv", "a,b\n1,2\n3,x\n")
    with pytest.raises(DataSourceError, match=r"bad\.csv line 3, column 2: 'x' is not a number"):
        load(tmp_path, source="csv", path="bad.csv", label_column=0)
    with pytest.raises(DataSourceError, match="no column named 'c'") as error:
        load(tmp_path, source="csv", path="bad.csv", label_column="c")
    assert error.value.field == "label_column" and error.value.hint == "the header names: a, b"
    with pytest.raises(DataSourceError, match="label_column 5 does not exist"):
        load(tmp_path, source="csv", path="bad.csv", label_column=5)
    write(tmp_path / "one.csv", "a,b\n1,2\n")
    with pytest.raises(DataSourceError, match="at least 2"):
        load(tmp_path, source="csv", path="one.csv")
    with pytest.raises(ValidationError, match="header: true"):
        CONFIG.validate_python({"source": "csv", "path": "x", "label_column": "a", "header": False})


def test_builtin_text_corpus(tmp_path: Path) -> None:
    corpus = builtin_corpus()
    assert 100_000 <= len(corpus.encode()) <= 300_000
    data = load(tmp_path, source="text", seq_len=32)
    info = data.info
    assert info.vocabulary == "".join(sorted(set(corpus)))
    assert info.num_classes == len(info.vocabulary) and "e" in info.vocabulary
    assert info.sample_shape == (32,) and info.label_shape == (32,) and info.x_dtype == "int64"
    windows = torch.cat([data.x_train, data.x_test])
    assert len(windows) == (len(corpus) - 1) // 32
    # Labels are the inputs shifted by one character.
    assert torch.equal(data.x_train[:, 1:], data.y_train[:, :-1])
    decoded = {"".join(info.vocabulary[i] for i in row) for row in windows.tolist()}
    assert corpus[:32] in decoded


def test_text_file_and_too_short_text(tmp_path: Path) -> None:
    write(tmp_path / "abc.txt", "abcab" * 40)
    data = load(tmp_path, source="text", path="abc.txt", seq_len=8)
    assert data.info.vocabulary == "abc" and data.info.num_classes == 3
    assert len(data.x_train) + len(data.x_test) == 199 // 8
    write(tmp_path / "short.txt", "hello")
    with pytest.raises(DataSourceError, match="fewer than 2 windows") as error:
        load(tmp_path, source="text", path="short.txt", seq_len=4)
    assert error.value.field == "path"


def rows(x: torch.Tensor, y: torch.Tensor) -> Counter[bytes]:
    """The split's samples with their labels, as a multiset of byte strings."""
    return Counter(a.numpy().tobytes() + b.numpy().tobytes() for a, b in zip(x, y, strict=True))


VALIDATED_SOURCES: list[dict[str, Any]] = [
    {"source": "digits"},
    {"source": "mnist1d", "num_samples": 200},
    {"source": "synthetic", "task": "images", "num_samples": 300},
    {"source": "npz", "path": "v.npz"},
    {"source": "csv", "path": "v.csv"},
    {"source": "text", "path": "v.txt", "seq_len": 8},
    {"source": "dataset", "name": "u"},
]


@pytest.mark.parametrize("data", VALIDATED_SOURCES, ids=lambda d: str(d["source"]))
def test_a_validation_fraction_is_drawn_from_the_training_split(
    tmp_path: Path, data: dict[str, Any]
) -> None:
    """Deterministic per seed, disjoint from the training and the test split (it is carved
    out of the training split), and the test split unchanged, for every source."""
    features = np.random.default_rng(1).normal(size=(60, 3))
    np.savez(tmp_path / "v.npz", x=features, y=np.arange(60) % 3)
    np.savez(tmp_path / "u.npz", x=features, y=np.arange(60) % 3)
    lines = [f"{a},{b},{c},{i % 3}\n" for i, (a, b, c) in enumerate(features)]
    write(tmp_path / "v.csv", "".join(lines))
    write(tmp_path / "v.txt", "".join(chr(97 + (i * 7) % 26) for i in range(1000)))
    extra = {"header": False} if data["source"] == "csv" else {}
    plain = load(tmp_path, 2, **data, **extra)
    held = load(tmp_path, 2, **data, **extra, validation_fraction=0.25)
    assert held.x_val is not None and held.y_val is not None
    assert torch.equal(held.x_test, plain.x_test) and torch.equal(held.y_test, plain.y_test)
    assert len(held.x_val) == round(len(plain.x_train) * 0.25)
    assert rows(held.x_train, held.y_train) + rows(held.x_val, held.y_val) == rows(
        plain.x_train, plain.y_train
    )
    again = load(tmp_path, 2, **data, **extra, validation_fraction=0.25)
    assert again.x_val is not None and torch.equal(again.x_val, held.x_val)
    other = load(tmp_path, 3, **data, **extra, validation_fraction=0.25)
    assert other.x_val is not None and not torch.equal(other.x_val, held.x_val)
    assert plain.x_val is None


def test_a_validation_fraction_that_leaves_nothing_to_train_on(tmp_path: Path) -> None:
    np.savez(tmp_path / "t.npz", x=np.zeros((3, 2)), y=np.arange(3) % 2)
    with pytest.raises(DataSourceError, match="leaves none to train on") as error:
        load(tmp_path, source="npz", path="t.npz", test_fraction=0.4, validation_fraction=0.9)
    assert error.value.field == "validation_fraction"


def test_npz_validation_arrays_are_the_validation_split(tmp_path: Path) -> None:
    x = np.random.default_rng(0).normal(size=(20, 4))
    np.savez(tmp_path / "d.npz", x=x, y=np.arange(20) % 4, xv=x[:5] + 10, yv=np.arange(5) % 4)
    data = load(tmp_path, source="npz", path="d.npz", x_val_key="xv", y_val_key="yv")
    assert data.x_val is not None and data.y_val is not None
    torch.testing.assert_close(data.x_val, torch.from_numpy(x[:5] + 10).float())
    assert len(data.x_train) + len(data.x_test) == 20 and data.y_val.dtype == torch.int64
    with pytest.raises(DataSourceError, match="no array 'xw'") as error:
        load(tmp_path, source="npz", path="d.npz", x_val_key="xw", y_val_key="yv")
    assert error.value.field == "x_val_key"
    np.savez(tmp_path / "e.npz", x=x, y=np.arange(20) % 4, xv=x[:5, :2], yv=np.arange(5))
    with pytest.raises(DataSourceError, match="samples of shape") as error:
        load(tmp_path, source="npz", path="e.npz", x_val_key="xv", y_val_key="yv")
    assert error.value.field == "x_val_key"
    # An uploaded .npz dataset reads them the same way.
    named = load(tmp_path, source="dataset", name="d", x_val_key="xv", y_val_key="yv")
    assert named.x_val is not None and torch.equal(named.x_val, data.x_val)


def test_csv_and_text_validation_files(tmp_path: Path) -> None:
    write(tmp_path / "t.csv", "a,b,label\n" + "".join(f"{i},{i / 2},{i % 3}\n" for i in range(20)))
    write(tmp_path / "v.csv", "a,b,label\n" + "".join(f"{i},{i / 3},{i % 4}\n" for i in range(6)))
    data = load(tmp_path, source="csv", path="t.csv", val_path="v.csv")
    assert data.x_val is not None and data.y_val is not None
    assert data.x_val.shape == (6, 2) and data.info.num_classes == 4  # its labels count too
    assert len(data.x_train) + len(data.x_test) == 20
    write(tmp_path / "w.csv", "a,label\n1,0\n")
    with pytest.raises(DataSourceError, match="needs the columns of") as error:
        load(tmp_path, source="csv", path="t.csv", val_path="w.csv")
    assert error.value.field == "val_path"
    with pytest.raises(DataSourceError, match="does not exist") as error:
        load(tmp_path, source="csv", path="t.csv", val_path="missing.csv")
    assert error.value.field == "val_path"
    write(tmp_path / "abc.txt", "abcab" * 40)
    write(tmp_path / "val.txt", "abd" * 10)
    text = load(tmp_path, source="text", path="abc.txt", seq_len=8, val_path="val.txt")
    assert text.info.vocabulary == "abcd" and text.x_val is not None
    assert text.x_val.shape == (29 // 8, 8)
    write(tmp_path / "tiny.txt", "ab")
    with pytest.raises(DataSourceError, match="not one window") as error:
        load(tmp_path, source="text", path="abc.txt", seq_len=8, val_path="tiny.txt")
    assert error.value.field == "val_path"


def test_train_batches_shards_concatenate_to_the_global_batch() -> None:
    x, y = torch.arange(50.0).reshape(25, 2), torch.arange(25)
    whole = TrainBatches(x, y, batch_size=6, seed=9)
    ranks = [TrainBatches(x, y, batch_size=6, seed=9, rank=r, world=3) for r in range(3)]
    for _ in range(10):  # crosses two epoch boundaries (4 steps per epoch)
        xb, yb = next(whole)
        parts = [next(rank) for rank in ranks]
        assert all(len(part[1]) == 2 for part in parts)
        assert torch.equal(torch.cat([p[0] for p in parts]), xb)
        assert torch.equal(torch.cat([p[1] for p in parts]), yb)
    with pytest.raises(ValueError, match="multiple of the 4 workers"):
        TrainBatches(x, y, batch_size=6, seed=0, world=4)


def test_train_batches_epochs_reshuffle_and_drop_the_remainder() -> None:
    x, y = torch.arange(10.0).unsqueeze(1), torch.arange(10)
    batches = TrainBatches(x, y, batch_size=3, seed=1)
    assert batches.steps_per_epoch == 3
    epochs = []
    for epoch in range(3):
        assert batches.epoch == epoch
        labels = torch.cat([next(batches)[1] for _ in range(3)])
        assert len(set(labels.tolist())) == 9  # each row at most once, one row left out
        epochs.append(labels.tolist())
    assert epochs[0] != epochs[1] != epochs[2]
    fixed = TrainBatches(x, y, batch_size=3, seed=1, shuffle=False)
    orders = [torch.cat([next(fixed)[1] for _ in range(3)]).tolist() for _ in range(2)]
    assert orders == [list(range(9))] * 2


def test_train_batches_restore_continues_the_sequence() -> None:
    x, y = torch.randn(20, 3), torch.arange(20)
    original = TrainBatches(x, y, batch_size=4, seed=2)
    for _ in range(7):
        next(original)
    state = original.state()
    assert state == {"epoch": 1, "position": 2}
    resumed = TrainBatches(x, y, batch_size=4, seed=2)
    resumed.restore(state)
    for _ in range(8):
        assert torch.equal(next(original)[1], next(resumed)[1])
    with pytest.raises(ValueError, match="5 steps"):
        resumed.restore({"epoch": 0, "position": 5})


def test_eval_batches_cover_the_split_once() -> None:
    x, y = torch.arange(23.0).unsqueeze(1), torch.arange(23)
    batches = list(eval_batches(x, y, batch_size=5))
    assert [len(b[1]) for b in batches] == [5, 5, 5, 5, 3]
    assert torch.equal(torch.cat([b[1] for b in batches]), y)
    assert len(list(eval_batches(x, y, batch_size=5, limit_steps=2))) == 2
