"""Every example, every exit: each file of examples/ trained through one stack (shortened to a
few steps), and each trained model taken off the platform by every way out: `load_model`,
`trainyard predict` of a file, ONNX (checked by onnxruntime), `torch.export`, registration, a
batch prediction of the registered model on the cluster and a job started from it
(`checkpoint.init_from: {model: ...}`). Besides the examples, a net of repeated blocks holding
a plugin layer (docs/plugins.md's rmsnorm), whose copies are named `block.0.norm`, ...

How each kind of example is handled:
- a sweep's model is its best trial's; the job started from it takes the trial's parameters;
- rbm_digits has no model (a net trained by cd scores nothing): every exit that scores says so,
  and its checkpoint, registered, is what autoencoder_digits starts from (the example's
  `init_from: ../runs/rbm-digits` is a path, an admin's on the service);
- every other example is a job with a model.
A text example's sequences are 16 long instead of 64 (an LSTM's exports unroll its steps).
A layer ONNX cannot carry is refused naming its type: tests/dsl/test_export.py, with a plugin
layer (no example has one).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import onnxruntime
import pytest
import torch
import yaml
from typer.testing import CliRunner

from dsl.export import export_model
from dsl.plugins import load_plugins, unloaded_after
from tests.conftest import EXAMPLES, PLUGIN
from trainyard import Client, Job, Sweep
from trainyard.batch_prediction import Prediction
from trainyard.cli import app
from trainyard.loading import ModelError
from trainyard.predicting import predict_array

if TYPE_CHECKING:
    from conftest import RunningStack

pytestmark = pytest.mark.slow

STEPS = 4
SEQ_LEN = 16  # a text example's sequences (64 written)
NO_MODEL = "rbm_digits"
STARTS_FROM_RBM = "autoencoder_digits"
SAMPLES = 16  # scored by every exit

# A net of repeated blocks with a plugin layer in them: layers block.0.norm, block.1.norm, ...
BLOCKS_WITH_PLUGIN = """\
name: blocks-with-plugin
seed: 0
data: {source: synthetic, task: classification, num_samples: 128, num_features: 8, batch_size: 16}
neuralnet:
  layers:
    - {name: data, type: input}
    - {name: fc, type: dense, srclayers: [data], units: 16}
    - name: block
      type: repeat
      times: 2
      srclayers: [fc]
      layers:
        - {name: norm, type: rmsnorm, srclayers: [block]}
        - {name: mix, type: dense, srclayers: [norm], units: 16}
        - {name: res, type: add, srclayers: [block, mix]}
    - {name: out, type: dense, srclayers: [block]}
    - {name: loss, type: softmax_loss, srclayers: [out]}
