"""The SDK against a real stack (`trainyard up`: Redis, SQLite, API, scheduler, node agent)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pytest
import redis
import sqlalchemy as sa
import yaml
from safetensors import safe_open

from contract.settings import Settings
from scheduler.cli.redis_server import free_port
from trainyard import (
    AuthError,
    Client,
    Conflict,
    Job,
    JobSpecRejected,
    NotFound,
    RequestRejected,
    TrainyardError,
    Unreachable,
    WaitTimeout,
)
from trainyard.connection import client_file, resolve_connection, write_private_json

if TYPE_CHECKING:
    from conftest import RunningStack

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow

DIGITS = ROOT / "examples" / "digits_mlp.yaml"
QUICK = {
    "train_steps": 60,
    "disp_freq": 10,
    "test.freq": 30,
    "checkpoint.freq": 30,
    "checkpoint.keep": 5,
}


@pytest.fixture(scope="module")
def client(stack: RunningStack) -> Client:
    return Client(stack.url, stack.token)


@pytest.fixture(scope="module")
def finished(client: Client) -> Job:
    """One short digits job, run to the end; several tests read it."""
    job = client.submit(DIGITS, overrides=QUICK)
    return job.wait(timeout=120, poll=0.2)


def wait_for_state(job: Job, states: set[str], timeout: float = 60.0) -> Job:
    deadline = time.monotonic() + timeout
    while job.refresh().state not in states:
        assert time.monotonic() < deadline, f"job {job.id} stuck in {job.state}"
        time.sleep(0.1)
    return job


def test_submit_wait_and_read_the_results(finished: Job) -> None:
    assert finished.state == "SUCCEEDED", finished.error
    assert finished.step == 60
    assert finished.info.train_steps == 60
    assert 0.0 <= finished.summary["test/accuracy"] <= 1.0
    loss = finished.metrics("train/loss")
    assert [step for step, _ in loss] == [10, 20, 30, 40, 50, 60]
    assert all(np.isfinite(value) for _, value in loss)
    assert loss[-1][1] < loss[0][1]  # it learned something
    assert "test/accuracy" in finished.metric_names()
    assert finished.metrics("train/loss", max_points=2)[-1] == loss[-1]
    # A name the finished job never reported: refused, with what was meant.
    with pytest.raises(NotFound, match=r"no metric 'train/los'; did you mean 'train/loss'\?"):
        finished.metrics("train/los")


def test_events_record_the_lifecycle(finished: Job) -> None:
    states = [event.state for event in finished.events()]
    assert states[0] == "QUEUED"
    assert states[-1] == "SUCCEEDED"
    assert states.index("SCHEDULED") < states.index("RUNNING") < states.index("SUCCEEDED")


def test_download_checkpoint(finished: Job, tmp_path: Path) -> None:
    steps = [c.step for c in finished.checkpoints()]
    assert 60 in steps and 30 in steps
    newest = finished.download_checkpoint(tmp_path)
    assert newest == tmp_path / "step-00000060.safetensors"
    with safe_open(str(newest), framework="pt") as handle:
        assert handle.metadata()["step"] == "60"
        assert {"param/fc1/w", "param/fc3/b"} <= set(handle.keys())
    older = finished.download_checkpoint(tmp_path / "older", step=30)
    assert older.name == "step-00000030.safetensors"
    with pytest.raises(NotFound):
        finished.download_checkpoint(tmp_path, step=7)


def test_a_failing_job_reports_why_and_logs(client: Client) -> None:
    # A huge learning rate makes the loss diverge: the trainer logs it and the job fails at
    # once with the cause. Its restarts would diverge the same way, so there are none.
    job = client.submit(str(DIGITS), overrides={**QUICK, "updater.lr.base": 1e38})
    job.wait(timeout=120, poll=0.2)
    assert job.state == "FAILED" and job.info.restarts == 0
    assert job.error and "the loss diverged; not restarted" in job.error
    assert any("training diverged" in line for line in job.logs())


def test_cancel_a_running_job(client: Client) -> None:
    job = client.submit(DIGITS.read_text(), overrides={"train_steps": 10_000_000})
    wait_for_state(job, {"RUNNING"})
    started = time.monotonic()
    job.cancel()
    with pytest.raises(WaitTimeout):
        Job(client, job.info).wait(timeout=0.0)
    job.wait(timeout=30, poll=0.1)
    assert job.state == "CANCELLED"
    assert time.monotonic() - started < 15
    with pytest.raises(Conflict):
        job.cancel()
    # Its slots are free again.
    cluster = client.cluster()
    assert all(node.slots_used == 0 for node in cluster.nodes)
    assert job.id not in {running.job_id for running in cluster.running}


def test_submit_a_mapping_with_priority(client: Client) -> None:
    document = yaml.safe_load(DIGITS.read_text())
    document["name"] = "from-a-dict"
    job = client.submit(document, overrides={"train_steps": 10_000_000}, priority=5)
    assert job.name == "from-a-dict"
    assert job.info.priority == 5
    job.cancel()
    assert job.wait(timeout=30, poll=0.1).state == "CANCELLED"


def test_jobs_pages_through_everything(client: Client, finished: Job) -> None:
    every = list(client.jobs(page_size=1))
    ids = [job.id for job in every]
    assert finished.id in ids
    assert ids == sorted(ids, reverse=True)
    assert len(ids) == len(set(ids))
    succeeded = list(client.jobs(state="SUCCEEDED"))
    assert finished.id in {job.id for job in succeeded}
    assert all(job.state == "SUCCEEDED" for job in succeeded)
    by_name = list(client.jobs(name="digits-mlp"))
    # The name matches anywhere in a name (a batch prediction run of it is `predict-digits-mlp`).
    assert by_name and all("digits-mlp" in job.name for job in by_name)


def test_cluster_shows_the_node(client: Client) -> None:
    cluster = client.cluster()
    assert len(cluster.nodes) == 1
    node = cluster.nodes[0]
    assert node.state == "ALIVE"
    assert node.slots == 2


def test_upload_a_dataset_and_train_on_it(client: Client, tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(200, 8)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64)
    path = tmp_path / "blobs.npz"
    np.savez(path, x=x, y=y)
    info = client.upload_dataset(path, "blobs")
    assert (info.name, info.kind) == ("blobs", "npz")
    assert "blobs" in {d.name for d in client.datasets()}
    document = yaml.safe_load(DIGITS.read_text())
    document["data"] = {"source": "dataset", "name": "blobs", "batch_size": 20}
    job = client.submit(document, overrides={**QUICK, "test.freq": 0})
    assert job.wait(timeout=120, poll=0.2).state == "SUCCEEDED", job.error


def test_an_invalid_job_raises_located_errors(client: Client) -> None:
    text = (
        DIGITS.read_text().replace("units: 256", "units: -3").replace("type: stanh", "type: stahn")
    )
    with pytest.raises(JobSpecRejected) as caught:
        client.submit(text)
    error = caught.value
    assert error.status == 422
    paths = [issue.path for issue in error.errors]
    assert any("units" in p for p in paths) or any("type" in p for p in paths)
    assert all(issue.line for issue in error.errors)
    assert "hint" in str(error) or all(not issue.hint for issue in error.errors)
    assert str(error.errors[0].line) in str(error)


def test_typed_errors(client: Client, stack: RunningStack) -> None:
    with pytest.raises(NotFound):
        client.job(999_999)
    with pytest.raises(AuthError) as caught, Client(stack.url, "not-a-token") as stranger:
        list(stranger.jobs())
    assert caught.value.status == 401
    with pytest.raises(Unreachable), Client(f"http://127.0.0.1:{free_port()}", "x") as nobody:
        nobody.job(1)
    with pytest.raises(TrainyardError, match="no such job file"):
        client.submit("missing.yaml")
    with pytest.raises(RequestRejected) as bad_query:
        client.get_json("/jobs", limit=0)
    assert bad_query.value.status == 422
    assert not isinstance(bad_query.value, JobSpecRejected)
    with pytest.raises(RequestRejected) as too_big:
        client.submit("# padding\n" * 200_000 + DIGITS.read_text())
    assert too_big.value.status == 413


def test_client_finds_the_local_stack(stack: RunningStack, finished: Job) -> None:
    settings = Settings(data_dir=stack.data_dir)
    with Client(settings=settings) as found:
        assert found.url == stack.url
        assert found.job(finished.id).state == "SUCCEEDED"


def test_connection_precedence(tmp_path: Path) -> None:
    write_private_json(
        tmp_path / "stack.json", {"url": "http://stack", "token": "s", "redis_url": "r"}
    )
    bare = Settings(data_dir=tmp_path)
    assert resolve_connection(bare).model_dump() == {"url": "http://stack", "token": "s"}
    write_private_json(client_file(bare), {"url": "http://login", "token": "l"})
    assert resolve_connection(bare).model_dump() == {"url": "http://login", "token": "l"}
    env = Settings(data_dir=tmp_path, url="http://env", token="e")
    assert resolve_connection(env).model_dump() == {"url": "http://env", "token": "e"}
    # A token is only sent to the server it was saved for.
    other = Settings(data_dir=tmp_path, url="http://stack")
    assert resolve_connection(other).token == "s"
    unknown = Settings(data_dir=tmp_path, url="http://elsewhere")
    assert resolve_connection(unknown).token is None
    assert (tmp_path / "client.json").stat().st_mode & 0o777 == 0o600


MACHINE_REDIS = "redis://127.0.0.1:6379/0"


def test_the_sdk_on_postgresql_and_the_machines_redis(
    stack_factory: Callable[..., RunningStack], postgres_url: str | None
) -> None:
    """`trainyard up` on existing services: the machine's Redis (own key prefix) and PostgreSQL."""
    if postgres_url is None:
        pytest.skip("PostgreSQL at 127.0.0.1:5432 is unreachable")
    machine = redis.Redis.from_url(MACHINE_REDIS)
    try:
        machine.ping()
    except redis.ConnectionError:
        pytest.skip(f"no Redis at {MACHINE_REDIS}")
    engine = sa.create_engine(postgres_url)
    with engine.begin() as conn:  # this test owns the session's database while it runs
        conn.execute(sa.text("DROP SCHEMA public CASCADE; CREATE SCHEMA public"))
    engine.dispose()
    prefix = f"trainyard-test-{uuid.uuid4().hex[:8]}"
    env = {"REDIS_URL": MACHINE_REDIS, "DATABASE_URL": postgres_url}
    stack = stack_factory(env={**env, "TRAINYARD_REDIS_PREFIX": prefix})
    try:
        assert not (stack.data_dir / "redis").exists()  # no embedded Redis
        assert not (stack.data_dir / "trainyard.db").exists()  # no SQLite
        with Client(stack.url, stack.token) as client:
            job = client.submit(DIGITS, overrides=QUICK).wait(timeout=120, poll=0.2)
            assert job.state == "SUCCEEDED", job.error
            assert [s for s, _ in job.metrics("train/loss")] == [10, 20, 30, 40, 50, 60]
            assert job.download_checkpoint(stack.data_dir / "out").stat().st_size > 0
            running = client.submit(DIGITS, overrides={"train_steps": 10_000_000})
            wait_for_state(running, {"RUNNING"}).cancel()
            assert running.wait(timeout=30, poll=0.1).state == "CANCELLED"
            assert machine.exists(f"{prefix}:nodes")
        assert stack.stop() == 0
    finally:
        stack.stop()
        keys = list(machine.scan_iter(f"{prefix}*")) + list(machine.scan_iter(f"*{prefix}.*"))
        if keys:
            machine.delete(*keys)
        machine.close()
