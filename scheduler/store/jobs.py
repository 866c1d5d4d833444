"""Jobs in the store: create, read, list, cancel and delete them (plain functions over a
SQLAlchemy Session; the caller commits, except for a user's whole request: `cancel_job` and
`delete_job` commit it).

A user sees only their own jobs; an admin sees every job; another user's job is `NotFound`, so
ids don't leak.
"""

from __future__ import annotations

import base64
import binascii
import shutil
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import redis
from sqlalchemy import Select, delete, func, select
from sqlalchemy.orm import Session

from contract.keys import CANCEL_TTL_SECONDS, Keys
from contract.rundir import job_run_dir
from dsl.run_kinds import TRAINING
from scheduler.store import job_page
from scheduler.store.artifacts import confine_to_job
from scheduler.store.errors import Conflict, InvalidRequest, NotFound
from scheduler.store.lifecycle import transition
from scheduler.store.models import CheckpointRecord, Job, JobEvent, User
from scheduler.store.states import JobState

MAX_ID = 2**31 - 1  # ids are 32-bit integer columns


@dataclass(frozen=True)
class NewJob:
    """A checked job, ready to queue."""

    name: str
    spec_yaml: str
    overrides: dict[str, Any]
    spec: dict[str, Any]  # validated, overrides applied, datasets resolved: what workers run
    topology: dict[str, Any]
    framework: str  # a training run's; "" for a run of a kind that does not train
    train_steps: int
    priority: int = 0
    kind: str = TRAINING.name  # what its processes do (dsl/run_kinds.py)
    sweep_id: int | None = None  # a sweep's trial: its sweep and its number there
    trial_number: int | None = None
    # The resolved objective (dsl/objective.py) its best metric is the best of; without a
    # validation split and an objective, a classifier's is test/accuracy.
    objective: str = "test/accuracy"
    objective_mode: str = "max"
    # the plugin types it uses (dsl/plugins.py plugin_needs); None: none
    plugins: list[dict[str, str]] | None = None
    # The document with the overrides applied (dsl/overrides.py); None: spec_yaml, which has
    # no overrides.
    effective_yaml: str | None = None
    # Its compiled net (dsl.compiler.CompiledJob.graph); None: a prediction run.
    graph: dict[str, Any] | None = None


def create_job(session: Session, owner: User, new: NewJob) -> Job:
    """Queue `new`. A sweep's (sweep, trial number) pair is unique: a second job for one trial
    fails here, at the flush."""
    job = Job(
        owner_id=owner.id,
        name=new.name,
        state=JobState.QUEUED,
        priority=new.priority,
        spec_yaml=new.spec_yaml,
        overrides=new.overrides,
        effective_yaml=new.spec_yaml if new.effective_yaml is None else new.effective_yaml,
        spec=new.spec,
        topology=new.topology,
        plugins=new.plugins,
        kind=new.kind,
        framework=new.framework,
        train_steps=new.train_steps,
        objective=new.objective,
        objective_mode=new.objective_mode,
        sweep_id=new.sweep_id,
        trial_number=new.trial_number,
        graph=new.graph,
        summary={},
    )
    session.add(job)
    session.flush()
    session.add(
        JobEvent(job_id=job.id, at=job.created_at, state=JobState.QUEUED, reason="submitted")
    )
    return job


def _visible(query: Select[Any], user: User) -> Select[Any]:
    return query if user.is_admin else query.where(Job.owner_id == user.id)


def get_job(session: Session, user: User, job_id: int, *, for_update: bool = False) -> Job:
    query = _visible(select(Job).where(Job.id == job_id), user)
    if for_update:
        query = query.with_for_update()
    job = session.scalar(query)
    if job is None:
        raise NotFound(f"no job {job_id}")
    return job


def own_job(session: Session, owner_id: int, job_id: int) -> Job | None:
    """The job if it is `owner_id`'s own (an admin's included: not another user's)."""
    return session.scalar(select(Job).where(Job.id == job_id, Job.owner_id == owner_id))


def owner_names(session: Session, owner_ids: set[int]) -> dict[int, str]:
    if not owner_ids:
        return {}
    rows = session.execute(select(User.id, User.name).where(User.id.in_(owner_ids)))
    return {user_id: name for user_id, name in rows}


