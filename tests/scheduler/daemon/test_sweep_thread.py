"""The sweep thread's passes and the ingester's pruning, on both SQL backends with a real Redis
and real Optuna storage (trial jobs are ended by hand here; test_sweep_cluster.py runs them on a
node agent)."""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from sqlalchemy import select

from contract.keys import Keys
from contract.settings import Settings
from contract.stream import JobStream, MetricRecord
from scheduler.admission.sweep_checks import check_sweep
from scheduler.daemon.sweep_thread import SweepRunner, TrialPruning
from scheduler.ingest.ingester import Ingester
from scheduler.store.database import Database
from scheduler.store.errors import Conflict
from scheduler.store.lifecycle import transition
from scheduler.store.models import Job, JobEvent, Sweep
from scheduler.store.states import JobState, SweepState
from scheduler.store.sweeps import create_sweep, request_sweep_cancel, trials
from scheduler.store.users import create_user, get_user
from scheduler.sweeps.study import close_storages

ROOT = Path(__file__).resolve().parents[3]
BASE = (
    (ROOT / "examples" / "digits_mlp.yaml")
    .read_text()
    .replace("train_steps: 2000", "train_steps: 100")
    .replace("test: {freq: 500}", "test: {freq: 10}")
)
SEARCH = """
search:
  metric: test/accuracy
  mode: max
  algorithm: random
  max_trials: 4
  max_parallel: 2
  seed: 3
  space:
    updater.lr.base: {loguniform: [0.01, 0.3]}
    neuralnet.layers.fc1.units: {choice: [16, 32]}
"""


@pytest.fixture
def env(migrated_sql_url: str, redis_url: str, tmp_path: Path, cache_dir: Path) -> Iterator[Env]:
    sql_url = migrated_sql_url
    db = Database(sql_url)
    client = redis.Redis.from_url(redis_url)
    settings = Settings(
        data_dir=tmp_path, database_url=sql_url, redis_prefix=f"t{uuid.uuid4().hex[:8]}"
    )
    (tmp_path / "cache").symlink_to(cache_dir)  # digits: described once per session
    yield Env(db, client, Keys(settings.redis_prefix), settings)
    close_storages()
    client.close()
    db.dispose()


class Env:
    def __init__(self, db: Database, client: redis.Redis, keys: Keys, settings: Settings) -> None:
        self.db, self.client, self.keys, self.settings = db, client, keys, settings

    def submit(self, search: str = SEARCH, base: str = BASE) -> int:
        text = base + search
        with self.db.session() as session:
            owner = get_user(session, "ann") or create_user(session, "ann")
            checked = check_sweep(
                text,
                session=session,
                owner=owner,
                cache_dir=self.settings.cache_dir(),
                base_dir=ROOT,
                artifacts=self.settings.artifacts(),
            )
            sweep = create_sweep(
                session, owner, checked.to_new_sweep(spec_yaml=text, overrides={}, base_dir=ROOT)
            )
            return sweep.id

    def runner(self) -> SweepRunner:
        return SweepRunner(self.db, self.settings, self.client, self.keys)

    def sweep(self, sweep_id: int) -> Sweep:
        with self.db.session() as session:
            return session.get_one(Sweep, sweep_id)

    def trials(self, sweep_id: int) -> list[Job]:
        with self.db.session() as session:
            return trials(session, sweep_id)

    def end(self, job_id: int, state: JobState, accuracy: float | None = None) -> None:
        """End a trial job as its processes would have."""
        with self.db.session() as session:
            job = session.get_one(Job, job_id)
            if accuracy is not None:
                job.summary = {"test/accuracy": accuracy, "train/loss": 1.0}
            transition(session, job, JobState.SCHEDULED, "placed")
            transition(session, job, JobState.RUNNING, "started")
            transition(session, job, state, "ended")


def test_trials_are_asked_queued_told_and_the_best_recorded(env: Env) -> None:
    sweep_id = env.submit()
    runner = env.runner()
    assert runner.run_once() == 2  # trials created: the scheduling loop places them at once
    # Checked (compiled) in a process of their own, off the scheduler's placement thread.
    assert runner.checked_in not in (0, os.getpid())
    first = env.trials(sweep_id)
    assert [(j.trial_number, j.state, j.sweep_id) for j in first] == [
        (0, JobState.QUEUED, sweep_id),
        (1, JobState.QUEUED, sweep_id),
    ]  # max_parallel 2
    for job in first:
        assert set(job.overrides) == {"updater.lr.base", "neuralnet.layers.fc1.units"}
        assert 0.01 <= job.overrides["updater.lr.base"] <= 0.3
        assert job.spec["updater"]["lr"]["base"] == job.overrides["updater.lr.base"]
        assert "search" not in job.spec and job.name == f"digits-mlp-trial{job.trial_number}"
    assert runner.run_once() == 0
    assert len(env.trials(sweep_id)) == 2  # nothing ended: nothing new
    env.end(first[0].id, JobState.SUCCEEDED, accuracy=0.8)
    env.end(first[1].id, JobState.FAILED)
    runner.run_once()
    assert env.sweep(sweep_id).best_trial == 0 and env.sweep(sweep_id).best_value == 0.8
    rest = env.trials(sweep_id)[2:]
    assert [j.trial_number for j in rest] == [2, 3]
    runner.run_once()
    assert len(env.trials(sweep_id)) == 4  # max_trials
    env.end(rest[0].id, JobState.SUCCEEDED, accuracy=0.9)
    env.end(rest[1].id, JobState.SUCCEEDED, accuracy=0.7)
    runner.run_once()
    sweep = env.sweep(sweep_id)
    assert (sweep.state, sweep.best_trial, sweep.best_value) == (SweepState.SUCCEEDED, 2, 0.9)
    assert sweep.ended_at is not None


