"""The ingester against a real Redis and both SQL backends: batches, no loss, XACK, job states."""

from __future__ import annotations

import math
import shutil
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis
from sqlalchemy import func, select

import contract.stream
from contract.allocation import AllocationState
from contract.keys import Keys
from contract.stream import (
    EventRecord,
    JobStream,
    LogRecord,
    MetricRecord,
    StateRecord,
    TimelineRecord,
    encode_record,
)
from scheduler.ingest.ingester import GROUP, Ingester, ingest_once
from scheduler.store.database import Database
from scheduler.store.jobs import NewJob, create_job, delete_job
from scheduler.store.lifecycle import transition
from scheduler.store.models import (
    Allocation,
    CheckpointRecord,
    Job,
    JobEvent,
    LogLine,
    Metric,
    Node,
    PipelineTimeline,
)
from scheduler.store.states import JobState
from scheduler.store.users import create_user, get_user

TOPOLOGY = {
    "framework": "local",
    "nworker_groups": 1,
    "nworkers_per_group": 2,
    "nserver_groups": 0,
    "nservers_per_group": 0,
    "server_worker_separate": False,
    "slots_per_worker": 1,
    "gpus_per_worker": 0,
    "workers": 2,
    "servers": 0,
}


@dataclass
class Env:
    db: Database
    client: redis.Redis
    keys: Keys

    def count(self, model: type) -> int:
        with self.db.session() as session:
            return int(session.scalar(select(func.count()).select_from(model)) or 0)

    def job(self, job_id: int) -> Job:
        with self.db.session() as session:
            job = session.get(Job, job_id)
            assert job is not None
            return job

    def allocation(self, alloc_id: int) -> Allocation:
        with self.db.session() as session:
            alloc = session.get(Allocation, alloc_id)
            assert alloc is not None
            return alloc

    def drain(self) -> int:
        """Ingest until a pass writes nothing; the points written."""
        total, ingester = 0, Ingester(self.db, self.client, self.keys)
        while written := ingester.run_once():
            total += written
        return total


def _env(sql_url: str, client: redis.Redis) -> Iterator[Env]:
    db = Database(sql_url)
    keys = Keys(f"test-{uuid.uuid4().hex[:8]}")
    yield Env(db, client, keys)
    db.dispose()
    for key in client.scan_iter(f"{keys.prefix}:*"):
        client.delete(key)


@pytest.fixture
def env(migrated_sql_url: str, redis_url: str) -> Iterator[Env]:
    client = redis.Redis.from_url(redis_url)
    yield from _env(migrated_sql_url, client)
    client.close()


def make_job(
    env: Env,
    *,
    state: JobState = JobState.RUNNING,
    workers: int = 2,
    max_restarts: int = 0,
    objective: tuple[str, str] = ("test/accuracy", "max"),
) -> tuple[int, list[int]]:
    """A job placed on one node with `workers` allocations; (job id, allocation ids). It is
    not restarted after a failure unless `max_restarts` says so."""
    with env.db.session() as session:
        owner = get_user(session, "alice") or create_user(session, "alice")
        job = create_job(
            session,
            owner,
            NewJob(
                name="ingest-test",
                spec_yaml="name: ingest-test",
                overrides={},
                spec={"name": "ingest-test", "cluster": {"max_restarts": max_restarts}},
                topology={**TOPOLOGY, "nworkers_per_group": workers, "workers": workers},
                framework="local",
                train_steps=100,
                objective=objective[0],
                objective_mode=objective[1],
            ),
        )
        node = session.scalar(select(Node).where(Node.name == "node-a"))
        if node is None:
            node = Node(name="node-a", queue="q.node-a", slots=8, gpus=0)
            session.add(node)
            session.flush()
        allocs = [
            Allocation(job_id=job.id, node_id=node.id, role="worker", group=0, rank=r, slots=1)
            for r in range(workers)
        ]
        session.add_all(allocs)
        session.flush()
        for target in (JobState.SCHEDULED, JobState.RUNNING):
            if JobState(job.state) != state:
                transition(session, job, target, "test")
        return job.id, [a.id for a in allocs]