updater: {type: adam, lr: {base: 0.01}}
train_steps: 40
checkpoint: {freq: 0, keep: 1}
"""
EXTRA = "blocks_with_plugin"
NAMES = [*sorted(p.stem for p in EXAMPLES.glob("*.yaml")), EXTRA]


def document(name: str) -> dict[str, Any]:
    text = BLOCKS_WITH_PLUGIN if name == EXTRA else (EXAMPLES / f"{name}.yaml").read_text()
    found: dict[str, Any] = yaml.safe_load(text)
    return found


def shortened(doc: dict[str, Any]) -> dict[str, Any]:
    """Overrides that make an example a few steps long, its sweep two trials."""
    out: dict[str, Any] = {"train_steps": STEPS, "disp_freq": 2}
    if "seq_len" in doc["data"]:  # text: exports of an LSTM unroll its steps
        out["data.seq_len"] = SEQ_LEN
        if "unroll_len" in doc.get("train_one_batch", {}):
            out["train_one_batch.unroll_len"] = SEQ_LEN // 2
    if "validate" in doc:
        out |= {"validate.freq": 2, "validate.steps": 1}
    if "test" in doc:
        out |= {"test.freq": STEPS, "test.steps": 1}
    search = doc.get("search", {})
    if "max_trials" in search:
        out["search.max_trials"] = 2
    if search:
        out["search.max_parallel"] = 2
    if search.get("pruner", {}).get("type") == "pbt":  # a population of 2: one is replaced
        out |= {"search.pruner.interval": 2, "search.pruner.quantile": 0.5}
    if search.get("pruner", {}).get("type") == "asha":
        out["search.pruner.min_steps"] = 2
    return out


@dataclass
class Trained:
    """An example trained on the stack: the job of its model (a sweep's best trial), and the
    overrides that started it (a trial's parameters included)."""

    name: str
    job: Job
    overrides: dict[str, Any]


@dataclass
class Exits:
    """What the service does with a registered model: a batch prediction of the samples and a
    job started from the model."""

    ref: str
    x: np.ndarray
    prediction: Prediction
    started: Job


@pytest.fixture(scope="module")
def stack(stack_factory: Callable[..., RunningStack]) -> RunningStack:
    """One stack for the module, loading the example plugin; 6 slots, for the example of most
    processes (4 workers and 2 server shards)."""
    return stack_factory(env={"TRAINYARD_PLUGINS": str(PLUGIN), "TRAINYARD_NODE_SLOTS": "6"})


@pytest.fixture(scope="module")
def client(stack: RunningStack) -> Client:
    return Client(stack.url, stack.token)


@pytest.fixture(scope="module", autouse=True)
def plugin() -> Iterator[None]:
    """The plugin in this process too, as in the stack's: the client's exits rebuild its net."""
    with unloaded_after():
        load_plugins([str(PLUGIN)])
        yield


@pytest.fixture(scope="module")
def client_env(stack: RunningStack, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The client's environment: the stack's address and token, a cache of its own."""
    return {
        "TRAINYARD_URL": stack.url,
        "TRAINYARD_TOKEN": stack.token,
        "TRAINYARD_DATA_DIR": str(tmp_path_factory.mktemp("client")),
        "COLUMNS": "200",
    }


@pytest.fixture(scope="module")
def trained(client: Client, client_env: dict[str, str]) -> dict[str, Trained]:
    """Every example and the extra net trained at once (the autoencoder once the rbm it starts
    from is registered); a job that did not succeed fails here, naming it and its error."""
    submitted: dict[str, Job | Sweep] = {}
    overrides: dict[str, dict[str, Any]] = {}
    for name in NAMES:
        if name == STARTS_FROM_RBM:
            continue
        doc = document(name)
        overrides[name] = shortened(doc)
        submitted[name] = client.submit(doc, overrides=overrides[name])
    rbm = submitted[NO_MODEL]
    assert isinstance(rbm, Job)
    assert rbm.wait(timeout=300, poll=0.5).state == "SUCCEEDED", rbm.error
    client.register_model(slug(NO_MODEL), rbm)
    doc = document(STARTS_FROM_RBM)
    overrides[STARTS_FROM_RBM] = {
        **shortened(doc),
        "checkpoint.init_from": {"model": f"{slug(NO_MODEL)}@1"},
    }
    submitted[STARTS_FROM_RBM] = client.submit(doc, overrides=overrides[STARTS_FROM_RBM])
    done: dict[str, Trained] = {}
    failed = []
    for name, run in submitted.items():
        if isinstance(run, Sweep):
            run.wait(timeout=600, poll=0.5)
            best = run.best()
            job = run.best_job()
            if job is None or best is None:
                failed.append(f"{name}: sweep {run.id} {run.state} without a best trial")
                continue
            done[name] = Trained(name, job, {**overrides[name], **best.params})
        else:
            job = run.wait(timeout=600, poll=0.5)
            done[name] = Trained(name, job, overrides[name])
        if done[name].job.state != "SUCCEEDED":
            failed.append(f"{name}: job {done[name].job.id} {job.state}: {job.error}")
    assert not failed, "\n".join(failed)
    return done


def slug(name: str) -> str:
    """A registered model's (and an uploaded dataset's) name for an example."""
    return "every-" + name.replace("_", "-")


def samples(client: Client, job: Job) -> np.ndarray:
    """SAMPLES samples the job's model takes: token ids below its vocabulary, else numbers."""
    model = job.load_model()
    rng = np.random.default_rng(job.id)
    shape = (SAMPLES, *model.input_shape)
    if model.input_dtype == torch.int64:
        return rng.integers(0, model.card.data.num_classes or 2, size=shape)
    return rng.standard_normal(shape).astype(np.float32)


@pytest.fixture(scope="module")
def exits(
    client: Client, trained: dict[str, Trained], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Exits]:
    """Each model registered, then, all queued at once, a batch prediction of an uploaded
    dataset of samples by the registered model and a job started from it."""
    folder = tmp_path_factory.mktemp("datasets")
    out = {}
    for name, run in trained.items():
        if name == NO_MODEL:
            continue
        version = client.register_model(slug(name), run.job)
        x = samples(client, run.job)
        path = folder / f"{name}.npz"
        np.savez(path, x=x)
        client.upload_dataset(path, slug(name))
        prediction = client.predict_dataset(f"model:{version.ref}", slug(name))
        doc = document(name)
        doc.pop("search", None)  # the best trial's job: its parameters are among the overrides
        overrides = {
            **{k: v for k, v in run.overrides.items() if not k.startswith("search.")},
            "checkpoint.init_from": {"model": version.ref},
        }
        started = client.submit(doc, overrides=overrides)
        assert isinstance(started, Job)
        out[name] = Exits(version.ref, x, prediction, started)
    return out


@pytest.mark.parametrize("name", NAMES)
def test_every_exit(
    name: str,
    client: Client,
    trained: dict[str, Trained],
    exits: dict[str, Exits],
    client_env: dict[str, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TRAINYARD_DATA_DIR", client_env["TRAINYARD_DATA_DIR"])
    job = trained[name].job
    if name == NO_MODEL:
        with pytest.raises(ModelError, match="has no loss layer in its test phase"):
            job.load_model()
        x = tmp_path / "x.npy"
        np.save(x, np.zeros((2, 1, 8, 8), np.float32))
        done = CliRunner().invoke(
            app,
            ["predict", str(job.id), "-i", str(x), "-o", str(tmp_path / "s.npy")],
            env=client_env,
        )
        assert done.exit_code == 1 and "has no loss layer" in done.output, done.output
        return
    model = job.load_model()
    ran = exits[name]
    x = ran.x
    expected = predict_array(model, x)

    # trainyard predict of a file, here
    source, scored = tmp_path / "x.npy", tmp_path / "scores.npy"
    np.save(source, x)
    done = CliRunner().invoke(
        app, ["predict", str(job.id), "-i", str(source), "-o", str(scored)], env=client_env
    )
    assert done.exit_code == 0, done.output
    np.testing.assert_allclose(np.load(scored), expected, atol=1e-6, rtol=0)

    # ONNX, run by onnxruntime
    onnx_file = export_model(model, "onnx", tmp_path / "model.onnx")
    session = onnxruntime.InferenceSession(str(onnx_file), providers=["CPUExecutionProvider"])
    (scores,) = session.run(None, {"x": model.check_input(torch.from_numpy(x)).numpy()})
    np.testing.assert_allclose(scores, expected, atol=1e-4, rtol=0)

    # torch.export
    program = torch.export.load(str(export_model(model, "torch-export", tmp_path / "m.pt2")))
    with torch.no_grad():
        exported = program.module()(model.check_input(torch.from_numpy(x)))
    np.testing.assert_allclose(exported.numpy(), expected, atol=1e-4, rtol=0)

    # the registered model scores the uploaded samples on the cluster as here
    prediction = ran.prediction.wait(timeout=300, poll=0.5)
    assert prediction.state == "SUCCEEDED", prediction.info.error
    np.testing.assert_allclose(prediction.scores(), expected, atol=1e-5, rtol=0)

    # a job starts from the registered model
    started = ran.started.wait(timeout=300, poll=0.5)
    assert started.state == "SUCCEEDED", started.error
    assert any("initialised" in line for line in started.logs()), started.logs()[-20:]


def test_the_flagship_exports_through_the_service(
    trained: dict[str, Trained], tmp_path: Path
) -> None:
    """char_gpt's copies of its block (block.0.ln1, ...) leave through the server's export."""
    job = trained["char_gpt"].job
    onnx_file = job.export(tmp_path / "gpt.onnx", "onnx")
    session = onnxruntime.InferenceSession(str(onnx_file), providers=["CPUExecutionProvider"])
    model = job.load_model()
    assert model.input_shape == (SEQ_LEN,)
    x = np.random.default_rng(0).integers(0, model.card.data.num_classes or 2, size=(3, SEQ_LEN))
    (scores,) = session.run(None, {"x": x})
    np.testing.assert_allclose(scores, job.predict(x), atol=1e-4, rtol=0)
