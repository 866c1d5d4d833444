"""Batch prediction on a real stack: a job's model scores an uploaded dataset on 2 workers, as
`trainyard predict --input` scores it here; a worker SIGKILLed mid-run is restarted and the
output is still whole and in order; other users' runs answer 404; bad requests 4xx."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pytest
import redis
from typer.testing import CliRunner

from contract.allocation import PID
from contract.codec import decode
from contract.keys import Keys
from scheduler.cli.stack import read_stack_file
from tests.conftest import EXAMPLES
from trainyard import Client, Job
from trainyard.cli import app
from trainyard.errors import TrainyardError

if TYPE_CHECKING:
    from conftest import RunningStack

pytestmark = pytest.mark.slow

QUICK = {"train_steps": 40, "test.freq": 20, "checkpoint.freq": 20, "checkpoint.keep_best": True}


@pytest.fixture(scope="module")
def client(stack: RunningStack) -> Client:
    return Client(stack.url, stack.token)


@pytest.fixture(scope="module")
def job(client: Client) -> Job:
    submitted = client.submit(EXAMPLES / "digits_mlp.yaml", overrides=QUICK)
    assert isinstance(submitted, Job)
    done = submitted.wait(timeout=180, poll=0.2)
    assert done.state == "SUCCEEDED", done.error
    return done


@pytest.fixture(scope="module")
def samples(client: Client, tmp_path_factory: pytest.TempPathFactory) -> np.ndarray:
    """An uploaded dataset of digits-shaped samples (64 values each), `digits-many`."""
    rng = np.random.default_rng(0)
    x = rng.uniform(0, 16, size=(40_000, 64)).astype(np.float32)
    path = tmp_path_factory.mktemp("datasets") / "many.npz"
    np.savez(path, x=x)
    client.upload_dataset(path, "digits-many")
    return x


def env_of(stack: RunningStack, tmp_path: Path) -> dict[str, str]:
    """The CLI's environment: the stack's address and token, its own cache of checkpoints."""
    return {
        "TRAINYARD_URL": stack.url,
        "TRAINYARD_TOKEN": stack.token,
        "TRAINYARD_DATA_DIR": str(tmp_path / "client"),
        "COLUMNS": "200",
    }


def scores_here(env: dict[str, str], job: Job, x: np.ndarray, tmp_path: Path) -> np.ndarray:
    """What `trainyard predict JOB --input` writes for the samples, on this machine."""
    source, out = tmp_path / "x.npy", tmp_path / "here.npy"
    np.save(source, x)
    result = CliRunner().invoke(
        app, ["predict", str(job.id), "--input", str(source), "--output", str(out)], env=env
    )
    assert result.exit_code == 0, result.output
    return np.load(out)


def test_two_workers_score_as_trainyard_predict_does(
    stack: RunningStack, job: Job, samples: np.ndarray, tmp_path: Path
) -> None:
    env = env_of(stack, tmp_path)
    out = tmp_path / "cluster.npy"
    args = ["predict", str(job.id), "--dataset", "digits-many", "--workers", "2"]
    result = CliRunner().invoke(app, [*args, "--output", str(out)], env=env)
    assert result.exit_code == 0, result.output
    cluster = np.load(out)
    assert cluster.shape == (len(samples), 10)
    np.testing.assert_allclose(cluster, scores_here(env, job, samples, tmp_path), atol=1e-4)
    runs = job.predictions()
    assert runs[0].state == "SUCCEEDED" and runs[0].progress == 1.0
    assert runs[0].info.workers == 2 and runs[0].info.rows == len(samples)
    # Placed work like a job: its workers were allocations of the run's own job.
    assert job.client.job(runs[0].info.run_job_id).info.kind == "prediction"


def test_a_killed_worker_is_restarted_and_the_output_is_whole(
    stack: RunningStack, job: Job, samples: np.ndarray
) -> None:
    # One sample at a time: the workers run for seconds, long enough to kill one mid-run.
    run = job.predict_dataset("digits-many", workers=2, batch_size=1)
    found = read_stack_file(stack.data_dir / "stack.json")
    assert found is not None
    client, keys = redis.Redis.from_url(found.redis_url), Keys("trainyard")
    victim = None
    deadline = time.monotonic() + 60
    while victim is None and time.monotonic() < deadline:
        for key in client.scan_iter(keys.allocation(0).replace(":0", ":*")):
            fields = decode(client.hgetall(key))
            ours = fields.get("job_id") == str(run.info.run_job_id) and fields.get("rank") == "1"
            if ours and fields.get(PID) and run.refresh().info.rows_done > 0:
                victim = int(fields[PID])
        time.sleep(0.05)
    assert victim is not None, run.refresh()
    assert run.refresh().state == "RUNNING", "the run ended before its worker was killed"
    os.kill(victim, signal.SIGKILL)
    done = run.wait(timeout=180, poll=0.3)
    assert done.state == "SUCCEEDED", done.info.error
    events = [e.reason for e in job.client.job(done.info.run_job_id).events()]
    assert any("scoring its shard again" in reason for reason in events), events
    scores = done.scores()
    assert scores.shape == (len(samples), 10)
    expected = job.predict(samples)
    np.testing.assert_allclose(scores, expected, atol=1e-4)  # every row, in input order


def test_other_users_runs_answer_404_and_bad_requests_4xx(
    stack: RunningStack, client: Client, job: Job, samples: np.ndarray
) -> None:
    run = job.predict_dataset("digits-many", workers=1)
    created = subprocess.run(
        [sys.executable, "-m", "scheduler", "admin", "create-user", "predict-stranger"],
        env=stack.env(),
        capture_output=True,
        text=True,
        check=True,
    )
    stranger = Client(stack.url, created.stdout.strip())
    for path in (f"/predictions/{run.id}", f"/predictions/{run.id}/output"):
        assert stranger.http.get(path).status_code == 404
    body = {"dataset": "digits-many", "workers": 1}
    assert stranger.http.post(f"/jobs/{job.id}/predictions", json=body).status_code == 404
    bad = [
        {"dataset": "no-such-data", "workers": 1},  # 404: not one of yours
        {"dataset": "digits-many", "workers": 0},
        {"dataset": "digits-many", "workers": 99},  # past max_prediction_workers
        {"dataset": "digits-many", "checkpoint": "soonest"},
        {"dataset": "../etc", "workers": 1},
    ]
    for body in bad:
        response = client.http.post(f"/jobs/{job.id}/predictions", json=body)
        assert 400 <= response.status_code < 500, (body, response.text)
    with pytest.raises(TrainyardError):
        client.predict_dataset(job.id, "digits-many", checkpoint=999_999)
    assert run.wait(timeout=120, poll=0.3).state == "SUCCEEDED"

    # A registered model scores where a job does: the same checkpoint, the same scores.
    client.register_model("predict-digits", job)
    by_model = client.predict_dataset("model:predict-digits@1", "digits-many", workers=2)
    # listed on its source job's page too (the job the model was registered from)
    assert by_model.info.model == "predict-digits@1" and by_model.info.job_id == job.id
    assert by_model.wait(timeout=120, poll=0.3).state == "SUCCEEDED"
    np.testing.assert_allclose(by_model.scores(), run.scores(), atol=1e-6)
    with pytest.raises(TrainyardError):  # a model is one checkpoint
        client.predict_dataset("model:predict-digits@1", "digits-many", checkpoint="latest")


def test_a_cnn_scores_on_two_workers_as_load_model_does(client: Client, tmp_path: Path) -> None:
    """examples/mnist1d_cnn.yaml (convolutions, pooling, a reshape) through the SDK: the cluster's
    2-worker scores equal the loaded module's on this machine."""
    submitted = client.submit(EXAMPLES / "mnist1d_cnn.yaml", overrides=QUICK)
    assert isinstance(submitted, Job)
    job = submitted.wait(timeout=180, poll=0.2)
    assert job.state == "SUCCEEDED", job.error
    x = np.random.default_rng(1).standard_normal((3000, 1, 40)).astype(np.float32)
    np.savez(tmp_path / "signals.npz", x=x)
    client.upload_dataset(tmp_path / "signals.npz", "signals")
    run = job.predict_dataset("signals", workers=2).wait(timeout=180, poll=0.2)
    assert run.state == "SUCCEEDED", run.info
    np.testing.assert_allclose(run.scores(), job.predict(x), atol=1e-4)