def publish_metrics(env: Env, job_id: int, records: int, values: int = 2) -> int:
    """`records` metric records of `values` points each, sent in pipelines; the points."""
    stream = env.keys.job_stream(job_id)
    pipe = env.client.pipeline(transaction=False)
    for step in range(1, records + 1):
        record = MetricRecord(step, {f"m{i}": step + i / 10 for i in range(values)})
        pipe.xadd(stream, encode_record(record))  # type: ignore[arg-type]
        if step % 1000 == 0:
            pipe.execute()
    pipe.sadd(env.keys.streams_with_data, str(job_id))
    pipe.execute()
    return records * values


def pending(env: Env, job_id: int) -> int:
    info = env.client.xpending(env.keys.job_stream(job_id), GROUP)
    return int(info["pending"])


def test_metrics_are_written_in_batches_with_nothing_lost(env: Env) -> None:
    job_id, _ = make_job(env)
    points = publish_metrics(env, job_id, 7000)
    ingester = Ingester(env.db, env.client, env.keys)
    assert ingester.run_once() == 10_000  # one batch: 5000 records of 2 points
    assert pending(env, job_id) == 0  # acknowledged after the commit
    assert ingester.run_once() == 4_000
    assert ingester.run_once() == 0
    assert env.count(Metric) == points == 14_000
    assert int(env.client.get(env.keys.ingested_points) or 0) == points
    job = env.job(job_id)
    assert job.step == 7000
    assert job.summary == {"m0": 7000.0, "m1": 7000.1}
    with env.db.session() as session:
        query = select(Metric.value).where(Metric.job_id == job_id, Metric.name == "m1")
        values = session.scalars(query.order_by(Metric.step)).all()
    assert values[:2] == [1.1, 2.1] and len(values) == 7000


def test_records_read_before_a_crash_are_ingested_on_restart(env: Env) -> None:
    job_id, _ = make_job(env)
    publish_metrics(env, job_id, 300, values=1)
    stream = env.keys.job_stream(job_id)
    # A previous ingester read 200 records and died before committing them.
    env.client.xgroup_create(stream, GROUP, id="0", mkstream=True)
    env.client.xreadgroup(GROUP, "ingester", {stream: ">"}, count=200)
    assert pending(env, job_id) == 200
    assert ingest_once(env.db, env.client, env.keys) == 200  # the pending ones first
    assert ingest_once(env.db, env.client, env.keys) == 100
    assert env.count(Metric) == 300 and pending(env, job_id) == 0
    with env.db.session() as session:
        steps = session.scalars(select(Metric.step).order_by(Metric.step)).all()
    assert steps == list(range(1, 301))


def test_logs_checkpoints_and_malformed_records(env: Env, tmp_path: Path) -> None:
    job_id, _ = make_job(env)
    stream = JobStream(env.client, env.keys, job_id)
    for i in range(3):
        stream.publish(LogRecord(f"line {i}", rank=1))
    ckpt = tmp_path / "step-00000010.safetensors"
    ckpt.write_bytes(b"x" * 123)
    stream.publish(contract.stream.CheckpointRecord.of_file(10, ckpt))
    # Dropped, still acknowledged.
    env.client.xadd(env.keys.job_stream(job_id), {"kind": "metric", "step": "oops"})
    env.client.xadd(env.keys.job_stream(job_id), {"kind": "telemetry"})
    ingest_once(env.db, env.client, env.keys)
    assert pending(env, job_id) == 0
    with env.db.session() as session:
        lines = session.scalars(select(LogLine).order_by(LogLine.id)).all()
        [record] = session.scalars(select(CheckpointRecord)).all()
    assert [(line.line, line.rank) for line in lines] == [(f"line {i}", 1) for i in range(3)]
    assert (record.job_id, record.step, record.path, record.size) == (job_id, 10, str(ckpt), 123)
    # The same step saved again (a later attempt) updates the record instead of failing.
    ckpt.write_bytes(b"y" * 50)
    stream.publish(contract.stream.CheckpointRecord.of_file(10, ckpt))
    ingest_once(env.db, env.client, env.keys)
    with env.db.session() as session:
        [record] = session.scalars(select(CheckpointRecord)).all()
    assert record.size == 50


