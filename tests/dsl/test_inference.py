"""The inference net (dsl/inference.py) of checkpoints the trainer wrote: the scores the loss
layer was fed, from the checkpoint file alone."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from contract.rundir import CHECKPOINTS, list_checkpoints
from dsl.compiler import compile_job
from dsl.inference import InferenceError, InferenceNet, load_inference_net, read_checkpoint
from dsl.layers.base import BuildContext
from dsl.model_card import DataFacts, ModelCard
from dsl.plugins import load_plugins, unloaded_after
from tests.conftest import EXAMPLES, PLUGIN, TrainedRun

DIGITS = BuildContext(sample_shape=(1, 8, 8), num_classes=10)


def latest(run_dir: Path) -> Path:
    return list_checkpoints(run_dir / CHECKPOINTS)[-1][1]


@pytest.mark.parametrize("example", ["digits_mlp", "mnist1d_cnn"])
def test_the_latest_checkpoint_gives_the_scores_the_net_gave(
    trained_runs: dict[str, TrainedRun], example: str
) -> None:
    run = trained_runs[example]
    model = load_inference_net(latest(run.run_dir))
    assert not model.training
    assert not any(m.is_loss or m.is_metric for m in model.layers.values())
    with torch.no_grad():
        scores = model(run.x_test)
    assert scores.shape == run.scores.shape
    torch.testing.assert_close(scores, run.scores, atol=1e-5, rtol=0)
    # The scores are a trained net's: twice as good as chance (10 classes) after a few steps.
    assert (scores.argmax(-1) == run.y_test).float().mean() > 0.2


def test_probabilities_are_the_softmax_of_the_scores(trained_runs: dict[str, TrainedRun]) -> None:
    run = trained_runs["digits_mlp"]
    path = latest(run.run_dir)
    probabilities = load_inference_net(path, probabilities=True)
    with torch.no_grad():
        p = probabilities(run.x_test)
    torch.testing.assert_close(p.sum(-1), torch.ones(len(p)))
    torch.testing.assert_close(p, torch.softmax(run.scores, -1), atol=1e-6, rtol=0)


def test_bad_input_is_named(trained_runs: dict[str, TrainedRun]) -> None:
    run = trained_runs["digits_mlp"]
    model = load_inference_net(latest(run.run_dir))
    flat = run.x_test.reshape(len(run.x_test), -1).double()
    torch.testing.assert_close(model.check_input(flat), run.x_test)
    with pytest.raises(InferenceError, match=r"samples of shape \[1, 8, 8\] \(64 values\)"):
        model.check_input(torch.zeros(3, 10))


@pytest.mark.parametrize(
    ("example", "message"),
    [
        ("autoencoder_digits", "ends in a euclidean_loss layer, not softmax_loss"),
        ("rbm_digits", "has no loss layer in its test phase"),
    ],
)
def test_nets_without_class_scores_say_so(example: str, message: str) -> None:
    compiled = compile_job((EXAMPLES / f"{example}.yaml").read_text(), DIGITS)
    card = ModelCard(compiled.spec, DataFacts((1, 8, 8), "float32", 10))
    with pytest.raises(InferenceError, match=message):
        InferenceNet(compiled.net, card, probabilities=True)


def test_an_autoencoder_predicts_its_reconstruction() -> None:
    compiled = compile_job((EXAMPLES / "autoencoder_digits.yaml").read_text(), DIGITS)
    model = InferenceNet(
        compiled.net, ModelCard(compiled.spec, DataFacts((1, 8, 8), "float32", 10))
    )
    assert model.score_shape == (64,)
    assert model(torch.zeros(5, 1, 8, 8)).shape == (5, 64)


def test_a_checkpoint_without_a_card_or_that_does_not_fit_is_refused(
    trained_runs: dict[str, TrainedRun], tmp_path: Path
) -> None:
    path = latest(trained_runs["digits_mlp"].run_dir)
    tensors = load_file(str(path))
    bare = tmp_path / "bare.safetensors"
    save_file(tensors, str(bare), metadata={"step": "40"})
    with pytest.raises(InferenceError, match="has no model card"):
        read_checkpoint(bare)
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as handle:
        meta = dict(handle.metadata())
    tensors["param/fc2/w"] = torch.zeros(3, 3)
    wrong = tmp_path / "wrong.safetensors"
    save_file(tensors, str(wrong), metadata=meta)
    with pytest.raises(InferenceError, match=r"fc2/w has shape \[3, 3\]"):
        load_inference_net(wrong)
    save_file(tensors, str(wrong), metadata={**meta, "model": '{"spec": {"name": "x"}}'})
    with pytest.raises(InferenceError, match=r"model card of checkpoint wrong\.safetensors"):
        read_checkpoint(wrong)


def test_a_plugin_net_loads_where_its_plugin_does_and_is_named_where_not(
    plugin_run: Path,
) -> None:
    with unloaded_after():
        load_plugins([str(PLUGIN)])
        model = load_inference_net(latest(plugin_run))
        assert [name for name, _ in model.named_layers()] == ["block.0.norm", "block.1.norm", "out"]
    with pytest.raises(
        InferenceError, match=r"layer type\(s\) rmsnorm, which this process does not know"
    ):
        load_inference_net(latest(plugin_run))
