"""Checkpoint files: round trip, atomic writes, retention, lookup and loading into a net."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import workers.checkpoint as checkpoint_module
from workers.checkpoint import (
    Checkpoint,
    CheckpointError,
    CheckpointWriteError,
    checkpoint_path,
    list_checkpoints,
    load_checkpoint,
    load_matching_params,
    resolve_checkpoint,
    save_checkpoint,
    write_json_atomic,
)


def make_checkpoint(step: int, scale: float = 1.0) -> Checkpoint:
    return Checkpoint(
        step=step,
        params={"fc1/w": torch.full((3, 2), scale), "fc1/b": torch.arange(3.0)},
        buffers={"bn/running_mean": torch.ones(4)},
        updater={"fc1/w/momentum_buffer": torch.full((3, 2), 0.5), "fc1/w/step": torch.tensor(7)},
        rng={"train": torch.Generator().manual_seed(3).get_state()},
        meta={"job": "demo", "epoch": "1", "position": "2"},
    )


def test_round_trip_keeps_every_group(tmp_path: Path) -> None:
    original = make_checkpoint(12, scale=2.5)
    path = save_checkpoint(tmp_path, original, keep=3)
    assert path == checkpoint_path(tmp_path, 12) == tmp_path / "step-00000012.safetensors"
    loaded = load_checkpoint(path)
    assert loaded.step == 12
    for group in ("params", "buffers", "updater", "rng"):
        want, got = getattr(original, group), getattr(loaded, group)
        assert want.keys() == got.keys()
        assert all(torch.equal(want[k], got[k]) for k in want)
    assert loaded.meta["job"] == "demo" and loaded.meta["position"] == "2"
    assert loaded.meta["format"] == "trainyard-1"
    # Plain safetensors: any reader sees the prefixed tensor names, nothing pickled.
    assert set(load_file(str(path))) == {
        "param/fc1/w",
        "param/fc1/b",
        "buffer/bn/running_mean",
        "updater/fc1/w/momentum_buffer",
        "updater/fc1/w/step",
        "rng/train",
    }


def test_restored_generator_state_continues_the_same_stream(tmp_path: Path) -> None:
    gen = torch.Generator().manual_seed(9)
    torch.rand(5, generator=gen)
    ckpt = Checkpoint(step=1, params={}, rng={"train": gen.get_state()})
    expected = torch.rand(5, generator=gen)
    restored = torch.Generator()
    restored.set_state(load_checkpoint(save_checkpoint(tmp_path, ckpt, keep=1)).rng["train"])
    assert torch.equal(torch.rand(5, generator=restored), expected)


def test_writes_leave_no_temporary_file_and_keep_the_newest(tmp_path: Path) -> None:
    for step in (10, 20, 30, 40, 50):
        save_checkpoint(tmp_path, make_checkpoint(step), keep=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "step-00000040.safetensors",
        "step-00000050.safetensors",
    ]


def test_steps_sort_numerically_past_eight_digits(tmp_path: Path) -> None:
    save_checkpoint(tmp_path, make_checkpoint(99_999_999), keep=5)
    save_checkpoint(tmp_path, make_checkpoint(100_000_000), keep=5)
    assert [step for step, _ in list_checkpoints(tmp_path)] == [99_999_999, 100_000_000]
    assert resolve_checkpoint(tmp_path).name == "step-100000000.safetensors"


def test_a_failed_write_leaves_the_previous_checkpoint_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    save_checkpoint(tmp_path, make_checkpoint(10, scale=1.0), keep=3)

    def crash_midway(tensors: dict[str, torch.Tensor], filename: str, metadata: object) -> None:
        Path(filename).write_bytes(b"half a header")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(checkpoint_module, "save_file", crash_midway)
    with pytest.raises(OSError, match="No space"):
        save_checkpoint(tmp_path, make_checkpoint(20, scale=9.0), keep=3)
    assert [p.name for p in tmp_path.iterdir()] == ["step-00000010.safetensors"]
    latest = load_checkpoint(resolve_checkpoint(tmp_path))
    assert latest.step == 10 and torch.equal(latest.params["fc1/w"], torch.ones(3, 2))


def test_resolve_finds_the_newest_in_a_run_dir_or_checkpoint_dir(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    ckpt_dir = run_dir / "checkpoints"
    for step in (5, 15, 10):
        save_checkpoint(ckpt_dir, make_checkpoint(step), keep=5)
    (ckpt_dir / "notes.txt").write_text("not a checkpoint")
    newest = ckpt_dir / "step-00000015.safetensors"
    assert resolve_checkpoint(run_dir) == newest
    assert resolve_checkpoint(ckpt_dir) == newest
    single = ckpt_dir / "step-00000005.safetensors"
    assert resolve_checkpoint(single) == single
    empty = tmp_path / "empty"
    empty.mkdir()
    for missing in (empty, tmp_path / "nowhere"):
        with pytest.raises(CheckpointError, match="no checkpoint found"):
            resolve_checkpoint(missing)


@pytest.mark.parametrize(
    "content",
    [b"", b"not a safetensors file at all", b"\xff" * 8 + b"{}"],
    ids=["empty", "text", "bad-header"],
)
def test_unreadable_files_raise_checkpoint_error(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "step-00000001.safetensors"
    path.write_bytes(content)
    with pytest.raises(CheckpointError, match="cannot read checkpoint"):
        load_checkpoint(path)


def test_truncated_and_missing_files_raise_checkpoint_error(tmp_path: Path) -> None:
    path = save_checkpoint(tmp_path, make_checkpoint(3), keep=1)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="cannot read checkpoint"):
        load_checkpoint(path)
    with pytest.raises(CheckpointError, match="cannot read checkpoint"):
        load_checkpoint(tmp_path / "absent.safetensors")


def test_matching_params_load_by_name_and_skip_others() -> None:
    ckpt = make_checkpoint(1, scale=4.0)
    ckpt.params["other/w"] = torch.zeros(2)
    net = {
        "fc1/w": torch.nn.Parameter(torch.zeros(3, 2)),
        "fc2/w": torch.nn.Parameter(torch.zeros(5)),
    }
    assert load_matching_params(net, ckpt) == ["fc1/w"]
    assert torch.equal(net["fc1/w"].detach(), torch.full((3, 2), 4.0))
    assert torch.equal(net["fc2/w"].detach(), torch.zeros(5))


def test_a_shape_mismatch_is_an_error_naming_the_parameter() -> None:
    net = {"fc1/w": torch.nn.Parameter(torch.zeros(2, 3))}
    with pytest.raises(CheckpointError, match=r"fc1/w: checkpoint has shape \[3, 2\], the net"):
        load_matching_params(net, make_checkpoint(1))


def test_write_json_atomic(tmp_path: Path) -> None:
    target = tmp_path / "summary.json"
    write_json_atomic(target, {"status": "succeeded", "steps": 3})
    write_json_atomic(target, {"status": "failed", "steps": 4})
    assert json.loads(target.read_text()) == {"status": "failed", "steps": 4}
    assert [p.name for p in tmp_path.iterdir()] == ["summary.json"]


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 64 KiB tmpfs: a real file system that fills up (needs root, as in CI)."""
    where = tmp_path / "disk"
    where.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(where)], capture_output=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", str(where)], check=True)


def test_a_full_disk_is_a_clear_error_and_the_earlier_checkpoint_stays(small_disk: Path) -> None:
    save_checkpoint(small_disk, make_checkpoint(10), keep=3)
    big = make_checkpoint(20)
    big.params["fc1/w"] = torch.zeros(64, 1024)  # 256 KiB: more than the disk holds
    with pytest.raises(CheckpointWriteError) as caught:
        save_checkpoint(small_disk, big, keep=3)
    assert str(caught.value) == (
        f"cannot write checkpoint step-00000020.safetensors to {small_disk}: No space left on "
        "device; the earlier checkpoints are unchanged"
    )
    assert [p.name for p in small_disk.iterdir()] == ["step-00000010.safetensors"]
    assert load_checkpoint(resolve_checkpoint(small_disk)).step == 10