def timeline(step: int, group: int = 0, rank: int = 0) -> TimelineRecord:
    """A stage's two micro-batches, forwards then backwards, each `step` milliseconds long."""
    f, b = step / 1000, 2 * step / 1000
    events = (
        ("F", 0, 0.0, f, rank),
        ("F", 1, f, 2 * f, rank),
        ("B", 0, 2 * f, b + f, rank),
        ("B", 1, b + f, 2 * b, rank),
    )
    return TimelineRecord(step, events, group=group, rank=rank)


def stored_timelines(env: Env) -> dict[tuple[int, int, int], tuple[int, list[list[object]]]]:
    with env.db.session() as session:
        rows = session.scalars(select(PipelineTimeline)).all()
    return {(row.job_id, row.group, row.rank): (row.step, row.events) for row in rows}


def test_the_latest_timeline_of_each_stage_is_kept(env: Env, tmp_path: Path) -> None:
    job_id, _ = make_job(env)
    stream = JobStream(env.client, env.keys, job_id)
    for record in (timeline(10), timeline(10, rank=1), timeline(20), timeline(20, group=1)):
        stream.publish(record)
    ingest_once(env.db, env.client, env.keys)
    assert pending(env, job_id) == 0
    stored = stored_timelines(env)
    assert {key: step for key, (step, _) in stored.items()} == {
        (job_id, 0, 0): 20,
        (job_id, 0, 1): 10,
        (job_id, 1, 0): 20,
    }
    assert stored[(job_id, 0, 1)][1] == [
        ["F", 0, 0.0, 0.01, 1], ["F", 1, 0.01, 0.02, 1], ["B", 0, 0.02, 0.03, 1],
        ["B", 1, 0.03, 0.04, 1],
    ]  # fmt: skip
    # Later batches replace a stage's row; a job placed again reports lower steps, and they win.
    stream.publish(timeline(30, rank=1))
    stream.publish(timeline(5))
    ingest_once(env.db, env.client, env.keys)
    stored = stored_timelines(env)
    assert stored[(job_id, 0, 1)][0] == 30 and stored[(job_id, 0, 0)][0] == 5
    assert stored[(job_id, 0, 0)][1][-1] == ["B", 1, 0.015, 0.02, 0]
    # Deleting the job deletes its timelines.
    with env.db.session() as session:
        job = session.get(Job, job_id)
        assert job is not None
        transition(session, job, JobState.CANCELLED, "test")
        delete_job(session, job, artifacts=tmp_path, client=env.client, keys=env.keys)
    assert env.count(PipelineTimeline) == 0


def test_state_records_start_and_finish_the_job(env: Env) -> None:
    job_id, (a0, a1) = make_job(env, state=JobState.SCHEDULED)
    stream = JobStream(env.client, env.keys, job_id)
    stream.publish(StateRecord(a0, "RUNNING"))
    ingest_once(env.db, env.client, env.keys)
    job = env.job(job_id)
    assert job.state == JobState.RUNNING and job.started_at is not None
    assert env.allocation(a0).state == AllocationState.RUNNING
    stream.publish(StateRecord(a1, "RUNNING"))
    stream.publish(MetricRecord(5, {"test/accuracy": 0.5, "loss": math.nan}))
    stream.publish(StateRecord(a0, "DONE", exit_code=0))
    ingest_once(env.db, env.client, env.keys)
    assert env.job(job_id).state == JobState.RUNNING  # one worker of two is done
    stream.publish(StateRecord(a1, "DONE", exit_code=0))
    ingest_once(env.db, env.client, env.keys)
    job = env.job(job_id)
    assert job.state == JobState.SUCCEEDED and job.ended_at is not None
    assert job.summary == {"test/accuracy": 0.5}  # NaN is not stored (SQLite, JSON)
    assert env.count(Metric) == 1
    assert job.best_metric == 0.5
    assert env.allocation(a1).exit_code == 0
    with env.db.session() as session:
        events = session.scalars(
            select(JobEvent).where(JobEvent.job_id == job_id).order_by(JobEvent.id)
        ).all()
    assert [e.state for e in events] == ["QUEUED", "SCHEDULED", "RUNNING", "SUCCEEDED"]
    assert events[-1].reason == "all 2 worker(s) finished"
    assert events[2].reason == "worker 0/0 on node-a started"


