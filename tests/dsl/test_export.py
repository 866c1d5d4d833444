"""Exports of the inference net (dsl/export.py): ONNX checked with onnxruntime, and torch.export
programs loaded by a process that has torch and cannot import Trainyard."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import pytest
import torch

from contract.rundir import CHECKPOINTS, list_checkpoints
from dsl.compiler import compile_job
from dsl.export import export_model, metadata_path
from dsl.inference import InferenceError, InferenceNet, load_inference_net
from dsl.layers.base import BuildContext
from dsl.model_card import DataFacts, ModelCard
from dsl.plugins import load_plugins, unloaded_after
from tests.conftest import ROOT, TrainedRun

# ONNX and torch.export of trained nets, seconds each: in `make test`, not `make check`.
pytestmark = pytest.mark.slow

EXAMPLES = ["digits_mlp", "mnist1d_cnn"]

# Runs in a fresh interpreter with torch alone: every package of ours refuses to import.
LOAD_PT2 = textwrap.dedent(
    """
    import sys
    class Refuse:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in {"trainyard", "dsl", "workers", "contract", "scheduler",
                                      "api"}:
                raise ImportError(f"{name} is not to be imported here")
    sys.meta_path.insert(0, Refuse())
    import numpy as np
    import torch
    for pt2, x, out in zip(*[iter(sys.argv[1:])] * 3):  # (program, input, output) triples
        extra = {"trainyard.json": ""}
        program = torch.export.load(pt2, extra_files=extra)
        assert '"input"' in extra["trainyard.json"]
        with torch.no_grad():
            np.save(out, program.module()(torch.from_numpy(np.load(x))).numpy())
    assert not {"trainyard", "dsl", "workers"} & set(sys.modules)
    """
)


@pytest.fixture(scope="module")
def exported(
    trained_runs: dict[str, TrainedRun], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, dict[str, Path]]:
    """Both exports of each example's latest checkpoint."""
    folder = tmp_path_factory.mktemp("exports")
    out: dict[str, dict[str, Path]] = {}
    for name in EXAMPLES:
        latest = list_checkpoints(trained_runs[name].run_dir / CHECKPOINTS)[-1][1]
        model = load_inference_net(latest)
        out[name] = {
            "onnx": export_model(model, "onnx", folder / f"{name}.onnx"),
            "torch-export": export_model(model, "torch-export", folder / f"{name}.pt2"),
        }
    return out


@pytest.mark.parametrize("example", EXAMPLES)
def test_onnx_runtime_gives_torchs_scores_for_any_batch(
    trained_runs: dict[str, TrainedRun], exported: dict[str, dict[str, Path]], example: str
) -> None:
    run = trained_runs[example]
    path = exported[example]["onnx"]
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (given,) = session.get_inputs()
    assert given.name == "x" and given.shape[1:] == list(run.x_test.shape[1:])
    assert isinstance(given.shape[0], str)  # the batch axis is dynamic
    x = run.x_test.numpy()
    (scores,) = session.run(None, {"x": x})
    np.testing.assert_allclose(scores, run.scores.numpy(), atol=1e-4, rtol=0)
    (one,) = session.run(None, {"x": x[:1]})
    np.testing.assert_allclose(one, scores[:1], atol=1e-4, rtol=0)
    meta = json.loads(session.get_modelmeta().custom_metadata_map["trainyard"])
    assert meta["input"] == {
        "name": "x",
        "shape": ["batch", *run.x_test.shape[1:]],
        "dtype": "float32",
    }
    assert meta["num_classes"] == 10 and meta["vocabulary"] is None
    assert json.loads(metadata_path(path).read_text()) == meta
    onnx.checker.check_model(str(path))


