"""The tools people already use, against the session's real stack (`trainyard up`): a job's
TensorBoard event files (read by tensorboard's own reader), its metrics as CSV and pandas
DataFrames, its log as text, and jobs and a sweep exported to a real MLflow server (a
subprocess on a free port: SQLite backend store, local artifact root) read back with
MlflowClient."""

from __future__ import annotations

import csv
import io
import math
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import pytest
import yaml

from scheduler.cli.redis_server import free_port
from tests.trainyard.test_cli_client import run
from trainyard import Client, Job, TrainyardError
from trainyard.sweeps import Sweep

if TYPE_CHECKING:
    from conftest import RunningStack

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
DIGITS = ROOT / "examples" / "digits_mlp.yaml"
QUICK = {
    "train_steps": 60,
    "disp_freq": 10,
    "data.validation_fraction": 0.1,
    "validate.freq": 30,
    "checkpoint.freq": 30,
    "checkpoint.keep": 1,
    "checkpoint.keep_best": True,
}
SWEEP = (
    DIGITS.read_text()
    .replace("train_steps: 2000", "train_steps: 30")
    .replace("test: {freq: 500}", "validate: {freq: 15}")
    .replace("test_fraction: 0.2}", "test_fraction: 0.2, validation_fraction: 0.1}")
    + """
search:
  algorithm: random
  max_trials: 2
  max_parallel: 2
  seed: 3
  space:
    updater.lr.base: {loguniform: [0.01, 0.2]}
"""
)


def same_points(found: list[tuple[int, float]], expected: list[tuple[int, float]]) -> bool:
    """The same steps, and the same values to float32's precision (event files keep float32)."""
    return [s for s, _ in found] == [s for s, _ in expected] and [v for _, v in found] == (
        pytest.approx([v for _, v in expected], rel=1e-6)
    )


@pytest.fixture(scope="module")
def client(stack: RunningStack) -> Client:
    return Client(stack.url, stack.token)


@pytest.fixture(scope="module")
def submitted(client: Client, mlflow_started: MlflowServer) -> tuple[Job, Job, Sweep]:
    """Two short jobs (two learning rates) and a two-trial sweep, submitted together (the
    MLflow server boots meanwhile)."""
    first = client.submit(DIGITS, overrides=QUICK)
    second = client.submit(DIGITS, overrides={**QUICK, "updater.lr.base": 0.02})
    sweep = client.submit(SWEEP)
    assert isinstance(first, Job) and isinstance(second, Job) and isinstance(sweep, Sweep)
    return first, second, sweep


@pytest.fixture(scope="module")
def jobs(submitted: tuple[Job, Job, Sweep]) -> tuple[Job, Job]:
    first, second, _ = submitted
    for job in (first, second):
        job.wait(timeout=120, poll=0.2)
        assert job.state == "SUCCEEDED", job.error
    return first, second


def test_tensorboard_reads_a_jobs_scalars_and_hyperparameters(
    stack: RunningStack, jobs: tuple[Job, Job], tmp_path: Path
) -> None:
    from tensorboard.backend.event_processing import event_accumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    job = jobs[0]
    result = run(stack, "download", str(job.id), "--tensorboard", str(tmp_path))
    assert result.exit_code == 0, result.output
    logdir = tmp_path / f"job-{job.id}" / "tensorboard"
    assert str(logdir.parent) in result.stdout.replace("\n", "")
    reader = event_accumulator.EventAccumulator(str(logdir), size_guidance={"scalars": 0})
    reader.Reload()
    assert {"train/loss", "val/accuracy", "lr"} <= set(reader.Tags()["scalars"])
    loss = [(e.step, e.value) for e in reader.Scalars("train/loss")]
    assert same_points(loss, job.metrics("train/loss"))
    assert [e.step for e in reader.Scalars("val/accuracy")] == [30, 60]
    # HParams: the job's document, flattened, as the session's hyperparameters; the
    # experiment lists every metric the run reported.
    content = reader.PluginTagToContent("hparams")
    start = plugin_data_pb2.HParamsPluginData.FromString(
        content["_hparams_/session_start_info"]
    ).session_start_info
    assert start.hparams["updater.lr.base"].number_value == pytest.approx(0.05)
    assert start.hparams["neuralnet.layers.fc1.units"].number_value == 256
    assert start.hparams["data.source"].string_value == "digits"
    experiment = plugin_data_pb2.HParamsPluginData.FromString(
        content["_hparams_/experiment"]
    ).experiment
    assert {"train/loss", "val/accuracy"} <= {m.name.tag for m in experiment.metric_infos}


