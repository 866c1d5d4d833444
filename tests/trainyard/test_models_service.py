"""Trained models off a real stack: trainyard.load_model, job.predict, the server's exports and
`trainyard predict JOB` of jobs the service trained, for both examples; their scores agree."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import onnxruntime
import pytest
import torch
import yaml
from typer.testing import CliRunner

import trainyard
from contract.settings import Settings
from dsl.schema import JobSpec
from scheduler.cli.main import app as full_app
from tests.conftest import EXAMPLES
from trainyard import Client, Job
from trainyard.cli import app
from workers.data import load_dataset

if TYPE_CHECKING:
    from conftest import RunningStack

pytestmark = pytest.mark.slow

QUICK = {
    "digits_mlp": {"train_steps": 40, "test.freq": 20, "checkpoint.freq": 20},
    "mnist1d_cnn": {"train_steps": 30, "test.freq": 15, "checkpoint.freq": 15},
}


@pytest.fixture(scope="module")
def client(stack: RunningStack) -> Client:
    return Client(stack.url, stack.token)


@pytest.fixture(scope="module")
def jobs(client: Client) -> dict[str, Job]:
    """Both examples trained on the service, keeping their best checkpoints."""
    submitted = {
        name: client.submit(
            EXAMPLES / f"{name}.yaml",
            overrides={**quick, "checkpoint.keep": 3, "checkpoint.keep_best": True},
        )
        for name, quick in QUICK.items()
    }
    done = {}
    for name, job in submitted.items():
        assert isinstance(job, Job)
        done[name] = job.wait(timeout=180, poll=0.2)
        assert done[name].state == "SUCCEEDED", done[name].error
    return done


def split_of(name: str, cache_dir: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """The example's test split, as the service's workers load it."""
    config = JobSpec.model_validate(yaml.safe_load((EXAMPLES / f"{name}.yaml").read_text()))
    dataset = load_dataset(config.data, seed=config.seed, cache_dir=cache_dir)
    return dataset.x_test, dataset.y_test


@pytest.mark.parametrize("name", list(QUICK))
def test_the_best_model_scores_as_the_service_measured_it(
    jobs: dict[str, Job],
    name: str,
    cache_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TRAINYARD_DATA_DIR", str(tmp_path))  # the client's cache of checkpoints
    job = jobs[name]
    x, y = split_of(name, cache_dir)
    model = job.load_model()
    assert model.step == job.info.best_step
    scores = job.predict(x)
    accuracy = float((scores.argmax(1) == y.numpy()).mean())
    assert accuracy == pytest.approx(job.info.best_metric, abs=1e-6)
    again = trainyard.load_model(job.id, "best", client=job.client)
    with torch.no_grad():
        np.testing.assert_allclose(again(x).numpy(), scores, atol=1e-6, rtol=0)

    exported = job.export(tmp_path / "model.onnx", "onnx")
    session = onnxruntime.InferenceSession(str(exported), providers=["CPUExecutionProvider"])
    (onnx_scores,) = session.run(None, {"x": x.numpy()})
    np.testing.assert_allclose(onnx_scores, scores, atol=1e-4, rtol=0)
    if name != "digits_mlp":
        return  # the .pt2 of both examples: tests/dsl/test_export.py; here the server's once
    pt2 = job.export(tmp_path / "model.pt2", "torch-export", "best")
    with torch.no_grad():
        program = torch.export.load(str(pt2)).module()
        np.testing.assert_allclose(program(x).numpy(), scores, atol=1e-4, rtol=0)


def test_trainyard_predict_a_job(
    jobs: dict[str, Job], stack: RunningStack, cache_dir: Path, tmp_path: Path
) -> None:
    job = jobs["digits_mlp"]
    x, _ = split_of("digits_mlp", cache_dir)
    source, out = tmp_path / "x.npz", tmp_path / "out.npy"
    np.savez(source, x=x.numpy())
    environment = {
        "TRAINYARD_DATA_DIR": str(stack.data_dir),
        "TRAINYARD_URL": None,
        "TRAINYARD_TOKEN": None,
        "COLUMNS": "200",
    }
    done = CliRunner().invoke(
        app,
        ["predict", str(job.id), "-i", str(source), "-o", str(out), "--probabilities"],
        env=environment,
    )
    assert done.exit_code == 0, done.output
    expected = job.predict(x, probabilities=True)
    np.testing.assert_allclose(np.load(out), expected, atol=1e-6, rtol=0)
    assert Settings(data_dir=stack.data_dir).cache_dir().joinpath("models").is_dir()

    other = CliRunner().invoke(
        app, ["predict", "99999", "-i", str(source), "-o", str(out)], env=environment
    )
    assert other.exit_code == 1 and "no job 99999" in other.output


def test_fine_tune_from_a_job_on_the_service_and_here(
    jobs: dict[str, Job], client: Client, stack: RunningStack, tmp_path: Path
) -> None:
    source = jobs["digits_mlp"]
    tuned = client.submit(
        EXAMPLES / "digits_mlp.yaml",
        overrides={"train_steps": 2, "checkpoint.init_from": {"job": source.id}},
    )
    assert isinstance(tuned, Job)
    assert tuned.wait(timeout=120, poll=0.2).state == "SUCCEEDED", tuned.error
    best = f"step-{source.info.best_step:08d}.safetensors"
    assert any("initialised 6 parameters from" in line and best in line for line in tuned.logs())

    job_file = tmp_path / "tune.yaml"
    document = yaml.safe_load((EXAMPLES / "digits_mlp.yaml").read_text())
    document.update(
        train_steps=2, checkpoint={"init_from": {"job": source.id, "checkpoint": "latest"}}
    )
    job_file.write_text(yaml.safe_dump(document))
    environment = {
        "TRAINYARD_DATA_DIR": str(stack.data_dir),
        "TRAINYARD_URL": None,
        "TRAINYARD_TOKEN": None,
        "COLUMNS": "200",
    }
    done = CliRunner().invoke(
        full_app, ["train", str(job_file), "--run-dir", str(tmp_path / "run")], env=environment
    )
    assert done.exit_code == 0, done.output
    log = (tmp_path / "run" / "train.log").read_text()
    assert "initialised 6 parameters from" in log and f"step-{source.step:08d}" in log


def test_the_registry_from_the_sdk_and_the_cli(
    jobs: dict[str, Job],
    client: Client,
    stack: RunningStack,
    cache_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TRAINYARD_DATA_DIR", str(tmp_path))  # the client's cache of checkpoints
    job = jobs["digits_mlp"]
    name = f"digits-{job.id}"
    version = client.register_model(name, job)
    assert version.ref == f"{name}@1" and version.step == job.info.best_step
    assert version.objective_value == pytest.approx(job.info.best_metric)
    environment = {
        "TRAINYARD_DATA_DIR": str(stack.data_dir),
        "TRAINYARD_URL": None,
        "TRAINYARD_TOKEN": None,
        "COLUMNS": "200",
    }

    def cli(*args: str) -> str:
        done = CliRunner().invoke(app, list(args), env=environment)
        assert done.exit_code == 0, done.output
        return done.output

    assert f"registered {name}@2" in cli(
        "models", "register", name, str(job.id), "--checkpoint", "latest"
    )
    assert "production" in cli("models", "tag", name, "1", "production")
    listed = cli("models", "list")
    assert f"{name}@1" in listed and f"{name}@2" in listed
    assert f"from job {job.id}" in cli("models", "show", f"{name}@production")

    x, _ = split_of("digits_mlp", cache_dir)
    expected = job.predict(x)
    model = trainyard.load_model(f"model:{name}@production", client=client)
    with torch.no_grad():
        np.testing.assert_allclose(model(x).numpy(), expected, atol=1e-6, rtol=0)
    exported = client.export_model(f"{name}@production", tmp_path / "m.onnx")
    session = onnxruntime.InferenceSession(str(exported), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(session.run(None, {"x": x.numpy()})[0], expected, atol=1e-4)
    source, out = tmp_path / "x.npy", tmp_path / "out.npy"
    np.save(source, x.numpy())
    cli("predict", f"model:{name}@production", "-i", str(source), "-o", str(out))
    np.testing.assert_allclose(np.load(out), expected, atol=1e-6, rtol=0)

    tuned = client.submit(
        EXAMPLES / "digits_mlp.yaml",
        overrides={"train_steps": 2, "checkpoint.init_from": {"model": f"{name}@production"}},
    )
    assert isinstance(tuned, Job)
    assert tuned.wait(timeout=120, poll=0.2).state == "SUCCEEDED", tuned.error
    assert any(f"{name}-v1.safetensors" in line for line in tuned.logs())
    cli("models", "delete", name, "2")
    assert [v.ref for v in client.models() if v.name == name] == [f"{name}@1"]


def test_register_a_sweeps_best_trial(client: Client, stack: RunningStack) -> None:
    document = yaml.safe_load((EXAMPLES / "digits_mlp.yaml").read_text())
    document.update(train_steps=20, test={"freq": 10}, checkpoint={"freq": 10, "keep_best": True})
    document["search"] = {
        "metric": "test/accuracy",
        "mode": "max",
        "algorithm": "random",
        "max_trials": 2,
        "max_parallel": 2,
        "space": {"updater.lr.base": {"loguniform": [0.01, 0.1]}},
    }
    sweep = client.submit(document)
    assert not isinstance(sweep, Job)
    sweep.wait(timeout=180, poll=0.5)
    best = sweep.best()
    assert best is not None
    environment = {"TRAINYARD_DATA_DIR": str(stack.data_dir), "TRAINYARD_URL": None}
    name = f"sweep-{sweep.id}"
    done = CliRunner().invoke(
        app, ["models", "register", name, "--sweep", str(sweep.id)], env=environment
    )
    assert done.exit_code == 0, done.output
    assert client.model(name).job_id == best.job_id
    both = CliRunner().invoke(app, ["models", "register", name, "3", "--sweep", "1"])
    assert both.exit_code == 2 and "one of the two" in both.output