def test_a_pt2_loads_in_a_process_without_trainyard(
    trained_runs: dict[str, TrainedRun], exported: dict[str, dict[str, Path]], tmp_path: Path
) -> None:
    args = []
    for example in EXAMPLES:  # one process loads both, which saves a start of torch
        x = tmp_path / f"{example}-x.npy"
        np.save(x, trained_runs[example].x_test[:37].numpy())  # a batch the example had not
        args += [str(exported[example]["torch-export"]), str(x), str(tmp_path / f"{example}.npy")]
    done = subprocess.run(
        [sys.executable, "-c", LOAD_PT2, *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    for example in EXAMPLES:
        expected = trained_runs[example].scores[:37].numpy()
        np.testing.assert_allclose(np.load(tmp_path / f"{example}.npy"), expected, atol=1e-4)
        meta = json.loads(metadata_path(exported[example]["torch-export"]).read_text())
        assert meta["output"]["shape"] == ["batch", 10]


def test_an_unknown_format_is_named(trained_runs: dict[str, TrainedRun], tmp_path: Path) -> None:
    latest = list_checkpoints(trained_runs["digits_mlp"].run_dir / CHECKPOINTS)[-1][1]
    with pytest.raises(InferenceError, match="say one of onnx, torch-export"):
        export_model(load_inference_net(latest), "tflite", tmp_path / "m.tflite")
    assert torch.get_num_threads() == 1


def test_a_text_jobs_exports_take_token_ids_and_record_the_vocabulary(tmp_path: Path) -> None:
    vocabulary = "abcdefghij"
    compiled = compile_job(
        (ROOT / "examples" / "char_rnn.yaml").read_text(),
        BuildContext(sample_shape=(16,), num_classes=10, label_shape=(16,)),
    )
    card = ModelCard(compiled.spec, DataFacts((16,), "int64", 10, (16,), True, vocabulary))
    model = InferenceNet(compiled.net, card)
    x = torch.randint(0, 10, (3, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        scores = model(x)  # (B, T, V): a score per token id at every step
    assert scores.shape == (3, 16, 10)
    onnx_file = export_model(model, "onnx", tmp_path / "text.onnx")
    session = onnxruntime.InferenceSession(str(onnx_file), providers=["CPUExecutionProvider"])
    (exported,) = session.run(None, {"x": x.numpy()})
    np.testing.assert_allclose(exported, scores.numpy(), atol=1e-4, rtol=0)
    meta = json.loads(metadata_path(onnx_file).read_text())
    assert meta["vocabulary"] == vocabulary
    assert meta["input"] == {"name": "x", "shape": ["batch", 16], "dtype": "int64"}
    program = torch.export.load(str(export_model(model, "torch-export", tmp_path / "t.pt2")))
    with torch.no_grad():
        torch.testing.assert_close(program.module()(x), scores, atol=1e-4, rtol=0)
    with pytest.raises(InferenceError, match=r"token ids in \[0, 10\), and the input has 12"):
        model.check_input(torch.full((1, 16), 12))


def test_a_net_of_repeated_blocks_loads_and_exports(
    trained_runs: dict[str, TrainedRun], tmp_path: Path
) -> None:
    """char_gpt's copies of its block are layers named block.0.ln1, ...: torch takes no '.' in
    a module's name, and the checkpoint's parameters keep the job language's names."""
    run = trained_runs["char_gpt"]
    latest = list_checkpoints(run.run_dir / CHECKPOINTS)[-1][1]
    model = load_inference_net(latest)
    assert "block.1.att" in dict(model.named_layers())
    x = run.x_test[:8]  # (B, T) token ids
    expected = run.scores[:8]  # (B, T, V)
    with torch.no_grad():
        torch.testing.assert_close(model(x), expected, atol=1e-5, rtol=0)
    onnx_file = export_model(model, "onnx", tmp_path / "gpt.onnx")
    session = onnxruntime.InferenceSession(str(onnx_file), providers=["CPUExecutionProvider"])
    (scores,) = session.run(None, {"x": x.numpy()})
    np.testing.assert_allclose(scores, expected.numpy(), atol=1e-4, rtol=0)
    program = torch.export.load(str(export_model(model, "torch-export", tmp_path / "gpt.pt2")))
    with torch.no_grad():
        torch.testing.assert_close(program.module()(x), expected, atol=1e-4, rtol=0)


CUMMAX_PLUGIN = """\
import torch
from torch import nn
from trainyard.plugins import layer


@layer("cummax")
class CumMax(nn.Module):
    "The running maximum over the last axis."

    def __init__(self, in_shape):
        super().__init__()

    def forward(self, x):
        return torch.cummax(x, dim=-1).values
"""


def test_a_layer_onnx_cannot_carry_is_named(tmp_path: Path) -> None:
    """ONNX has no cummax: the refusal names the layer and its type, not torch's traceback;
    torch.export carries it."""
    plugin = tmp_path / "cummax_layer.py"
    plugin.write_text(CUMMAX_PLUGIN)
    job = {
        "name": "running-max",
        "data": {"source": "synthetic", "num_features": 8},
        "neuralnet": {
            "layers": [
                {"name": "data", "type": "input"},
                {"name": "fc", "type": "dense", "srclayers": ["data"], "units": 8},
                {"name": "peak", "type": "cummax", "srclayers": ["fc"]},
                {"name": "out", "type": "dense", "srclayers": ["peak"]},
                {"name": "loss", "type": "softmax_loss", "srclayers": ["out"]},
            ]
        },
        "updater": {"type": "sgd", "lr": {"base": 0.1}},
        "train_steps": 1,
    }
    with unloaded_after():
        load_plugins([str(plugin)])
        compiled = compile_job(job, BuildContext(sample_shape=(8,), num_classes=3))
        model = InferenceNet(compiled.net, ModelCard(compiled.spec, DataFacts((8,), "float32", 3)))
        with pytest.raises(
            InferenceError,
            match=r"the onnx export cannot carry layer 'peak' \(type cummax\): ONNX has no "
            r"function for torch's aten\.cummax",
        ):
            export_model(model, "onnx", tmp_path / "m.onnx")
        program = torch.export.load(str(export_model(model, "torch-export", tmp_path / "m.pt2")))
        x = torch.randn(4, 8)
        with torch.no_grad():
            torch.testing.assert_close(program.module()(x), model(x))
