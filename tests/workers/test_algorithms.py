"""The train_one_batch algorithms: truncated bptt (per-step and per-sequence labels) and cd."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from contract.stream import MetricRecord
from dsl.compiler import CompiledJob
from dsl.schema import BPTTConfig
from tests.conftest import compile_with_data
from workers.algorithms import ALGORITHMS, BatchResult, bptt
from workers.data import Dataset
from workers.precision import Precision
from workers.trainer import Trainer, TrainOptions

Grads = dict[str, torch.Tensor]


def char_lstm_job() -> dict[str, Any]:
    """Per-step labels: predict every next character of 24-character windows."""
    return {
        "name": "char-lstm",
        "seed": 0,
        "data": {"source": "text", "seq_len": 24, "batch_size": 16},
        "neuralnet": {
            "layers": [
                {"name": "data", "type": "input"},
                {"name": "embed", "type": "embedding", "srclayers": ["data"], "dim": 8},
                {
                    "name": "lstm1",
                    "type": "lstm",
                    "srclayers": ["embed"],
                    "hidden": 16,
                    "output": "sequence",
                },
                {"name": "fc1", "type": "dense", "srclayers": ["lstm1"], "axis": 2},
                {"name": "loss", "type": "softmax_loss", "srclayers": ["fc1"]},
            ]
        },
        "train_one_batch": {"alg": "bptt", "unroll_len": 10},
        "updater": {"type": "adam", "lr": {"base": 0.01, "schedule": "fixed"}},
        "train_steps": 60,
        "disp_freq": 20,
        "test": {"steps": 4},
    }


def adding_gru_job() -> dict[str, Any]:
    """Per-sequence labels: the adding problem, one regression target per 20-step sequence."""
    return {
        "name": "adding-gru",
        "seed": 0,
        "data": {"source": "synthetic", "task": "sequence", "seq_len": 20, "batch_size": 32},
        "neuralnet": {
            "layers": [
                {"name": "data", "type": "input"},
                {
                    "name": "gru1",
                    "type": "gru",
                    "srclayers": ["data"],
                    "hidden": 16,
                    "output": "last",
                },
                {"name": "fc1", "type": "dense", "srclayers": ["gru1"], "units": 1},
                {"name": "loss", "type": "euclidean_loss", "srclayers": ["fc1"]},
            ]
        },
        "train_one_batch": {"alg": "bptt", "unroll_len": 5},
        "updater": {"type": "adam", "lr": {"base": 0.01, "schedule": "fixed"}},
        "train_steps": 100,
        "disp_freq": 20,
    }


@pytest.fixture(scope="module")
def char_lstm(cache_dir: Path) -> tuple[CompiledJob, Dataset]:
    return compile_with_data(char_lstm_job(), cache_dir=cache_dir)


@pytest.fixture(scope="module")
def adding_gru(cache_dir: Path) -> tuple[CompiledJob, Dataset]:
    return compile_with_data(adding_gru_job(), cache_dir=cache_dir)


def bptt_grads(
    job: CompiledJob, x: torch.Tensor, y: torch.Tensor, unroll_len: int
) -> tuple[BatchResult, Grads]:
    spec = job.spec.model_copy(
        update={"train_one_batch": BPTTConfig(alg="bptt", unroll_len=unroll_len)}
    )
    job.net.zero_grad(set_to_none=True)
    result = bptt(job.net, x, y, spec, torch.Generator(), Precision())
    return result, grads_of(job)


def grads_of(job: CompiledJob) -> Grads:
    grads = {}
    for name, param in job.net.named_params().items():
        assert param.grad is not None, f"{name} got no gradient"
        grads[name] = param.grad.clone()
    return grads


def close(a: Grads, b: Grads, names: list[str]) -> bool:
    return all(torch.allclose(a[n], b[n], rtol=1e-4, atol=1e-7) for n in names)


def test_bptt_is_registered_with_bp_and_cd() -> None:
    assert ALGORITHMS.names() == ["bp", "bptt", "cd"]


def test_per_step_labels_every_chunk_contributes(char_lstm: tuple[CompiledJob, Dataset]) -> None:
    job, data = char_lstm
    x, y = data.x_train[:16], data.y_train[:16]  # (B, 24) ids, (B, 24) next ids
    assert y.shape == x.shape
    full, g_full = bptt_grads(job, x, y, unroll_len=0)
    whole, g_whole = bptt_grads(job, x, y, unroll_len=24)
    chunked, g_chunked = bptt_grads(job, x, y, unroll_len=10)  # chunks of 10, 10, 4 steps
    assert torch.equal(full.loss, whole.loss) and close(g_full, g_whole, list(g_full))
    # The state is carried across chunks, so the forward pass and the length-weighted loss
    # are those of the whole sequence ...
    assert chunked.loss.item() == pytest.approx(full.loss.item(), rel=1e-5)
    assert chunked.metrics["accuracy"].item() == pytest.approx(full.metrics["accuracy"].item())
    # ... and so is the output layer's gradient, which needs no path back through time.
    assert close(g_chunked, g_full, ["fc1/w", "fc1/b"])
    # The recurrent weights and the embedding lose the paths cut at chunk borders.
    recurrent = [n for n in g_full if n.startswith(("lstm1/", "embed/"))]
    assert recurrent and not close(g_chunked, g_full, recurrent)


def test_per_sequence_label_earlier_chunks_only_advance_the_state(
    adding_gru: tuple[CompiledJob, Dataset],
) -> None:
    job, data = adding_gru
    net = job.net
    x, y = data.x_train[:32], data.y_train[:32]  # (B, 20, 2), (B, 1)
    full, g_full = bptt_grads(job, x, y, unroll_len=0)
    chunked, g_chunked = bptt_grads(job, x, y, unroll_len=5)
    # Only the last chunk meets the label, but it starts from the state the first 15 steps
    # left behind: the loss is the whole sequence's.
    assert chunked.loss.item() == pytest.approx(full.loss.item(), rel=1e-5)
    assert close(g_chunked, g_full, ["fc1/w", "fc1/b"])
    gru = [n for n in g_full if n.startswith("gru1/")]
    assert not close(g_chunked, g_full, gru)

    # The same gradient, written out: no graph through steps 0-14, backprop through 15-19.
    net.zero_grad(set_to_none=True)
    net.reset_state()
    with torch.no_grad():
        net(x[:, :15], None, "train")
    net.detach_state()
    out = net(x[:, 15:], y, "train")
    assert out.loss is not None
    out.loss.backward()
    assert close(g_chunked, grads_of(job), list(g_full))


class Recorder:
    def __init__(self) -> None:
        self.records: list[MetricRecord] = []

    def emit(self, record: MetricRecord) -> None:
        self.records.append(record)

    def log(self, line: str) -> None:
        return None

    def checkpoint(self, step: int, path: Path, *, best: bool = False) -> None:
        return None

    def close(self) -> None:
        return None

    def series(self, key: str) -> list[float]:
        return [r.values[key] for r in self.records if key in r.values]


def train(document: dict[str, Any], run_dir: Path, cache_dir: Path) -> tuple[Trainer, Recorder]:
    job, data = compile_with_data(document, cache_dir=cache_dir)
    recorder = Recorder()
    trainer = Trainer(job, data, TrainOptions(run_dir=run_dir), sinks=[recorder])
    return trainer, recorder


@pytest.mark.parametrize("document", [char_lstm_job, adding_gru_job], ids=["per-step", "per-seq"])
def test_truncated_bptt_trains(document: Any, tmp_path: Path, cache_dir: Path) -> None:
    trainer, recorder = train(document(), tmp_path, cache_dir)
    before = trainer.evaluate()["test/loss"]
    assert trainer.run().status == "succeeded"
    losses = recorder.series("train/loss")
    assert losses[-1] < 0.8 * losses[0]
    assert recorder.series("test/loss")[-1] < 0.8 * before


def test_cd_reports_a_falling_reconstruction_error(tmp_path: Path, cache_dir: Path) -> None:
    document = {
        "name": "rbm",
        "seed": 0,
        "data": {"source": "digits", "batch_size": 32},
        "neuralnet": {
            "layers": [
                {"name": "data", "type": "input"},
                {"name": "rbm1", "type": "rbm", "srclayers": ["data"], "hidden": 32},
            ]
        },
        "train_one_batch": {"alg": "cd", "k": 1},
        "updater": {"type": "sgd", "momentum": 0.5, "lr": {"base": 0.05, "schedule": "fixed"}},
        "train_steps": 150,
        "disp_freq": 30,
        "test": {"freq": 75},
    }
    trainer, recorder = train(document, tmp_path, cache_dir)
    before = trainer.evaluate()
    assert set(before) == {"test/recon_error"}
    trainer.run()
    recon = recorder.series("train/recon_error")
    # From about 0.18 untrained to about 0.07, most of the fall in the first window.
    assert len(recon) == 5 and recon[-1] < recon[0]
    tested = recorder.series("test/recon_error")
    assert len(tested) == 2 and tested[-1] < 0.5 * before["test/recon_error"]
