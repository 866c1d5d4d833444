"""The local trainer: metrics, evaluation, checkpoints, reproducibility, resume and init_from.

Jobs are tiny (8x8 digits, tens of steps) so every run takes well under a second.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from contract.stream import MetricRecord
from tests.conftest import compile_with_data
from workers.checkpoint import (
    CheckpointError,
    load_checkpoint,
    resolve_checkpoint,
    save_checkpoint,
)
from workers.metrics import JsonlSink, read_metrics
from workers.trainer import Summary, Trainer, TrainOptions

# Wall-clock fields: the only ones two runs of the same job may disagree on.
CLOCK_KEYS = ("time", "samples_per_sec")


def mlp_job() -> dict[str, Any]:
    """Digits MLP with dropout (draws from the global RNG) and momentum (updater state)."""
    return {
        "name": "tiny-mlp",
        "seed": 3,
        "data": {"source": "digits", "batch_size": 32},
        "neuralnet": {
            "layers": [
                {"name": "data", "type": "input"},
                {"name": "fc1", "type": "dense", "srclayers": ["data"], "units": 32},
                {"name": "relu1", "type": "relu", "srclayers": ["fc1"]},
                {"name": "drop1", "type": "dropout", "srclayers": ["relu1"], "ratio": 0.2},
                {"name": "fc2", "type": "dense", "srclayers": ["drop1"], "units": 10},
                {"name": "loss", "type": "softmax_loss", "srclayers": ["fc2"]},
            ]
        },
        "updater": {
            "type": "sgd",
            "momentum": 0.9,
            "lr": {"base": 0.05, "schedule": "step", "gamma": 0.5, "freq": 20},
        },
        "train_steps": 60,
        "disp_freq": 10,
        "test": {"freq": 30},
        "checkpoint": {"freq": 20, "keep": 2},
    }


def rbm_job(hidden: int = 24) -> dict[str, Any]:
    return {
        "name": "tiny-rbm",
        "seed": 1,
        "data": {"source": "digits", "batch_size": 32},
        "neuralnet": {
            "layers": [
                {"name": "data", "type": "input"},
                {
                    "name": "rbm1",
                    "type": "rbm",
                    "srclayers": ["data"],
                    "hidden": hidden,
                    "visible": "binary",
                    "param": {"w": {"init": "gaussian", "std": 0.01}},
                },
            ]
        },
        "train_one_batch": {"alg": "cd", "k": 1},
        "updater": {"type": "sgd", "momentum": 0.5, "lr": {"base": 0.05, "schedule": "fixed"}},
        "train_steps": 60,
        "disp_freq": 10,
        "test": {"freq": 30},
        "checkpoint": {"freq": 20, "keep": 2},
    }


def autoencoder_job(init_from: str, hidden: int = 24) -> dict[str, Any]:
    return {
        "name": "tiny-autoencoder",
        "seed": 2,
        "data": {"source": "digits", "batch_size": 32},
        "neuralnet": {
            "layers": [
                {"name": "data", "type": "input"},
                {
                    "name": "rbm1",
                    "type": "rbm",
                    "srclayers": ["data"],
                    "hidden": hidden,
                    "visible": "binary",
                },
                {"name": "dec1", "type": "dense", "srclayers": ["rbm1"], "units": 64},
                {"name": "out", "type": "sigmoid", "srclayers": ["dec1"]},
                {"name": "flat", "type": "flatten", "srclayers": ["data"]},
                {"name": "loss", "type": "euclidean_loss", "srclayers": ["out", "flat"]},
            ]
        },
        "updater": {"type": "adam", "lr": {"base": 0.003, "schedule": "fixed"}},
        "train_steps": 20,
        "disp_freq": 10,
        "checkpoint": {"freq": 0, "keep": 1, "init_from": init_from},
    }


class Recorder:
    """A metric sink that keeps everything it is given."""

    def __init__(self) -> None:
        self.records: list[MetricRecord] = []
        self.lines: list[str] = []
        self.checkpoints: list[int] = []

    def emit(self, record: MetricRecord) -> None:
        self.records.append(record)

    def log(self, line: str) -> None:
        self.lines.append(line)

    def checkpoint(self, step: int, path: Path, *, best: bool = False) -> None:
        self.checkpoints.append(step)

    def close(self) -> None:
        return None


def make_trainer(
    document: dict[str, Any],
    run_dir: Path,
    cache_dir: Path,
    *,
    overrides: dict[str, Any] | None = None,
    resume: bool = False,
    base_dir: Path | None = None,
    should_stop: Callable[[], bool] = lambda: False,
) -> tuple[Trainer, Recorder, JsonlSink]:
    job, data = compile_with_data(document, cache_dir=cache_dir, overrides=overrides)
    recorder, sink = Recorder(), JsonlSink(run_dir)
    options = TrainOptions(
        run_dir=run_dir,
        resume=resume,
        base_dir=base_dir or run_dir,
        should_stop=should_stop,
    )
    return Trainer(job, data, options, sinks=[sink, recorder]), recorder, sink


def train(
    document: dict[str, Any], run_dir: Path, cache_dir: Path, **kwargs: Any
) -> tuple[Summary, Recorder]:
    trainer, recorder, sink = make_trainer(document, run_dir, cache_dir, **kwargs)
    try:
        return trainer.run(), recorder
    finally:
        sink.close()


def final_params(run_dir: Path) -> dict[str, torch.Tensor]:
    return load_checkpoint(resolve_checkpoint(run_dir)).params


def without_clock(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in r.items() if k not in CLOCK_KEYS} for r in records]


def test_metrics_every_disp_freq_and_tests_every_test_freq(tmp_path: Path, cache_dir: Path) -> None:
    summary, _ = train(mlp_job(), tmp_path, cache_dir)
    records = read_metrics(tmp_path)
    train_records = [r for r in records if "train/loss" in r]
    test_records = [r for r in records if "test/loss" in r]
    assert [r["step"] for r in train_records] == [10, 20, 30, 40, 50, 60]
    for record in train_records:
        assert {"train/loss", "train/accuracy", "lr", "samples_per_sec"} <= record.keys()
        assert 0.0 <= record["train/accuracy"] <= 1.0 and record["samples_per_sec"] > 0
    # The step schedule halves the rate every 20 steps; lr is the rate of the step just taken.
    assert [r["lr"] for r in train_records] == pytest.approx(
        [0.05, 0.05, 0.025, 0.025, 0.0125, 0.0125]
    )
    # Every test.freq steps, and once at the end (not twice when they coincide).
    assert [r["step"] for r in test_records] == [30, 60]
    assert all({"test/loss", "test/accuracy"} <= r.keys() for r in test_records)
    assert train_records[-1]["train/loss"] < train_records[0]["train/loss"]
    assert test_records[-1]["test/accuracy"] > 0.5

    assert summary.status == "succeeded" and summary.steps == 60
    saved = json.loads((tmp_path / "summary.json").read_text())
    assert saved["status"] == "succeeded" and saved["steps"] == 60 and saved["wall_time"] > 0
    assert saved["metrics"]["test/accuracy"] == pytest.approx(test_records[-1]["test/accuracy"])
    assert saved["metrics"]["train/loss"] == pytest.approx(train_records[-1]["train/loss"])
    assert saved["checkpoint"] == str(tmp_path / "checkpoints" / "step-00000060.safetensors")


def test_checkpoints_every_freq_keep_only_the_newest(tmp_path: Path, cache_dir: Path) -> None:
    _, recorder = train(mlp_job(), tmp_path, cache_dir)
    # Saved at 20, 40 and 60 (the last doubles as the final checkpoint, written once).
    assert recorder.checkpoints == [20, 40, 60]
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == [
        "step-00000040.safetensors",
        "step-00000060.safetensors",
    ]
    assert not list(tmp_path.rglob("*.tmp"))
    ckpt = load_checkpoint(resolve_checkpoint(tmp_path))
    assert ckpt.step == 60
    assert set(ckpt.params) == {"fc1/w", "fc1/b", "fc2/w", "fc2/b"}
    assert {"fc1/w/momentum_buffer", "fc2/b/momentum_buffer"} <= set(ckpt.updater)
    assert {"train", "global"} <= set(ckpt.rng)


def test_final_checkpoint_without_a_freq(tmp_path: Path, cache_dir: Path) -> None:
    job = mlp_job()
    job["checkpoint"] = {"freq": 0, "keep": 1}
    job["test"] = {"freq": 0}
    _, recorder = train(job, tmp_path, cache_dir, overrides={"train_steps": 15})
    assert recorder.checkpoints == [15]
    assert [r.step for r in recorder.records if "test/loss" in r.values] == [15]
    # The last, shorter display window is reported at the end too.
    assert [r.step for r in recorder.records if "train/loss" in r.values] == [10, 15]


@pytest.mark.parametrize("job", [mlp_job, rbm_job], ids=["bp-dropout", "cd"])
def test_same_seed_same_run(
    job: Callable[[], dict[str, Any]], tmp_path: Path, cache_dir: Path
) -> None:
    train(job(), tmp_path / "a", cache_dir)
    train(job(), tmp_path / "b", cache_dir)
    first, second = read_metrics(tmp_path / "a"), read_metrics(tmp_path / "b")
    assert len(first) == len(second) > 0
    assert without_clock(first) == without_clock(second)
    a, b = final_params(tmp_path / "a"), final_params(tmp_path / "b")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)

    other = job()
    other["seed"] += 1
    train(other, tmp_path / "c", cache_dir)
    c = final_params(tmp_path / "c")
    assert not all(torch.equal(a[k], c[k]) for k in a)


@pytest.mark.parametrize("job", [mlp_job, rbm_job], ids=["bp-dropout", "cd"])
def test_resume_ends_where_an_uninterrupted_run_ends(
    job: Callable[[], dict[str, Any]], tmp_path: Path, cache_dir: Path
) -> None:
    train(job(), tmp_path / "whole", cache_dir)
    # Interrupted after 25 steps (between checkpoints, mid-epoch: 44 batches an epoch), then
    # resumed with the full 60; the run crosses into the second epoch after resuming.
    part = tmp_path / "parts"
    first, _ = train(job(), part, cache_dir, overrides={"train_steps": 25})
    assert first.steps == 25
    second, recorder = train(job(), part, cache_dir, resume=True)
    assert second.status == "succeeded" and second.steps == 60
    assert "resumed from step-00000025.safetensors at step 25" in recorder.lines
    assert [r.step for r in recorder.records if "train/loss" in r.values] == [30, 40, 50, 60]
    whole, resumed = final_params(tmp_path / "whole"), final_params(part)
    assert whole.keys() == resumed.keys()
    assert all(torch.equal(whole[k], resumed[k]) for k in whole)
    # The resumed run appended to the same metrics.jsonl.
    assert [r["step"] for r in read_metrics(part) if "train/loss" in r][-1] == 60


def test_a_generator_state_from_another_device_is_not_loaded(
    tmp_path: Path, cache_dir: Path
) -> None:
    """A CUDA job's checkpoint held its generator's 16-byte state under "train", which a CPU
    generator (5,056 bytes) refused: the run resumes with the seed's generator instead."""
    train(mlp_job(), tmp_path, cache_dir, overrides={"train_steps": 20})
    where = resolve_checkpoint(tmp_path)
    saved = load_checkpoint(where)
    saved.rng["train"] = torch.zeros(16, dtype=torch.uint8)  # a Philox state, as on cuda
    save_checkpoint(where.parent, saved, keep=5)
    second, recorder = train(mlp_job(), tmp_path, cache_dir, resume=True)
    assert second.status == "succeeded" and second.steps == 60
    assert any("training generator was on another device" in line for line in recorder.lines)