def test_a_process_that_ends_wakes_placement_for_its_slots(env: Env) -> None:
    job_id, (a0, a1) = make_job(env, state=JobState.SCHEDULED)
    freed = threading.Event()
    ingester = Ingester(env.db, env.client, env.keys, slots_freed=freed)
    stream = JobStream(env.client, env.keys, job_id)
    stream.publish(StateRecord(a0, "RUNNING"))
    stream.publish(MetricRecord(5, {"loss": 0.5}))
    ingester.run_once()
    assert not freed.is_set()  # nothing ended: no slot to use
    stream.publish(StateRecord(a1, "CANCELLED", exit_code=-15))
    ingester.run_once()
    assert freed.is_set()


def test_a_failed_worker_fails_the_job_and_stops_its_siblings(env: Env) -> None:
    job_id, (a0, a1) = make_job(env)
    stream = JobStream(env.client, env.keys, job_id)
    stream.publish(StateRecord(a1, "FAILED", reason="ValueError: boom", exit_code=1))
    ingest_once(env.db, env.client, env.keys)
    job = env.job(job_id)
    assert job.state == JobState.FAILED and job.error == "ValueError: boom"
    assert env.client.exists(env.keys.cancel(job_id))  # the sibling's agent stops it
    stream.publish(StateRecord(a0, "CANCELLED", reason="cancelled", exit_code=-15))
    ingest_once(env.db, env.client, env.keys)
    assert env.allocation(a0).state == AllocationState.CANCELLED
    assert env.job(job_id).state == JobState.FAILED


def test_a_failed_worker_restarts_the_job_from_its_restart_point(env: Env, tmp_path: Path) -> None:
    job_id, (a0, a1) = make_job(env, max_restarts=1)
    point = tmp_path / "jobs" / str(job_id) / "restart" / "step-00000040.safetensors"
    point.parent.mkdir(parents=True)
    point.write_bytes(b"the restart point")
    ingester = Ingester(env.db, env.client, env.keys, artifacts=tmp_path)
    old = JobStream(env.client, env.keys, job_id, attempt=0)
    for step, accuracy in ((20, 0.5), (40, 0.6), (60, 0.9)):
        old.publish(MetricRecord(step, {"test/accuracy": accuracy}))
    old.publish(StateRecord(a1, "FAILED", reason="exited -9 (killed by SIGKILL)", exit_code=-9))
    ingester.run_once()
    job = env.job(job_id)
    assert (job.state, job.attempt, job.restarts, job.step) == (JobState.QUEUED, 1, 1, 40)
    assert job.best_metric == 0.6  # step 60 is trained again: not counted twice
    assert Path(job.restart_from or "").read_bytes() == b"the restart point"
    assert env.client.hexists(env.keys.allocation(a0), "stop")  # the sibling stops
    with env.db.session() as session:
        reason = session.scalars(
            select(JobEvent.reason).where(JobEvent.job_id == job_id).order_by(JobEvent.id)
        ).all()[-1]
        steps = session.scalars(select(Metric.step).where(Metric.job_id == job_id)).all()
    assert reason == (
        "worker 0/1 on node-a exited -9 (killed by SIGKILL); restart 1 of 1 from step 40 "
        "(20 steps to train again)"
    )
    assert sorted(steps) == [20, 40]
    old.publish(MetricRecord(80, {"test/accuracy": 0.95}))  # the sibling, still stopping
    JobStream(env.client, env.keys, job_id, attempt=1).publish(MetricRecord(60, {"x": 1.0}))
    ingester.run_once()
    with env.db.session() as session:
        steps = session.scalars(select(Metric.step).where(Metric.job_id == job_id)).all()
    assert sorted(steps) == [20, 40, 60]
    # The second failure is past cluster.max_restarts: the job fails with its cause.
    with env.db.session() as session:
        job = session.get(Job, job_id)
        assert job is not None
        transition(session, job, JobState.SCHEDULED, "test")
        session.add(Allocation(job_id=job_id, node_id=1, role="worker", group=0, rank=0, slots=1))
    with env.db.session() as session:
        a2 = max(session.scalars(select(Allocation.id)).all())
    JobStream(env.client, env.keys, job_id, 1).publish(StateRecord(a2, "FAILED", "boom", 1))
    ingester.run_once()
    job = env.job(job_id)
    assert (job.state, job.error) == (JobState.FAILED, "boom")


