"""The job store's functions against real SQLite and PostgreSQL (and the session's real Redis)."""

from __future__ import annotations

import json
import string
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import event, func, insert, select, text
from sqlalchemy.orm import Session

from contract.keys import CANCEL_TTL_SECONDS, Keys
from contract.rundir import job_run_dir
from contract.stream import JobStream, LogRecord
from scheduler.store import reports as report_store
from scheduler.store.database import Database
from scheduler.store.errors import Conflict, InvalidRequest, NotFound
from scheduler.store.jobs import (
    NewJob,
    create_job,
    delete_job,
    encode_cursor,
    get_job,
    job_counts,
    job_events,
    list_jobs,
    queue_positions,
    request_cancel,
)
from scheduler.store.lifecycle import transition
from scheduler.store.models import (
    ApiToken,
    CheckpointRecord,
    Job,
    JobEvent,
    LogLine,
    Metric,
    User,
    aware,
    utcnow,
)
from scheduler.store.states import JobState
from scheduler.store.users import create_token, create_user, get_user, hash_token, user_for_token


@pytest.fixture
def db(migrated_sql_url: str) -> Iterator[Database]:
    database = Database(migrated_sql_url)
    yield database
    database.dispose()


@pytest.fixture
def rclient(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


@pytest.fixture
def keys() -> Keys:
    return Keys(f"store-{uuid.uuid4().hex[:8]}")


def new_job(name: str = "job", priority: int = 0) -> NewJob:
    return NewJob(
        name=name,
        spec_yaml=f"name: {name}\n",
        overrides={"train_steps": 5},
        spec={"name": name},
        topology={"workers": 1},
        framework="local",
        train_steps=5,
        priority=priority,
    )


def users(session: Session) -> tuple[User, User, User]:
    return (
        create_user(session, "root", is_admin=True),
        create_user(session, "alice"),
        create_user(session, "bob"),
    )


def test_tokens_are_random_stored_hashed_and_resolve_to_their_user(db: Database) -> None:
    with db.session() as session:
        _, alice, bob = users(session)
        token = create_token(session, alice, "laptop")
        other = create_token(session, alice)
        assert token != other and len(token) >= 40
        stored = session.scalars(select(ApiToken.token_hash)).all()
        assert token not in stored and hash_token(token) in stored
        found = user_for_token(session, token)
        assert found is not None and found.id == alice.id
        assert user_for_token(session, token + "x") is None
        assert user_for_token(session, "") is None
        with pytest.raises(Conflict, match="bob"):
            create_user(session, "bob")
        assert get_user(session, "bob") is not None and bob.is_admin is False


def test_token_use_is_recorded_at_most_once_a_minute(db: Database) -> None:
    with db.session() as session:
        _, alice, _ = users(session)
        token = create_token(session, alice)
    with db.session() as session:
        user_for_token(session, token)
        first = session.scalar(select(ApiToken.last_used_at))
        assert first is not None
    with db.session() as session:
        user_for_token(session, token)
        assert not session.dirty  # within the minute: no write
    with db.session() as session:
        row = session.scalar(select(ApiToken))
        assert row is not None
        row.last_used_at = utcnow() - timedelta(minutes=5)
    with db.session() as session:
        user_for_token(session, token)
        later = session.scalar(select(ApiToken.last_used_at))
        assert later is not None and aware(later) > utcnow() - timedelta(minutes=1)


def test_create_job_queues_it_with_an_event_and_only_its_owner_and_admins_see_it(
    db: Database,
) -> None:
    with db.session() as session:
        root, alice, bob = users(session)
        job = create_job(session, alice, new_job("mine", priority=3))
        job_id = job.id
    with db.session() as session:
        assert get_job(session, alice, job_id).priority == 3
        assert get_job(session, root, job_id).state == JobState.QUEUED
        with pytest.raises(NotFound, match=f"no job {job_id}"):
            get_job(session, bob, job_id)
        with pytest.raises(NotFound):
            get_job(session, alice, job_id + 1000)
        events = job_events(session, job_id)
        assert [(e.state, e.reason) for e in events] == [("QUEUED", "submitted")]


def listed(session: Session, user: User, **filters: Any) -> tuple[list[dict[str, Any]], str | None]:
    items, cursor = list_jobs(session, user, **filters)
    return json.loads(items), cursor


def test_list_jobs_filters_and_pages_newest_first_without_gaps(db: Database) -> None:
    with db.session() as session:
        root, alice, bob = users(session)
        ids = [create_job(session, alice, new_job(f"run-{i % 3}")).id for i in range(7)]
        create_job(session, bob, new_job("bobs"))
        finished = get_job(session, alice, ids[2])
        transition(session, finished, JobState.CANCELLED, "test")
        create_job(session, alice, new_job("a_b%c/d"))
    with db.session() as session:
        seen: list[int] = []
        cursor = None
        while True:
            page, cursor = listed(session, alice, limit=3, cursor=cursor)
            assert len(page) == 3 or cursor is None
            seen += [job["id"] for job in page]
            if cursor is None:
                break
        assert seen[1:] == sorted(ids, reverse=True)
        everything, _ = listed(session, root, limit=100)
        assert len(everything) == 9
        by_name, _ = listed(session, alice, name="run-1")
        assert sorted(job["id"] for job in by_name) == [ids[1], ids[4]]
        cancelled, _ = listed(session, alice, states=[JobState.CANCELLED])
        assert [job["id"] for job in cancelled] == [ids[2]]
        live, _ = listed(session, alice, states=[JobState.QUEUED, JobState.RUNNING])
        assert len(live) == 7
        for literal in ("%", "_", "b%c", "c/d", "a_b"):  # LIKE wildcards and its escape are text
            found, _ = listed(session, alice, name=literal)
            assert [job["name"] for job in found] == ["a_b%c/d"], literal
        assert listed(session, alice, name="x%") == ([], None)
        assert listed(session, bob, states=[JobState.CANCELLED]) == ([], None)
        for bad in ("garbage", encode_cursor(5) + "!!", "am9iOng"):
            with pytest.raises(InvalidRequest, match="cursor"):
                list_jobs(session, alice, cursor=bad)


NAMES = ["Run-A", "run_a", "b.%x", "x/y_z", "MLP-100", "mlp.10", "K9"]
needles = st.text(alphabet="aAbBkKmMlLpPrRuUnNxyz019_.-%/\\'\"\u212a\u0130é ", max_size=6)


@pytest.fixture
def named_jobs(db: Database) -> User:
    with db.session() as session:
        _, alice, _ = users(session)
        for name in NAMES:
            create_job(session, alice, new_job(name))
        return alice


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(needle=needles)
def test_the_name_filter_is_a_substring_in_any_ascii_case(
    db: Database, named_jobs: User, needle: str
) -> None:
    """The same jobs on both backends: the part anywhere in the name, ASCII letters in either
    case, every other character (LIKE's wildcards and escape, quotes, non-ASCII) as itself."""
    fold = str.maketrans(string.ascii_uppercase, string.ascii_lowercase)
    expected = sorted(n for n in NAMES if needle.translate(fold) in n.translate(fold))
    with db.session() as session:
        found, _ = listed(session, named_jobs, name=needle or None, limit=100)
    assert sorted(job["name"] for job in found) == expected


def test_a_listed_running_job_lasts_until_now(db: Database) -> None:
    with db.session() as session:
        _, alice, _ = users(session)
        job = create_job(session, alice, new_job("running"))
        transition(session, job, JobState.SCHEDULED, "test")
        transition(session, job, JobState.RUNNING, "test")
        job.started_at = utcnow() - timedelta(hours=1)
        now = job.started_at + timedelta(seconds=90.25)
    with db.session() as session:
        (item,), _ = listed(session, alice, now=now)
        assert item["duration_seconds"] == pytest.approx(90.25, abs=1e-3)
        assert item["state"] == "RUNNING" and item["queue_position"] is None


def test_queue_positions_follow_priority_then_submission(db: Database) -> None:
    with db.session() as session:
        _, alice, _ = users(session)
        low = create_job(session, alice, new_job("low", priority=0)).id
        high = create_job(session, alice, new_job("high", priority=5)).id
        low2 = create_job(session, alice, new_job("low2", priority=0)).id
        gone = create_job(session, alice, new_job("gone", priority=9))
        transition(session, gone, JobState.CANCELLED, "test")
    with db.session() as session:
        assert queue_positions(session) == {high: 1, low: 2, low2: 3}
        counts = job_counts(session)
        assert counts["QUEUED"] == 3 and counts["CANCELLED"] == 1 and counts["RUNNING"] == 0


def test_every_page_ranks_its_queued_jobs_among_all_queued_jobs(db: Database) -> None:
    """A page computes the positions of its own jobs only (scheduler/store/job_page.py); each
    is still the job's place among every queued job, off the page and other users' too."""
    with db.session() as session:
        root, alice, bob = users(session)
        ids = [create_job(session, alice, new_job(f"a{i}", priority=i % 3)).id for i in range(7)]
        for i in range(4):
            create_job(session, bob, new_job(f"b{i}", priority=1))
        for job_id in ids[:2]:
            transition(session, get_job(session, alice, job_id), JobState.CANCELLED, "test")
    with db.session() as session:
        queue = queue_positions(session)
        assert len(queue) == 9
        for user in (alice, bob, root):
            cursor, pages = None, 0
            while True:
                page, cursor = listed(session, user, limit=2, cursor=cursor)
                pages += 1
                for item in page:
                    assert item["queue_position"] == queue.get(item["id"]), item
                if cursor is None:
                    break
            assert pages >= 2
        # A page of ended jobs has no positions (and does not rank the queue for them).
        ended, _ = listed(session, alice, states=[JobState.CANCELLED])
        assert [item["queue_position"] for item in ended] == [None, None]


def test_cancel_ends_a_queued_job_at_once_and_flags_a_running_one(
    db: Database, rclient: redis.Redis, keys: Keys
) -> None:
    with db.session() as session:
        _, alice, _ = users(session)
        queued = create_job(session, alice, new_job("q"))
        running = create_job(session, alice, new_job("r"))
        transition(session, running, JobState.SCHEDULED, "placed")
        transition(session, running, JobState.RUNNING, "started")
    with db.session() as session:
        job = get_job(session, alice, queued.id, for_update=True)
        request_cancel(session, job, rclient, keys)
        assert job.state == JobState.CANCELLED and job.cancel_requested
        job = get_job(session, alice, running.id)
        request_cancel(session, job, rclient, keys)
        assert job.state == JobState.RUNNING and job.cancel_requested
    for job_id in (queued.id, running.id):
        assert rclient.get(keys.cancel(job_id)) == b"1"
        assert 0 < int(rclient.ttl(keys.cancel(job_id))) <= CANCEL_TTL_SECONDS
    with db.session() as session:
        job = get_job(session, alice, queued.id)
        with pytest.raises(Conflict, match="already CANCELLED"):
            request_cancel(session, job, rclient, keys)
        reasons = [e.reason for e in job_events(session, queued.id)]
        assert reasons[-1].startswith("cancelled by the user")


def test_delete_removes_rows_files_and_redis_keys_of_finished_jobs_only(
    db: Database, rclient: redis.Redis, keys: Keys, tmp_path: Path
) -> None:
    artifacts = tmp_path / "artifacts"
    with db.session() as session:
        _, alice, _ = users(session)
        job = create_job(session, alice, new_job("done"))
        live = create_job(session, alice, new_job("live"))
        run_dir = job_run_dir(artifacts, job.id)
        (run_dir / "checkpoints").mkdir(parents=True)
        ckpt = run_dir / "checkpoints" / "step-5.safetensors"
        ckpt.write_bytes(b"weights")
        session.add(CheckpointRecord(job_id=job.id, step=5, path=str(ckpt), size=7))
        session.add(Metric(job_id=job.id, name="loss", step=1, value=0.5, at=time.time()))
        session.add(LogLine(job_id=job.id, at=time.time(), line="hello"))
        transition(session, job, JobState.CANCELLED, "test")
    JobStream(rclient, keys, job.id).publish(LogRecord("hello"))
    rclient.set(keys.cancel(job.id), "1")
    with db.session() as session:
        with pytest.raises(Conflict, match="QUEUED"):
            delete_job(
                session,
                get_job(session, alice, live.id),
                artifacts=artifacts,
                client=rclient,
                keys=keys,
            )
        delete_job(
            session,
            get_job(session, alice, job.id),
            artifacts=artifacts,
            client=rclient,
            keys=keys,
        )
    with db.session() as session:
        for model in (Job, JobEvent, Metric, LogLine, CheckpointRecord):
            remaining = session.scalar(
                select(func.count()).select_from(model).where(model.job_id == job.id)  # type: ignore[attr-defined]
                if model is not Job
                else select(func.count()).select_from(Job).where(Job.id == job.id)
            )
            assert remaining == 0, model
        assert get_job(session, alice, live.id).state == JobState.QUEUED
    assert not run_dir.exists() and not ckpt.exists()
    assert not rclient.exists(keys.job_stream(job.id), keys.cancel(job.id))
    assert not rclient.sismember(keys.streams_with_data, str(job.id))


def test_log_lines_page_by_id(db: Database) -> None:
    with db.session() as session:
        _, alice, _ = users(session)
        job = create_job(session, alice, new_job())
        session.execute(
            insert(LogLine),
            [{"job_id": job.id, "at": float(i), "line": f"line {i}"} for i in range(12)],
        )
    with db.session() as session:
        lines, after = report_store.log_lines(session, job.id, limit=5)
        assert [ln.line for ln in lines] == [f"line {i}" for i in range(5)]
        lines, after = report_store.log_lines(session, job.id, after=after, limit=100)
        assert [ln.line for ln in lines] == [f"line {i}" for i in range(5, 12)]
        assert report_store.log_lines(session, job.id, after=after) == ([], after)


def test_checkpoints_list_only_files_still_on_disk(db: Database, tmp_path: Path) -> None:
    with db.session() as session:
        _, alice, _ = users(session)
        job = create_job(session, alice, new_job())
        checkpoints = job_run_dir(tmp_path, job.id) / "checkpoints"  # they lie in its run dir
        checkpoints.mkdir(parents=True)
        for step in (10, 20):
            path = checkpoints / f"step-{step}.safetensors"
            path.write_bytes(b"x" * step)
            session.add(CheckpointRecord(job_id=job.id, step=step, path=str(path), size=step))
    (checkpoints / "step-10.safetensors").unlink()  # the trainer keeps the newest ones only
    with db.session() as session:
        assert [c.step for c in report_store.checkpoints(session, job.id, artifacts=tmp_path)] == [
            20
        ]
        record, path = report_store.checkpoint_file(session, job.id, 20, artifacts=tmp_path)
        assert record.size == 20 and path.read_bytes() == b"x" * 20
        with pytest.raises(NotFound, match="removed"):
            report_store.checkpoint_file(session, job.id, 10, artifacts=tmp_path)
        with pytest.raises(NotFound, match="no checkpoint at step 30"):
            report_store.checkpoint_file(session, job.id, 30, artifacts=tmp_path)


def add_points(session: Session, job_id: int, name: str, steps: range, group: int = 0) -> None:
    # Core executemany on the table: the ORM's bulk path is several times slower for 100k rows.
    session.connection().execute(
        Metric.__table__.insert(),
        [
            {"job_id": job_id, "name": name, "step": s, "value": s / 10, "at": 0.0, "grp": group}
            for s in steps
        ],
    )


def test_metric_series_filter_and_keep_short_series_whole(db: Database) -> None:
    with db.session() as session:
        _, alice, _ = users(session)
        job = create_job(session, alice, new_job())
        add_points(session, job.id, "train/loss", range(0, 100, 10))
        add_points(session, job.id, "train/loss", range(0, 100, 10), group=1)
        add_points(session, job.id, "test/accuracy", range(50, 101, 50))
    with db.session() as session:
        series = report_store.metric_series(session, job.id)
        assert [(s.name, s.group, len(s.points)) for s in series] == [
            ("test/accuracy", 0, 2),
            ("train/loss", 0, 10),
            ("train/loss", 1, 10),
        ]
        assert series[1].points[:2] == [(0, 0.0), (10, 1.0)]
        only = report_store.metric_series(
            session, job.id, names=["train/loss"], start_step=20, end_step=50, group=1
        )
        assert [(s.group, [p[0] for p in s.points]) for s in only] == [(1, [20, 30, 40, 50])]
        assert report_store.metric_names(session, job.id) == ["test/accuracy", "train/loss"]
        assert report_store.metric_series(session, job.id, names=["nope"]) == []


@pytest.mark.parametrize("max_points", [1, 7, 100])
def test_downsampling_keeps_at_most_max_points_evenly_spread_ending_at_the_last(
    db: Database, max_points: int
) -> None:
    with db.session() as session:
        _, alice, _ = users(session)
        job = create_job(session, alice, new_job())
        add_points(session, job.id, "loss", range(1000))
    with db.session() as session:
        (series,) = report_store.metric_series(session, job.id, max_points=max_points)
    steps = [step for step, _ in series.points]
    assert len(steps) == max_points and steps[-1] == 999
    assert steps == sorted(steps)
    width = 1000 / max_points
    # one point per bucket of equal width: the bucket's last step
    assert all(abs((step + 1) - (i + 1) * width) < 1 for i, step in enumerate(steps))
    assert series.points[-1][1] == pytest.approx(99.9)


@pytest.mark.slow
def test_downsampling_100k_points_happens_in_the_database(db: Database) -> None:
    """Only the kept points leave the database: every statement the series read sends groups
    its rows (a read of the 100,000 rows, cut in Python, would not). No wall time asserted."""
    with db.session() as session:
        _, alice, _ = users(session)
        job = create_job(session, alice, new_job())
        for name in ("train/loss", "train/accuracy"):
            # Generated in the database: sending 100,000 rows from Python takes longer than
            # the query under test.
            session.execute(
                text(
                    "WITH RECURSIVE n(s) AS (SELECT 0 UNION ALL SELECT s + 1 FROM n "
                    "WHERE s < 49999) "
                    "INSERT INTO metrics (job_id, name, step, value, at, grp, rank) "
                    "SELECT :job, :name, s, s / 10.0, 0.0, 0, 0 FROM n"
                ),
                {"job": job.id, "name": name},
            )
    statements: list[str] = []

    def sent(*args: Any) -> None:
        statements.append(args[2])  # (conn, cursor, statement, parameters, context, many)

    event.listen(db.engine, "before_cursor_execute", sent)
    try:
        with db.session() as session:
            series = report_store.metric_series(session, job.id, max_points=1000)
    finally:
        event.remove(db.engine, "before_cursor_execute", sent)
    assert [len(s.points) for s in series] == [1000, 1000]
    reads = [sql for sql in statements if sql.lstrip().upper().startswith(("SELECT", "WITH"))]
    assert reads and all("GROUP BY" in sql.upper() for sql in reads), reads


def test_jobs_stored_before_objectives_keep_test_accuracy_and_find_its_step(sql_url: str) -> None:
    """Migration 0008 on a store with a job: its best metric was test/accuracy's highest, so
    that is its objective, and the step of that value is found in its metrics."""
    from alembic import command

    from scheduler.store.database import alembic_config, make_engine

    config = alembic_config(sql_url)
    command.upgrade(config, "0007_node_unreachable")
    engine = make_engine(sql_url)
    now = utcnow()
    with engine.begin() as conn:
        conn.execute(
            text("INSERT INTO users (id, name, is_admin, created_at) VALUES (1, 'old', false, :t)"),
            {"t": now},
        )
        for job_id, best in ((1, 0.6), (2, None)):
            conn.execute(
                text(
                    "INSERT INTO jobs (id, owner_id, name, state, priority, spec_yaml, overrides, "
                    "spec, topology, framework, train_steps, step, summary, best_metric, "
                    "cancel_requested, created_at) VALUES (:id, 1, 'old', 'SUCCEEDED', 0, '', "
                    "'{}', '{}', '{}', 'local', 60, 60, '{}', :best, false, :t)"
                ),
                {"id": job_id, "best": best, "t": now},
            )
        for step, value, grp in ((20, 0.5, 0), (40, 0.6, 0), (60, 0.6, 0), (10, 0.6, 1)):
            conn.execute(
                text(
                    'INSERT INTO metrics (job_id, name, step, value, grp, "rank", at) '
                    "VALUES (1, 'test/accuracy', :step, :value, :grp, 0, 0)"
                ),
                {"step": step, "value": value, "grp": grp},
            )
    engine.dispose()
    command.upgrade(config, "head")
    database = Database(sql_url)
    with database.session() as session:
        old, fresh = session.get_one(Job, 1), session.get_one(Job, 2)
        assert (old.objective, old.objective_mode, old.best_metric, old.best_step) == (
            "test/accuracy",
            "max",
            0.6,
            40,
        )
        assert (fresh.objective, fresh.best_step) == ("test/accuracy", None)
    database.dispose()


def test_jobs_stored_before_effective_documents_get_theirs(sql_url: str) -> None:
    """Migration 0018 on a store with jobs: the effective document is the submitted one with
    its overrides applied; one whose overrides no longer apply keeps none."""
    from alembic import command

    from scheduler.store.database import alembic_config, make_engine

    config = alembic_config(sql_url)
    command.upgrade(config, "0017_environment_webhooks")
    engine = make_engine(sql_url)
    now = utcnow()
    document = "name: old  # a comment\nneuralnet:\n  layers:\n  - {name: fc1, units: 8}\n"
    with engine.begin() as conn:
        conn.execute(
            text("INSERT INTO users (id, name, is_admin, created_at) VALUES (1, 'old', false, :t)"),
            {"t": now},
        )
        for job_id, overrides in (
            (1, "{}"),
            (2, '{"neuralnet.layers.fc1.units": 16}'),
            (3, '{"neuralnet.layers.fc9.units": 16}'),
        ):
            conn.execute(
                text(
                    "INSERT INTO jobs (id, owner_id, name, state, priority, spec_yaml, overrides, "
                    "spec, topology, framework, train_steps, step, summary, "
                    "cancel_requested, created_at, objective, objective_mode, attempt, restarts) "
                    "VALUES (:id, 1, 'old', 'SUCCEEDED', 0, :doc, :overrides, '{}', '{}', "
                    "'local', 60, 60, '{}', false, :t, 'test/accuracy', 'max', 0, 0)"
                ),
                {"id": job_id, "doc": document, "overrides": overrides, "t": now},
            )
    engine.dispose()
    command.upgrade(config, "head")
    database = Database(sql_url)
    with database.session() as session:
        plain, overridden, stale = (session.get_one(Job, i) for i in (1, 2, 3))
        assert plain.effective_yaml == document
        assert overridden.effective_yaml is not None
        assert yaml.safe_load(overridden.effective_yaml)["neuralnet"]["layers"] == [
            {"name": "fc1", "units": 16}
        ]
        assert stale.effective_yaml is None
    database.dispose()