def test_metrics_csv_logs_txt_and_dataframes(
    stack: RunningStack, client: Client, jobs: tuple[Job, Job], monkeypatch: pytest.MonkeyPatch
) -> None:
    first, second = jobs
    auth = {"Authorization": f"Bearer {stack.token}"}
    answer = httpx.get(f"{stack.url}/api/v1/jobs/{first.id}/metrics.csv", headers=auth)
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"].startswith("text/csv")
    assert f'filename="digits-mlp-job{first.id}.csv"' in answer.headers["content-disposition"]
    rows = list(csv.DictReader(io.StringIO(answer.text)))
    loss = [(int(r["step"]), float(r["value"])) for r in rows if r["name"] == "train/loss"]
    assert same_points(loss, first.metrics("train/loss"))
    logs = httpx.get(f"{stack.url}/api/v1/jobs/{first.id}/logs.txt", headers=auth)
    assert logs.status_code == 200 and logs.text.splitlines() == first.logs()
    missing = httpx.get(f"{stack.url}/api/v1/jobs/999999/metrics.csv", headers=auth)
    assert missing.status_code == 404
    assert httpx.get(f"{stack.url}/api/v1/jobs/{first.id}/logs.txt").status_code == 401

    history = first.history()
    assert list(history.columns[:2]) == ["step", "time"]
    assert {"train/loss", "val/accuracy", "lr"} <= set(history.columns)
    assert history["step"].tolist() == sorted(history["step"])
    by_step = history.set_index("step")
    assert same_points([(s, by_step.loc[s, "train/loss"]) for s, _ in loss], loss)
    assert math.isnan(by_step.loc[10, "val/accuracy"])  # validated every 30 steps only
    assert str(history["time"].dt.tz) == "UTC"
    picked = first.history(["val/accuracy"])
    assert list(picked.columns) == ["step", "time", "val/accuracy"]
    with pytest.raises(TrainyardError, match="did you mean 'val/accuracy'"):
        first.history(["val/acuracy"])

    both = client.compare([first.id, second.id], ["train/loss"])
    assert list(both.columns) == ["job", "step", "time", "train/loss"]
    assert set(both["job"]) == {first.id, second.id}
    assert len(both) == 2 * len(loss)

    monkeypatch.setitem(sys.modules, "pandas", None)  # as if not installed
    with pytest.raises(TrainyardError, match=r"pip install 'trainyard\[pandas\]'"):
        first.history()


@dataclass
class MlflowServer:
    process: subprocess.Popen[bytes]
    url: str
    output: Path


@pytest.fixture(scope="module")
def mlflow_started(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MlflowServer]:
    """A real `mlflow server` (SQLite backend store, artifacts served from a local folder),
    started before the jobs are submitted so that it boots while they train."""
    where = tmp_path_factory.mktemp("mlflow")
    port = free_port()
    with (where / "server.out").open("wb") as sink:
        process = subprocess.Popen(
            [
                str(Path(sys.executable).parent / "mlflow"),
                "server",
                *("--backend-store-uri", f"sqlite:///{where / 'mlflow.db'}"),
                *("--artifacts-destination", str(where / "artifacts")),
                *("--host", "127.0.0.1", "--port", str(port), "--workers", "1"),
            ],
            stdout=sink,
            stderr=subprocess.STDOUT,
            # Its job runner (huey consumers for GenAI jobs) is not needed for tracking.
            env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"},
        )
    try:
        yield MlflowServer(process, f"http://127.0.0.1:{port}", where / "server.out")
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture(scope="module")
def mlflow_server(mlflow_started: MlflowServer) -> str:
    """The server's address, once it answers."""
    deadline = time.monotonic() + 120
    while True:
        try:
            if httpx.get(f"{mlflow_started.url}/health", timeout=2).status_code == 200:
                return mlflow_started.url
        except httpx.TransportError:
            pass
        assert mlflow_started.process.poll() is None, mlflow_started.output.read_text()
        assert time.monotonic() < deadline, mlflow_started.output.read_text()
        time.sleep(0.5)


