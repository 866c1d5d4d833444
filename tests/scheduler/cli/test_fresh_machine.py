"""A new user's machine: no system Redis, no SQL server. `trainyard up` with every redis-server
and valkey-server hidden from PATH and no REDIS_URL or DATABASE_URL starts the Valkey server its
own package brought, and runs every kind of job there to the end: a 2-worker all-reduce job
(each worker its own Redis user, whose key selectors Redis 6.2 refused), a 2-stage pipeline and
a 4-trial sweep."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from trainyard import Client, Job
from trainyard.sweeps import Sweep

if TYPE_CHECKING:
    from conftest import RunningStack

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = ROOT / "examples"
SERVERS = ("redis-server", "valkey-server", "redis-cli", "valkey-cli")
WAIT_SECONDS = 600.0  # generous: a busy 2-core machine is slow, never stuck


def path_without_redis(shims: Path) -> str:
    """A PATH with what ours has, less any Redis or Valkey binary: one folder of links to
    every other command (Debian's /usr/bin holds redis-server beside python and sh)."""
    shims.mkdir(parents=True, exist_ok=True)
    for folder in os.environ["PATH"].split(os.pathsep):
        if not os.path.isdir(folder):
            continue
        for entry in os.scandir(folder):
            target = shims / entry.name
            if entry.name in SERVERS or target.exists() or not os.access(entry.path, os.X_OK):
                continue
            target.symlink_to(entry.path)
    path = str(shims)
    assert all(shutil.which(name, path=path) is None for name in SERVERS)
    return path


@pytest.fixture(scope="module")
def fresh(
    stack_factory: Callable[..., RunningStack], tmp_path_factory: pytest.TempPathFactory
) -> RunningStack:
    shims = tmp_path_factory.mktemp("path") / "bin"
    return stack_factory(env={"PATH": path_without_redis(shims)})


@pytest.fixture(scope="module")
def client(fresh: RunningStack) -> Client:
    return Client(fresh.url, fresh.token)


def test_the_stack_says_which_redis_it_started(fresh: RunningStack) -> None:
    said = fresh.output_text()
    assert "redis: valkey 9." in said and "bundled with Trainyard" in said, said


@pytest.mark.parametrize(
    ("example", "overrides"),
    [
        # two workers, each logged in as the job's Redis user
        ("mnist1d_allreduce", {"train_steps": 40, "test.freq": 40, "checkpoint.freq": 0}),
        ("digits_cnn_pipeline", {"train_steps": 20, "test.freq": 20}),  # two stages
    ],
)
def test_a_multi_process_job_succeeds(
    client: Client, example: str, overrides: dict[str, int]
) -> None:
    job = client.submit(EXAMPLES / f"{example}.yaml", overrides={**overrides, "disp_freq": 10})
    assert isinstance(job, Job)
    ended = job.wait(timeout=WAIT_SECONDS)
    assert ended.state == "SUCCEEDED", (ended.state, ended.error)
    assert ended.summary["test/accuracy"] > 0.0


def test_a_four_trial_sweep_succeeds(client: Client) -> None:
    sweep = client.submit(
        EXAMPLES / "mnist1d_sweep.yaml",
        overrides={
            "train_steps": 40,
            "validate.freq": 20,
            "disp_freq": 10,
            "search.max_trials": 4,
            "search.pruner.min_steps": 20,
        },
    )
    assert isinstance(sweep, Sweep)
    ended = sweep.wait(timeout=WAIT_SECONDS)
    assert ended.state == "SUCCEEDED", ended
    trials = ended.trials()
    assert len(trials) == 4
    assert all(t.state in ("SUCCEEDED", "PRUNED") for t in trials), trials
    assert any(t.state == "SUCCEEDED" for t in trials)