def test_resume_without_a_checkpoint_starts_from_zero(tmp_path: Path, cache_dir: Path) -> None:
    summary, recorder = train(mlp_job(), tmp_path, cache_dir, resume=True)
    assert summary.steps == 60
    assert "resume: no checkpoint yet, starting from step 0" in recorder.lines


def test_evaluation_does_not_change_training(tmp_path: Path, cache_dir: Path) -> None:
    # cd evaluation samples the rbm too; it must not draw from the training stream.
    often = rbm_job()
    often["test"] = {"freq": 5}
    never = rbm_job()
    never["test"] = {"freq": 0}
    first, _ = train(often, tmp_path / "often", cache_dir)
    second, _ = train(never, tmp_path / "never", cache_dir)
    a, b = final_params(tmp_path / "often"), final_params(tmp_path / "never")
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert first.metrics["test/recon_error"] == second.metrics["test/recon_error"]


def test_init_from_loads_parameters_by_name(tmp_path: Path, cache_dir: Path) -> None:
    train(rbm_job(), tmp_path / "rbm", cache_dir)
    pretrained = final_params(tmp_path / "rbm")
    assert set(pretrained) == {"rbm1/w", "rbm1/hb", "rbm1/vb"}
    # A relative init_from resolves against the job file's folder (base_dir).
    (tmp_path / "jobs").mkdir()
    trainer, recorder, sink = make_trainer(
        autoencoder_job("../rbm"), tmp_path / "ae", cache_dir, base_dir=tmp_path / "jobs"
    )
    trainer.restore()
    sink.close()
    assert recorder.lines == [
        f"initialised 3 parameters from {tmp_path / 'jobs' / '../rbm'}: rbm1/w, rbm1/hb, rbm1/vb"
    ]
    params = trainer.net.named_params()
    assert all(torch.equal(params[name].detach(), value) for name, value in pretrained.items())
    assert trainer.step == 0  # init_from starts a new run; it does not resume one

    summary, _ = train(autoencoder_job(str(tmp_path / "rbm")), tmp_path / "ae2", cache_dir)
    assert summary.status == "succeeded"
    losses = [r["train/loss"] for r in read_metrics(tmp_path / "ae2") if "train/loss" in r]
    assert losses[-1] < losses[0]


