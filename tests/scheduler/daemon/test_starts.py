"""Placed processes that never start, on both SQL backends and the session's real Redis: the
start timeout's clock, the jobs it writes off, and a dispatch the scheduler cannot make."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from sqlalchemy import select

from contract.allocation import SEEN, AllocationState
from contract.keys import Keys
from contract.settings import Settings, with_user
from contract.stream import StateRecord, decode_record
from scheduler.celery_app import create_celery
from scheduler.daemon.dispatch import dispatch
from scheduler.daemon.nodes import NodeTracker, sync_nodes
from scheduler.daemon.placing import schedule_once
from scheduler.daemon.starts import StartWatch, write_off_unstarted
from scheduler.ingest.batch import apply_state
from scheduler.store.database import Database
from scheduler.store.models import Allocation, Job, JobEvent
from scheduler.store.states import JobState
from tests.scheduler.daemon.test_loop import add_job, registration, set_max_restarts, state

TIMEOUT = 3.0


@pytest.fixture
def settings(tmp_path: Path, redis_url: str) -> Settings:
    return Settings(
        data_dir=tmp_path,
        redis_url=redis_url,
        redis_prefix=f"s{uuid.uuid4().hex[:8]}",
        start_timeout_seconds=TIMEOUT,
    )


@pytest.fixture
def client(redis_url: str) -> Iterator[redis.Redis]:
    found = redis.Redis.from_url(redis_url)
    yield found
    found.close()


def test_the_start_clock_runs_from_first_sight_and_again_from_each_seen_change() -> None:
    watch = StartWatch()
    assert watch.overdue({1: "", 2: ""}, now=10.0, timeout=TIMEOUT) == []
    assert watch.overdue({1: "", 2: "5.0"}, now=12.0, timeout=TIMEOUT) == []  # 2: its agent
    assert watch.overdue({1: "", 2: "5.0"}, now=13.5, timeout=TIMEOUT) == [1]
    assert watch.overdue({1: "", 2: "5.0"}, now=15.5, timeout=TIMEOUT) == [1, 2]
    assert watch.overdue({2: "5.0"}, now=16.0, timeout=TIMEOUT) == [2]  # 1 started: forgotten
    assert watch.overdue({1: "", 2: "5.0"}, now=16.0, timeout=TIMEOUT) == [2]
    assert set(watch.since) == {1, 2}


def late(
    db: Database, settings: Settings, client: redis.Redis, watch: StartWatch, now: float
) -> list[int]:
    """One check of the start timeout at `now`: the allocations it wrote off."""
    with db.session() as session:
        keys = Keys(settings.redis_prefix)
        return write_off_unstarted(session, client, keys, watch, settings, now=now)


def events(db: Database, job_id: int) -> list[tuple[str, str]]:
    with db.session() as session:
        rows = session.scalars(
            select(JobEvent).where(JobEvent.job_id == job_id).order_by(JobEvent.id)
        )
        return [(e.state, e.reason) for e in rows]


def test_a_process_that_never_starts_is_placed_again_then_its_job_fails(
    db: Database, settings: Settings, client: redis.Redis
) -> None:
    keys = Keys(settings.redis_prefix)
    with db.session() as session:
        sync_nodes(session, {"n1": registration(1)}, NodeTracker(), TIMEOUT, now=0.0)
    job_id = add_job(db, 1)
    set_max_restarts(db, job_id, 1)
    watch = StartWatch()
    with db.session() as session:
        [item] = schedule_once(session, settings)
    assert late(db, settings, client, watch, now=0.0) == []
    # Its agent says it supervises it (the RUNNING record not ingested yet): the clock restarts.
    client.hset(keys.allocation(item.allocation_id), SEEN, "2.0")
    assert late(db, settings, client, watch, now=2.0) == []
    assert late(db, settings, client, watch, now=4.5) == []
    assert state(db, job_id) == JobState.SCHEDULED
    assert late(db, settings, client, watch, now=5.5) == [item.allocation_id]
    assert state(db, job_id) == JobState.QUEUED
    said = "worker 0/0 on n1 did not start within 3s (TRAINYARD_START_TIMEOUT_SECONDS)"
    assert events(db, job_id)[-1][1].startswith(said)
    assert "; restart 1 of 1 from step 0" in events(db, job_id)[-1][1]

    with db.session() as session:
        [again] = schedule_once(session, settings)
        job = session.get(Job, job_id)
        # n1 is avoided, and placed on again: no other node could take the job.
        assert job is not None and job.avoided_nodes == ["n1"]
    assert again.queue == "q.n1"
    assert late(db, settings, client, watch, now=6.0) == []
    assert late(db, settings, client, watch, now=9.5) == [again.allocation_id]
    with db.session() as session:
        job = session.get(Job, job_id)
        assert job is not None and job.state == JobState.FAILED
        assert job.error is not None and job.error.startswith(said)
        assert job.error.endswith("(no restarts left: cluster.max_restarts is 1)")
        allocs = session.scalars(select(Allocation.state).where(Allocation.job_id == job_id))
        assert list(allocs) == [AllocationState.FAILED] * 2
    client.delete(keys.allocation(item.allocation_id), keys.allocation(again.allocation_id))


def test_a_job_cancelled_before_its_process_started_ends_cancelled(
    db: Database, settings: Settings, client: redis.Redis
) -> None:
    with db.session() as session:
        sync_nodes(session, {"n1": registration(1)}, NodeTracker(), TIMEOUT, now=0.0)
    job_id = add_job(db, 1)
    watch = StartWatch()
    with db.session() as session:
        [item] = schedule_once(session, settings)
        job = session.get(Job, job_id)
        assert job is not None
        job.cancel_requested = True
    assert late(db, settings, client, watch, now=0.0) == []
    assert late(db, settings, client, watch, now=3.5) == [item.allocation_id]
    assert state(db, job_id) == JobState.CANCELLED
    assert events(db, job_id)[-1][1].startswith("cancelled by the user (worker 0/0 on n1 did not")


def test_a_dispatch_the_scheduler_cannot_make_is_reported_with_its_step(
    db: Database, settings: Settings, client: redis.Redis, redis_url: str
) -> None:
    """The scheduler's Redis user may not manage users (a real `ACL SETUSER` takes the right
    away): the job's own user cannot be made, and the process is reported not started on the
    job's stream, the step and Redis's refusal in its reason, which the ingester hands to the
    recovery policy."""
    keys = Keys(settings.redis_prefix)
    user, password = f"{settings.redis_prefix}-scheduler", uuid.uuid4().hex
    client.execute_command(
        "ACL", "SETUSER", user, "on", f">{password}", *keys.role_user_rules("scheduler"), "-acl"
    )
    scheduler = redis.Redis.from_url(with_user(redis_url, user, password))
    with db.session() as session:
        sync_nodes(session, {"n1": registration(1)}, NodeTracker(), TIMEOUT, now=0.0)
    job_id = add_job(db, 1)
    set_max_restarts(db, job_id, 0)
    with db.session() as session:
        items = schedule_once(session, settings)
    try:
        dispatch(create_celery(settings), scheduler, keys, items, job_users=True)
        entries: list[Any] = client.xrange(keys.job_stream(job_id))  # type: ignore[assignment]
    finally:
        scheduler.close()
        client.execute_command("ACL", "DELUSER", user)
    [record] = [decode_record(fields) for _, fields in entries]
    assert isinstance(record, StateRecord) and record.state == AllocationState.FAILED
    assert record.reason.startswith(
        "did not start: the scheduler could not make its job's Redis user (NoPermissionError: "
    )
    assert "'acl|setuser'" in record.reason
    assert not client.exists(keys.allocation(items[0].allocation_id))  # no task was sent
    with db.session() as session:
        job = session.get(Job, job_id)
        assert job is not None
        apply_state(session, job, record)
    with db.session() as session:
        job = session.get(Job, job_id)
        assert job is not None and job.state == JobState.FAILED
        assert job.error == record.reason
    assert events(db, job_id)[-1][1] == f"worker 0/0 on n1 failed: {record.reason}"
