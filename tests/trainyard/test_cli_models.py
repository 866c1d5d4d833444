"""`trainyard export` and `trainyard predict` of run directories, here (the server's jobs:
tests/trainyard/test_models_service.py)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnxruntime
import pytest
from typer.testing import CliRunner

from tests.conftest import TrainedRun
from trainyard.cli import app

runner = CliRunner(env={"COLUMNS": "200"})  # rich wraps at 80 columns in a file


@pytest.mark.parametrize("example", ["digits_mlp", "mnist1d_cnn", "char_gpt"])
def test_predict_a_run_directory(
    trained_runs: dict[str, TrainedRun], tmp_path: Path, example: str
) -> None:
    run = trained_runs[example]
    x = tmp_path / "x.npy"
    np.save(x, run.x_test.numpy())
    scores = tmp_path / "scores.npy"
    done = runner.invoke(
        app,
        ["predict", str(run.run_dir), "--checkpoint", "latest", "-i", str(x), "-o", str(scores)],
    )
    assert done.exit_code == 0, done.output
    assert f"scored {len(run.x_test)} samples with step" in done.output
    np.testing.assert_allclose(np.load(scores), run.scores.numpy(), atol=1e-5, rtol=0)


def test_export_a_run_directory(trained_runs: dict[str, TrainedRun], tmp_path: Path) -> None:
    """The command (both examples' exports: tests/dsl/test_export.py)."""
    run = trained_runs["digits_mlp"]
    onnx_file = tmp_path / "model.onnx"
    done = runner.invoke(
        app, ["export", str(run.run_dir), "--checkpoint", "latest", "-o", str(onnx_file)]
    )
    assert done.exit_code == 0, done.output
    session = onnxruntime.InferenceSession(str(onnx_file), providers=["CPUExecutionProvider"])
    (exported,) = session.run(None, {"x": run.x_test.numpy()})
    np.testing.assert_allclose(exported, run.scores.numpy(), atol=1e-4, rtol=0)
    meta = json.loads((tmp_path / "model.onnx.json").read_text())
    assert meta["input"]["shape"] == ["batch", *run.x_test.shape[1:]]


def test_predict_probabilities_and_errors(
    trained_runs: dict[str, TrainedRun], tmp_path: Path
) -> None:
    run = trained_runs["digits_mlp"]
    x = tmp_path / "x.csv"
    np.savetxt(x, run.x_test.reshape(len(run.x_test), -1).numpy(), delimiter=",")
    out = tmp_path / "p.npy"
    done = runner.invoke(
        app, ["predict", str(run.run_dir), "-i", str(x), "-o", str(out), "--probabilities"]
    )
    assert done.exit_code == 0, done.output
    np.testing.assert_allclose(np.load(out).sum(1), 1.0, atol=1e-5)
    done = runner.invoke(
        app, ["predict", str(run.run_dir), "-i", str(x), "-o", str(out), "--checkpoint", "3"]
    )
    assert done.exit_code == 1 and "no checkpoint at step 3" in done.output
    done = runner.invoke(app, ["export", str(run.run_dir), "-f", "tflite", "-o", "m"])
    assert done.exit_code == 2 and "say onnx or torch-export" in done.output
