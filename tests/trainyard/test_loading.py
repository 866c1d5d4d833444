"""trainyard.load_model and local prediction from run directories and checkpoint files (the
server's jobs: tests/trainyard/test_models_service.py)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

import trainyard
from contract.rundir import CHECKPOINTS, SUMMARY, list_checkpoints
from dsl.plugins import unloaded_after
from tests.conftest import PLUGIN, TrainedRun
from trainyard.loading import ModelError, checkpoint_file, parse_choice, run_dir_checkpoint
from trainyard.predicting import predict_array, predict_file


def test_which_checkpoint_of_a_run_directory(trained_runs: dict[str, TrainedRun]) -> None:
    run = trained_runs["digits_mlp"]
    steps = [step for step, _ in list_checkpoints(run.run_dir / CHECKPOINTS)]
    assert steps == [20, 40]
    best = json.loads((run.run_dir / SUMMARY).read_text())["best"]["step"]
    assert run_dir_checkpoint(run.run_dir).name == f"step-{best:08d}.safetensors"
    assert run_dir_checkpoint(run.run_dir, "best") == run_dir_checkpoint(run.run_dir)
    assert run_dir_checkpoint(run.run_dir, "latest").name == "step-00000040.safetensors"
    assert trainyard.load_model(run.run_dir, 20).step == 20
    assert trainyard.load_model(run.run_dir, "latest").step == 40
    assert trainyard.load_model(str(run.run_dir)).step == best
    with pytest.raises(ModelError, match=r"no checkpoint at step 7 \(it has 20, 40"):
        run_dir_checkpoint(run.run_dir, 7)
    assert parse_choice("Best") == "best" and parse_choice("30") == 30
    with pytest.raises(ModelError, match="say best, latest or a step"):
        parse_choice("newest")


def test_a_run_without_keep_best_defaults_to_its_latest(
    trained_runs: dict[str, TrainedRun], tmp_path: Path
) -> None:
    run = trained_runs["digits_mlp"]
    copy = tmp_path / "run"
    (copy / CHECKPOINTS).mkdir(parents=True)
    for _, path in list_checkpoints(run.run_dir / CHECKPOINTS):
        (copy / CHECKPOINTS / path.name).write_bytes(path.read_bytes())
    assert run_dir_checkpoint(copy).name == "step-00000040.safetensors"
    with pytest.raises(ModelError, match=r"no best checkpoint.*keep_best"):
        run_dir_checkpoint(copy, "best")
    with pytest.raises(ModelError, match="has no checkpoints"):
        run_dir_checkpoint(tmp_path)
    with pytest.raises(ModelError, match="no such job, run directory or checkpoint file"):
        checkpoint_file(tmp_path / "nowhere")


@pytest.mark.parametrize("example", ["digits_mlp", "mnist1d_cnn"])
def test_load_model_scores_as_the_trained_net(
    trained_runs: dict[str, TrainedRun], example: str
) -> None:
    run = trained_runs[example]
    latest = run_dir_checkpoint(run.run_dir, "latest")
    model = trainyard.load_model(latest)
    assert isinstance(model, torch.nn.Module) and not model.training
    with torch.no_grad():
        torch.testing.assert_close(model(run.x_test), run.scores, atol=1e-5, rtol=0)
    scores = predict_array(model, run.x_test.numpy(), batch_size=50)
    np.testing.assert_allclose(scores, run.scores.numpy(), atol=1e-5, rtol=0)
    probabilities = predict_array(trainyard.load_model(latest, probabilities=True), run.x_test)
    np.testing.assert_allclose(probabilities.sum(1), 1.0, atol=1e-5)


@pytest.mark.parametrize("suffix", [".npy", ".npz", ".csv"])
def test_predict_a_file_in_batches(
    trained_runs: dict[str, TrainedRun], tmp_path: Path, suffix: str
) -> None:
    run = trained_runs["digits_mlp"]
    model = trainyard.load_model(run_dir_checkpoint(run.run_dir, "latest"))
    x = run.x_test.numpy()
    source = tmp_path / f"x{suffix}"
    if suffix == ".npy":
        np.save(source, x)
    elif suffix == ".npz":
        np.savez(source, x=x, y=run.y_test.numpy())
    else:
        flat = x.reshape(len(x), -1)
        header = ",".join(f"p{i}" for i in range(flat.shape[1]))
        np.savetxt(source, flat, delimiter=",", header=header, comments="", fmt="%.9g")
    out = tmp_path / "scores.npy"
    assert predict_file(model, source, out, batch_size=64) == len(x)
    np.testing.assert_allclose(np.load(out), run.scores.numpy(), atol=1e-5, rtol=0)
    assert not list(tmp_path.glob("*.part"))


def test_predict_names_bad_input(trained_runs: dict[str, TrainedRun], tmp_path: Path) -> None:
    model = trainyard.load_model(run_dir_checkpoint(trained_runs["digits_mlp"].run_dir))
    wrong = tmp_path / "wrong.npy"
    np.save(wrong, np.zeros((4, 10), dtype=np.float32))
    out = tmp_path / "out.npy"
    with pytest.raises(ModelError, match=r"samples of shape \[1, 8, 8\]"):
        predict_file(model, wrong, out)
    assert not out.exists() and not list(tmp_path.glob("*.part"))
    words = tmp_path / "words.csv"
    words.write_text("a,b\n1,2\nx,y\n")
    with pytest.raises(ModelError, match="not all numbers"):
        predict_file(model, words, out)
    both = tmp_path / "both.npz"
    np.savez(both, a=np.zeros((2, 64)), b=np.zeros((2, 64)))
    with pytest.raises(ModelError, match="say which array holds the samples"):
        predict_file(model, both, out)
    with pytest.raises(ModelError, match=r"\.npy, \.npz, \.csv file"):
        predict_file(model, tmp_path / "x.txt", out)


def test_load_model_loads_the_configured_plugins(
    plugin_run: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A net with a plugin's layer loads where the plugin is configured, as in the platform's
    processes; where it is not, the error names the layer type."""
    checkpoint = run_dir_checkpoint(plugin_run)
    with pytest.raises(ModelError, match=r"layer type\(s\) rmsnorm"):
        trainyard.load_model(checkpoint)
    monkeypatch.setenv("TRAINYARD_PLUGINS", str(PLUGIN))
    with unloaded_after():
        model = trainyard.load_model(checkpoint)
        assert "block.1.norm" in dict(model.named_layers())
