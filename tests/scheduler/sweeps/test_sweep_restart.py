"""A sweep survives SIGKILL of the API and the scheduler: the processes of `trainyard up`
(scheduler/cli/stack.py: API server, scheduler, node agent as child processes, a private Redis and a
SQLite file) with the API's and the scheduler's process groups killed mid-sweep and started
again. No trial is lost and none runs twice."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from sqlalchemy import func, select

from contract.settings import Settings
from scheduler.cli.redis_server import free_port
from scheduler.cli.stack import CHILDREN, HEALTH_PATH, Child, Stack
from scheduler.store.database import Database
from scheduler.store.models import Allocation, Job
from tests.scheduler.sweeps.test_sweep_cluster import BASE
from trainyard import Client

pytestmark = pytest.mark.slow

SWEEP = (
    BASE.replace("train_steps: 60", "train_steps: 400")
    + """
search:
  metric: test/accuracy
  mode: max
  algorithm: tpe
  max_trials: 4
  max_parallel: 2
  seed: 2
  space:
    updater.lr.base: {loguniform: [0.01, 0.3]}
    neuralnet.layers.fc1.units: {choice: [16, 32]}
"""
)


@pytest.fixture
def stack(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Stack]:
    for key in [k for k in os.environ if k.startswith(("TRAINYARD_", "REDIS_", "DATABASE_URL"))]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("TRAINYARD_NODE_SLOTS", "2")
    monkeypatch.setenv("TRAINYARD_HEARTBEAT_SECONDS", "1")
    running = Stack(Settings(data_dir=tmp_path / "data", port=free_port()), say=lambda _: None)
    running.start()
    try:
        yield running
    finally:
        running.stop()


def kill_and_restart(stack: Stack, names: tuple[str, ...]) -> None:
    """SIGKILL the children's process groups (no shutdown code runs), then start them again."""
    env = stack.child_env()
    for child in [c for c in stack.children if c.name in names]:
        os.killpg(child.process.pid, signal.SIGKILL)
        child.process.wait(timeout=10)
        child.log.close()
        stack.children.remove(child)
    for name in names:
        log_path = stack.data_dir / "logs" / f"{name}.log"
        log = log_path.open("ab")
        process = subprocess.Popen(
            [sys.executable, "-m", "scheduler", *CHILDREN[name]],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        stack.children.append(Child(name, process, log_path, log))
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(stack.url + HEALTH_PATH, timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, "the API did not come back"
        time.sleep(0.2)


def test_killing_the_api_and_scheduler_mid_sweep_loses_and_repeats_no_trial(
    stack: Stack,
) -> None:
    client = Client(stack.url, stack.token)
    sweep = client.submit(SWEEP)
    deadline = time.monotonic() + 120
    while not any(t.state == "RUNNING" and t.step > 0 for t in sweep.trials()):
        assert time.monotonic() < deadline, sweep.trials()
        time.sleep(0.2)
    kill_and_restart(stack, ("api", "scheduler"))
    ended = Client(stack.url, stack.token).sweep(sweep.id).wait(timeout=240, poll=0.5)
    assert ended.state == "SUCCEEDED", ended.info
    trials = ended.trials()
    assert [t.number for t in trials] == [0, 1, 2, 3]  # none lost
    assert all(t.state == "SUCCEEDED" and t.step == 400 for t in trials), trials
    db = Database(stack.settings.sql_url())
    try:
        with db.session() as session:
            jobs = session.scalar(select(func.count()).where(Job.sweep_id == sweep.id))
            placed = session.execute(
                select(Allocation.job_id, func.count())
                .where(Allocation.job_id.in_([t.job_id for t in trials]))
                .group_by(Allocation.job_id)
            ).all()
    finally:
        db.dispose()
    assert jobs == 4  # no trial got a second job
    assert sorted(count for _, count in placed) == [1, 1, 1, 1]  # and none was placed twice
    best = ended.best()
    assert best is not None and best.value == max(t.value or 0.0 for t in trials)