def test_init_from_problems_are_checkpoint_errors(tmp_path: Path, cache_dir: Path) -> None:
    train(rbm_job(hidden=24), tmp_path / "rbm", cache_dir)
    trainer, _, sink = make_trainer(
        autoencoder_job(str(tmp_path / "rbm"), hidden=16), tmp_path / "ae", cache_dir
    )
    sink.close()
    with pytest.raises(CheckpointError, match=r"checkpoint\.init_from: parameter rbm1/w: .*\[24,"):
        trainer.run()
    trainer, _, sink = make_trainer(
        autoencoder_job(str(tmp_path / "missing")), tmp_path / "ae", cache_dir
    )
    sink.close()
    with pytest.raises(CheckpointError, match=r"checkpoint\.init_from: no checkpoint found"):
        trainer.run()


def test_divergence_stops_the_run_as_diverged(tmp_path: Path, cache_dir: Path) -> None:
    job = copy.deepcopy(mlp_job())
    job["updater"] = {"type": "sgd", "lr": {"base": 1.0e20, "schedule": "fixed"}}
    summary, recorder = train(job, tmp_path, cache_dir)
    assert summary.status == "diverged" and summary.steps == 10  # noticed at the first report
    assert recorder.lines == ["step 10: training diverged (loss nan)"]
    assert recorder.checkpoints == []
    # Strict JSON (no NaN token), so any reader can parse it; the loss is null.
    text = (tmp_path / "summary.json").read_text()
    saved = json.loads(text, parse_constant=lambda token: pytest.fail(f"{token} in JSON"))
    assert saved["status"] == "diverged" and saved["metrics"]["train/loss"] is None


def test_should_stop_cancels_between_steps(tmp_path: Path, cache_dir: Path) -> None:
    calls = iter(range(1000))
    summary, _ = train(mlp_job(), tmp_path, cache_dir, should_stop=lambda: next(calls) >= 12)
    assert summary.status == "cancelled" and summary.steps == 12
    assert json.loads((tmp_path / "summary.json").read_text())["status"] == "cancelled"
