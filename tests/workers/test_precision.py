"""The job's `precision` in the trainer: bf16 autocast on a CPU, fp16's refusal there, and the
loss scale's state (fp16 itself needs a GPU; its scaler's arithmetic is tested in
test_updaters.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from contract.stream import MetricRecord
from tests.conftest import compile_with_data
from workers.checkpoint import load_checkpoint, resolve_checkpoint
from workers.precision import Precision, PrecisionError, precision_for
from workers.trainer import Summary, Trainer, TrainOptions


def mlp_job(**top: Any) -> dict[str, Any]:
    """A digits MLP with momentum (updater state in the checkpoint); `top` adds top-level keys."""
    return {
        "name": "precision-mlp",
        "seed": 5,
        "data": {"source": "digits", "batch_size": 32},
        "neuralnet": {
            "layers": [
                {"name": "data", "type": "input"},
                {"name": "fc1", "type": "dense", "srclayers": ["data"], "units": 32},
                {"name": "relu1", "type": "relu", "srclayers": ["fc1"]},
                {"name": "fc2", "type": "dense", "srclayers": ["relu1"], "units": 10},
                {"name": "loss", "type": "softmax_loss", "srclayers": ["fc2"]},
            ]
        },
        "updater": {"type": "sgd", "momentum": 0.9, "lr": {"base": 0.05}},
        "train_steps": 40,
        "disp_freq": 10,
        "checkpoint": {"freq": 0, "keep": 1},
        **top,
    }


class Lines:
    """A metric sink that keeps the log lines."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def emit(self, record: MetricRecord) -> None:
        return None

    def log(self, line: str) -> None:
        self.lines.append(line)

    def checkpoint(self, step: int, path: Path, *, best: bool = False) -> None:
        return None

    def close(self) -> None:
        return None


def trainer_for(document: dict[str, Any], run_dir: Path, cache_dir: Path) -> Trainer:
    job, data = compile_with_data(document, cache_dir=cache_dir)
    return Trainer(job, data, TrainOptions(run_dir=run_dir), sinks=[Lines()])


def train(document: dict[str, Any], run_dir: Path, cache_dir: Path) -> tuple[Summary, Trainer]:
    trainer = trainer_for(document, run_dir, cache_dir)
    return trainer.run(), trainer


def test_bf16_trains_like_fp32_and_keeps_everything_saved_in_fp32(
    tmp_path: Path, cache_dir: Path
) -> None:
    full, _ = train(mlp_job(), tmp_path / "fp32", cache_dir)
    half, trainer = train(mlp_job(precision="bf16"), tmp_path / "bf16", cache_dir)
    assert full.status == half.status == "succeeded"
    for key in ("train/loss", "test/loss", "test/accuracy"):
        assert half.metrics[key] == pytest.approx(full.metrics[key], abs=0.02), key
    # The forward did run in bf16: the two runs are close, not equal.
    a = load_checkpoint(resolve_checkpoint(tmp_path / "fp32")).params
    b = load_checkpoint(resolve_checkpoint(tmp_path / "bf16"))
    assert a.keys() == b.params.keys()
    assert not all(torch.equal(a[k], b.params[k]) for k in a)
    assert all(torch.allclose(a[k], b.params[k], atol=0.05) for k in a)
    assert all(p.dtype == torch.float32 for p in trainer.net.parameters())
    saved = {**b.params, **b.updater}
    assert saved and all(t.dtype == torch.float32 for t in saved.values())
    with trainer.precision.autocast():
        assert trainer.net.layers["fc1"](torch.ones(2, 1, 8, 8)).dtype == torch.bfloat16


def test_fp16_on_a_cpu_is_refused_by_the_trainer(tmp_path: Path, cache_dir: Path) -> None:
    # Valid: the job asks for a GPU; the worker that builds it has only a CPU.
    job = mlp_job(precision="fp16", cluster={"resources": {"gpus_per_worker": 1}})
    with pytest.raises(PrecisionError, match=r"precision fp16 is for GPUs.*trains on cpu"):
        trainer_for(job, tmp_path, cache_dir)
    with pytest.raises(PrecisionError, match="use precision bf16"):
        precision_for("fp16", torch.device("cpu"))


def test_fp32_and_bf16_have_no_loss_scale() -> None:
    cpu = torch.device("cpu")
    assert precision_for("fp32", cpu) == Precision("cpu", None, None)
    assert precision_for("bf16", cpu) == Precision("cpu", torch.bfloat16, None)
    assert precision_for("bf16", cpu).state() == {}


def test_the_loss_scale_goes_into_the_checkpoint_metadata_and_back() -> None:
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    saved = Precision("cpu", torch.float16, scaler)
    param = torch.nn.Parameter(torch.ones(2))
    saved.backward((param * torch.tensor([1.0, float("inf")])).sum())
    scaler.unscale_(torch.optim.SGD([param], lr=0.1))
    scaler.update()  # an overflow halves the scale
    meta = saved.state()
    assert meta == {"loss_scale": "512.0", "loss_scale_growth": "0"}
    restored = Precision("cpu", torch.float16, torch.amp.GradScaler("cpu"))
    restored.load_state(meta)
    assert restored.scaler is not None and restored.scaler.get_scale() == 512.0