def test_the_best_metric_is_the_objectives_best_and_its_step(env: Env, tmp_path: Path) -> None:
    """A job minimising val/loss: its first worker's lowest value, and the step of its first
    report; a restart forgets the steps it trains again."""
    job_id, (_, a1) = make_job(env, objective=("val/loss", "min"), max_restarts=1)
    stream = JobStream(env.client, env.keys, job_id)
    for step, loss in ((20, 0.9), (40, 0.5), (60, 0.7)):
        stream.publish(MetricRecord(step, {"val/loss": loss, "test/accuracy": 1.0 - loss}))
    stream.publish(MetricRecord(40, {"val/loss": 0.1}, group=1))  # another worker's view
    ingest_once(env.db, env.client, env.keys)
    job = env.job(job_id)
    assert (job.objective, job.objective_mode, job.best_metric, job.best_step) == (
        "val/loss",
        "min",
        0.5,
        40,
    )
    stream.publish(MetricRecord(80, {"val/loss": 0.5}))  # as good, later: the first stays
    stream.publish(MetricRecord(100, {"val/loss": 0.3}))
    ingest_once(env.db, env.client, env.keys)
    assert (env.job(job_id).best_metric, env.job(job_id).best_step) == (0.3, 100)
    # Placed again from step 60: the steps after it are trained again, their best forgotten.
    point = tmp_path / "jobs" / str(job_id) / "restart" / "step-00000060.safetensors"
    point.parent.mkdir(parents=True)
    point.write_bytes(b"the restart point")
    stream.publish(StateRecord(a1, "FAILED", reason="lost", exit_code=-9))
    Ingester(env.db, env.client, env.keys, artifacts=tmp_path).run_once()
    job = env.job(job_id)
    assert (job.state, job.best_metric, job.best_step) == (JobState.QUEUED, 0.5, 40)


def test_the_best_checkpoint_is_marked_and_the_jobs_events_joined(env: Env, tmp_path: Path) -> None:
    job_id, _ = make_job(env, objective=("val/accuracy", "max"))
    stream = JobStream(env.client, env.keys, job_id)
    files = {}
    for step in (20, 40, 60, 80):
        files[step] = tmp_path / f"step-{step:08d}.safetensors"
        files[step].write_bytes(b"x")
    stream.publish(contract.stream.CheckpointRecord.of_file(20, files[20], best=True))
    stream.publish(contract.stream.CheckpointRecord.of_file(40, files[40]))
    ingest_once(env.db, env.client, env.keys)
    stream.publish(contract.stream.CheckpointRecord.of_file(60, files[60], best=True))
    stream.publish(contract.stream.CheckpointRecord.of_file(80, files[80]))
    # A step saved anyway and then marked the best: one record, marked.
    stream.publish(contract.stream.CheckpointRecord.of_file(80, files[80], best=True))
    stream.publish(EventRecord(80, "stopped early at step 80: val/accuracy has not improved"))
    ingest_once(env.db, env.client, env.keys)
    with env.db.session() as session:
        marks = session.execute(
            select(CheckpointRecord.step, CheckpointRecord.best).order_by(CheckpointRecord.step)
        ).all()
        events = session.scalars(
            select(JobEvent).where(JobEvent.job_id == job_id).order_by(JobEvent.id)
        ).all()
    assert [tuple(row) for row in marks] == [(20, False), (40, False), (60, False), (80, True)]
    assert (events[-1].state, events[-1].reason) == (
        JobState.RUNNING,
        "stopped early at step 80: val/accuracy has not improved",
    )


def test_a_cancelled_job_ends_cancelled(env: Env) -> None:
    job_id, (a0,) = make_job(env, workers=1)
    with env.db.session() as session:
        job = session.get(Job, job_id)
        assert job is not None
        job.cancel_requested = True
    JobStream(env.client, env.keys, job_id).publish(StateRecord(a0, "CANCELLED", exit_code=-15))
    ingest_once(env.db, env.client, env.keys)
    job = env.job(job_id)
    assert job.state == JobState.CANCELLED
    with env.db.session() as session:
        reason = session.scalars(
            select(JobEvent.reason).where(JobEvent.job_id == job_id).order_by(JobEvent.id.desc())
        ).first()
    assert reason == "cancelled by the user"