def encode_cursor(job_id: int) -> str:
    return base64.urlsafe_b64encode(f"job:{job_id}".encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> int:
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        text = base64.b64decode(padded, altchars=b"-_", validate=True).decode()
        kind, _, value = text.partition(":")
        # Ids are 32-bit columns: a longer number names no job (and fails in the query).
        if kind != "job" or not value.isdigit() or len(value) > 10 or int(value) > MAX_ID:
            raise ValueError(text)
        return int(value)
    except (ValueError, UnicodeDecodeError, binascii.Error):
        raise InvalidRequest(
            f"cursor '{cursor}' is not one this server handed out (use next_cursor as given)"
        ) from None


def list_jobs(
    session: Session,
    user: User,
    *,
    states: list[JobState] | None = None,
    name: str | None = None,
    limit: int = 50,
    cursor: str | None = None,
    now: datetime | None = None,
) -> tuple[str, str | None]:
    """Newest first; `name` matches anywhere in the job name, in any case. Returns the page,
    a JSON array of the API's JobOut objects built by the database (scheduler/job_page.py: the
    API's busiest read), and the cursor of the next page (None on the last). `now` ends
    running jobs' durations (default the current time)."""
    page = job_page.page_json(
        session,
        user,
        states=states,
        name=name,
        limit=limit,
        before_id=decode_cursor(cursor) if cursor else None,
        now=now,
    )
    if page.more and page.last_id is not None:
        return page.items, encode_cursor(page.last_id)
    return page.items, None


def queue_positions(session: Session) -> dict[int, int]:
    """1-based place of every queued job in the order the scheduler places them."""
    rows = session.connection().execute(job_page.QUEUE_POSITIONS)
    return {job_id: position for job_id, position in rows}


def request_cancel(session: Session, job: Job, client: redis.Redis, keys: Keys) -> Job:
    """Ask every process of `job` to stop. A queued job ends at once; a placed or running one
    when its node agent has killed its processes (it polls the Redis key set here)."""
    state = JobState(job.state)
    if state.terminal:
        raise Conflict(f"job {job.id} is already {state}; only live jobs can be cancelled")
    job.cancel_requested = True
    # The key goes out even for a queued job: the scheduler may be placing it right now.
    client.set(keys.cancel(job.id), "1", ex=CANCEL_TTL_SECONDS)
    if state == JobState.QUEUED:
        transition(session, job, JobState.CANCELLED, "cancelled by the user before it was placed")
    return job


def cancel_job(session: Session, user: User, job_id: int, client: redis.Redis, keys: Keys) -> Job:
    """The user's request to cancel their job (an admin's: any), committed."""
    job = get_job(session, user, job_id, for_update=True)
    request_cancel(session, job, client, keys)
    session.commit()
    return job


def delete_job(
    session: Session, job: Job, *, artifacts: Path, client: redis.Redis, keys: Keys
) -> None:
    """Remove a finished job: its rows (records cascade), its files and its Redis keys;
    committed."""
    state = JobState(job.state)
    if not state.terminal:
        raise Conflict(f"job {job.id} is {state}; cancel it and wait until it ends to delete it")
    recorded = session.scalars(
        select(CheckpointRecord.path).where(CheckpointRecord.job_id == job.id)
    )
    # Every path is checked before any is deleted: one that leads out refuses the whole delete.
    paths = [
        confine_to_job(path, artifacts, job.id, what=f"job {job.id}'s checkpoint")
        for path in recorded
    ]
    for path in paths:
        path.unlink(missing_ok=True)
    shutil.rmtree(job_run_dir(artifacts, job.id), ignore_errors=True)
    session.execute(delete(Job).where(Job.id == job.id))
    pipe = client.pipeline(transaction=False)
    pipe.delete(keys.job_stream(job.id), keys.cancel(job.id))
    pipe.srem(keys.streams_with_data, str(job.id))
    pipe.execute()
    session.commit()


def job_events(session: Session, job_id: int) -> list[JobEvent]:
    return list(
        session.scalars(select(JobEvent).where(JobEvent.job_id == job_id).order_by(JobEvent.id))
    )


def job_counts(session: Session) -> dict[str, int]:
    """Jobs per state (every state present, zeros included)."""
    rows = session.execute(select(Job.state, func.count()).group_by(Job.state))
    counts = {str(state): 0 for state in JobState}
    counts.update({state: count for state, count in rows})
    return counts


# Logs, checkpoints and timelines -----------------------------------------------------------