def test_a_job_and_a_sweep_exported_to_mlflow_read_back(
    stack: RunningStack,
    client: Client,
    jobs: tuple[Job, Job],
    submitted: tuple[Job, Job, Sweep],
    mlflow_server: str,
    tmp_path: Path,
) -> None:
    import json

    from mlflow import MlflowClient

    job = jobs[0].refresh()
    result = run(
        stack, "mlflow", "export", str(job.id), "--tracking-uri", mlflow_server,
        "--experiment", "trainyard-tests", "--json",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    exported = json.loads(result.stdout)
    tracker = MlflowClient(tracking_uri=mlflow_server)
    found = tracker.get_run(exported["run_id"])
    assert tracker.get_experiment(found.info.experiment_id).name == "trainyard-tests"
    assert found.info.status == "FINISHED" and found.info.run_name == f"digits-mlp-job{job.id}"
    params, tags = found.data.params, found.data.tags
    assert params["updater.lr.base"] == "0.05" and params["train_steps"] == "60"
    assert params["neuralnet.layers.fc1.units"] == "256"
    assert params["checkpoint.keep_best"] == "True"  # an override, on its dotted path
    assert tags["state"] == "SUCCEEDED" and tags["framework"] == job.info.framework
    assert tags["objective"] == "val/accuracy" and tags["trainyard.job_id"] == str(job.id)
    history = tracker.get_metric_history(found.info.run_id, "train/loss")
    assert same_points(sorted((m.step, m.value) for m in history), job.metrics("train/loss"))
    artifacts = {a.path for a in tracker.list_artifacts(found.info.run_id)}
    assert artifacts == {"job.yaml", "checkpoints"}
    [best] = [c for c in job.checkpoints() if c.best]
    name = f"step-{best.step:08d}.safetensors"
    assert tags["trainyard.checkpoint"] == f"best ({name})"
    saved = Path(
        tracker.download_artifacts(found.info.run_id, f"checkpoints/{name}", str(tmp_path))
    )
    assert saved.read_bytes() == job.download_checkpoint(tmp_path / "ours", best=True).read_bytes()
    yaml_file = tracker.download_artifacts(found.info.run_id, "job.yaml", str(tmp_path))
    assert yaml.safe_load(Path(yaml_file).read_text())["name"] == "digits-mlp"

    from trainyard.mlflow_export import export_sweep

    sweep = submitted[2].wait(timeout=180, poll=0.5)
    assert sweep.state == "SUCCEEDED"
    done = export_sweep(client, sweep.id, tracking_uri=mlflow_server)
    parent = tracker.get_run(done.run_id)
    assert parent.data.tags["trainyard.sweep_id"] == str(sweep.id)
    assert "search.space.updater.lr.base.loguniform.0" in parent.data.params
    nested = tracker.search_runs(
        [parent.info.experiment_id], f"tags.mlflow.parentRunId = '{done.run_id}'"
    )
    trials = {int(r.data.tags["trainyard.job_id"]): r for r in nested}
    assert set(trials) == {t.job_id for t in sweep.detail().trials} == set(done.trials)
    for trial in sweep.detail().trials:
        run_ = trials[trial.job_id]
        assert float(run_.data.params["updater.lr.base"]) == pytest.approx(
            trial.params["updater.lr.base"]
        )
        assert run_.data.metrics["val/accuracy"] == pytest.approx(trial.value)


def test_exports_and_downloads_say_what_is_wrong(
    stack: RunningStack, jobs: tuple[Job, Job], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    job = str(jobs[0].id)
    both = run(stack, "mlflow", "export", job, "--sweep", "1", "--tracking-uri", "http://x")
    assert both.exit_code == 2 and "one of them" in both.output
    mixed = run(stack, "download", job, "--tensorboard", str(tmp_path), "--best")
    assert mixed.exit_code == 2 and "leave out --step and --best" in mixed.output
    monkeypatch.setitem(sys.modules, "mlflow", None)  # as if not installed
    missing = run(stack, "mlflow", "export", job, "--tracking-uri", "http://127.0.0.1:9")
    assert missing.exit_code == 1
    assert "pip install 'trainyard[mlflow]'" in missing.output