def test_records_of_written_off_allocations_change_nothing(env: Env) -> None:
    job_id, (a0,) = make_job(env, workers=1)
    with env.db.session() as session:
        alloc = session.get(Allocation, a0)
        assert alloc is not None
        alloc.state = AllocationState.FAILED  # its node was lost
    JobStream(env.client, env.keys, job_id).publish(StateRecord(a0, "DONE", exit_code=0))
    ingest_once(env.db, env.client, env.keys)
    assert env.allocation(a0).state == AllocationState.FAILED
    assert env.job(job_id).state == JobState.RUNNING


def test_finished_jobs_leave_the_ingest_set_once_drained(env: Env) -> None:
    job_id, (a0,) = make_job(env, workers=1)
    stream = JobStream(env.client, env.keys, job_id)
    publish_metrics(env, job_id, 10, values=1)
    stream.publish(StateRecord(a0, "DONE", exit_code=0))
    ingest_once(env.db, env.client, env.keys)
    assert env.job(job_id).state == JobState.SUCCEEDED
    assert not env.client.sismember(env.keys.streams_with_data, str(job_id))
    assert 0 < env.client.ttl(env.keys.job_stream(job_id)) <= 24 * 3600
    # A straggler record puts the job back in the set and is not lost.
    stream.publish(LogRecord("late line"))
    assert env.client.sismember(env.keys.streams_with_data, str(job_id))
    ingest_once(env.db, env.client, env.keys)
    assert env.count(LogLine) == 1
    assert not env.client.sismember(env.keys.streams_with_data, str(job_id))


def test_streams_of_deleted_jobs_are_dropped(env: Env) -> None:
    publish_metrics(env, 987654, 5)
    assert ingest_once(env.db, env.client, env.keys) == 0
    assert env.count(Metric) == 0
    assert not env.client.sismember(env.keys.streams_with_data, "987654")


def test_with_the_machines_redis(tmp_path: Path, sqlite_template: Path) -> None:
    """The same flow on the Redis at 127.0.0.1:6379, under a key prefix of its own."""
    client = redis.Redis.from_url("redis://127.0.0.1:6379/0")
    try:
        client.ping()
    except redis.ConnectionError:
        pytest.skip("no Redis at 127.0.0.1:6379")
    shutil.copyfile(sqlite_template, tmp_path / "db.sqlite")
    for env in _env(f"sqlite:///{tmp_path / 'db.sqlite'}", client):
        job_id, (a0,) = make_job(env, workers=1)
        points = publish_metrics(env, job_id, 2500, values=3)
        JobStream(env.client, env.keys, job_id).publish(StateRecord(a0, "DONE", exit_code=0))
        assert env.drain() == points
        assert env.count(Metric) == points
        assert env.job(job_id).state == JobState.SUCCEEDED
    client.close()


def test_each_workers_environment_is_kept_its_newest_report_replacing_the_last(env: Env) -> None:
    from scheduler.store.environments import environments

    job_id, _ = make_job(env)
    stream = JobStream(env.client, env.keys, job_id)

    def report(group: int, rank: int, torch: str, hostname: str) -> contract.stream.Record:
        return contract.stream.EnvironmentRecord(
            python="3.11.9",
            torch=torch,
            cuda="",
            cudnn="",
            nccl="",
            devices=("cpu (2 cores)",),
            cpu_model="Test CPU",
            cpu_count=2,
            hostname=hostname,
            trainyard_version="0.1.0",
            trainyard_commit="",
            packages_hash="ab" * 32,
            packages=("numpy==2.0.0", f"torch=={torch}"),
            packages_total=2,
            group=group,
            rank=rank,
        )

    stream.publish(report(0, 0, "2.12.0", "a"))
    stream.publish(report(0, 1, "2.13.0", "b"))
    ingest_once(env.db, env.client, env.keys)
    stream.publish(report(0, 0, "2.13.0", "a"))  # the process restarted, elsewhere installed
    ingest_once(env.db, env.client, env.keys)
    with env.db.session() as session:
        rows = [
            (r.group, r.rank, r.facts["torch"], r.facts["hostname"], r.packages)
            for r in environments(session, job_id)
        ]
    assert rows == [
        (0, 0, "2.13.0", "a", ["numpy==2.0.0", "torch==2.13.0"]),
        (0, 1, "2.13.0", "b", ["numpy==2.0.0", "torch==2.13.0"]),
    ]