def test_a_restart_between_ask_and_job_loses_and_repeats_nothing(env: Env) -> None:
    sweep_id = env.submit()
    env.runner().run_once()
    # The scheduler stopped after Optuna numbered a trial and before its job was written.
    with env.db.session() as session:
        study = env.runner().studies.get(session.get_one(Sweep, sweep_id))
    orphan = study.ask()
    restarted = env.runner()
    restarted.run_once()
    jobs = env.trials(sweep_id)
    assert [j.trial_number for j in jobs] == [0, 1, 2]  # its job now exists, and no other
    assert jobs[2].overrides == orphan.params
    restarted.run_once()
    assert len(env.trials(sweep_id)) == 3  # 3 live, though max_parallel is 2: none more


def test_cancelling_a_sweep_cancels_its_trials(env: Env) -> None:
    sweep_id = env.submit()
    runner = env.runner()
    runner.run_once()
    with env.db.session() as session:
        sweep = session.get_one(Sweep, sweep_id)
        request_sweep_cancel(session, sweep, env.client, env.keys)
    assert [j.state for j in env.trials(sweep_id)] == [JobState.CANCELLED] * 2  # were queued
    runner.run_once()
    sweep = env.sweep(sweep_id)
    assert sweep.state == SweepState.CANCELLED and len(env.trials(sweep_id)) == 2
    with env.db.session() as session, pytest.raises(Conflict):
        request_sweep_cancel(session, session.get_one(Sweep, sweep_id), env.client, env.keys)


def test_a_trial_that_is_no_valid_job_fails_the_sweep(env: Env) -> None:
    sweep_id = env.submit()
    with env.db.session() as session:  # as if the base job had changed under the sweep
        sweep = session.get_one(Sweep, sweep_id)
        sweep.base_job = {**sweep.base_job, "train_steps": 0}
    env.runner().run_once()
    sweep = env.sweep(sweep_id)
    assert sweep.state == SweepState.FAILED and env.trials(sweep_id) == []
    assert sweep.error is not None and sweep.error.startswith("trial 0 with {")
    assert "train_steps: Input should be greater than 0" in sweep.error


def test_a_trailing_trial_is_pruned_at_its_rung_as_its_metrics_arrive(env: Env) -> None:
    """The sweep selects on the base job's objective, val/accuracy: its pruner reads that, not
    the test figures (which here rank the trials the other way round)."""
    pruned = SEARCH.replace(
        "max_parallel: 2", "max_parallel: 2\n  pruner: {type: asha, min_steps: 20}"
    ).replace("  metric: test/accuracy\n  mode: max\n", "")
    held_out = BASE.replace("test_fraction: 0.2}", "test_fraction: 0.2, validation_fraction: 0.1}")
    sweep_id = env.submit(pruned, held_out.replace("test: {freq: 10}", "validate: {freq: 10}"))
    env.runner().run_once()
    leader, trailing = env.trials(sweep_id)
    trial_ended = threading.Event()  # the sweep thread's cue to ask for the next trial
    ingester = Ingester(
        env.db,
        env.client,
        env.keys,
        pruning=TrialPruning(env.db, env.settings.sql_url()),
        trial_ended=trial_ended,
    )

    def report(job: Job, *points: tuple[int, float]) -> None:
        stream = JobStream(env.client, env.keys, job.id)
        for step, value in points:
            stream.publish(MetricRecord(step, {"val/accuracy": value, "test/accuracy": 1 - value}))
        while ingester.run_once():
            pass

    for job in (leader, trailing):
        with env.db.session() as session:
            row = session.get_one(Job, job.id)
            transition(session, row, JobState.SCHEDULED, "placed")
            transition(session, row, JobState.RUNNING, "started")
    report(leader, (10, 0.5), (20, 0.9), (40, 0.95))
    report(trailing, (10, 0.2))  # below the first rung: never stopped
    with env.db.session() as session:
        assert session.get_one(Job, trailing.id).state == JobState.RUNNING
    assert not trial_ended.is_set()
    report(trailing, (20, 0.3))
    assert trial_ended.is_set()
    with env.db.session() as session:
        job = session.get_one(Job, trailing.id)
        assert (job.state, job.pruned_step) == (JobState.PRUNED, 20)
        reason = session.scalars(
            select(JobEvent.reason).where(JobEvent.job_id == job.id).order_by(JobEvent.id)
        ).all()[-1]
    assert reason.startswith("pruned at step 20 by the sweep's asha pruner: val/accuracy 0.3")
    assert env.client.get(env.keys.cancel(trailing.id)) == b"1"  # its processes stop on it
    with env.db.session() as session:
        assert session.get_one(Job, leader.id).state == JobState.RUNNING
