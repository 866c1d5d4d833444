"""The sweep store: plain functions over a Session for sweeps and their trial jobs.

A sweep row is written by the API when a document with a `search:` section is submitted; the
scheduler's sweep thread (scheduler/daemon/sweep_thread.py) creates its trials, each an ordinary job
with `sweep_id` and `trial_number` set. A user sees only their own sweeps (an admin every
one); another user's sweep is `NotFound`, as jobs are. The caller commits, except for
`cancel_sweep`: a user's whole request.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

import redis
from sqlalchemy import case, func, select
from sqlalchemy.orm import Session, object_session

from contract.keys import Keys
from dsl.objective import Objective
from dsl.search import SearchConfig
from scheduler.store.errors import Conflict, NotFound
from scheduler.store.jobs import request_cancel
from scheduler.store.models import Job, Sweep, User, utcnow
from scheduler.store.states import JobState, SweepState
from scheduler.store.webhooks import sweep_ended


@dataclass(frozen=True)
class NewSweep:
    """A checked sweep, ready to run."""

    name: str
    spec_yaml: str
    overrides: dict[str, Any]
    base_job: dict[str, Any]  # the document without `search`, overrides applied
    search: dict[str, Any]  # the validated search section
    base_dir: str | None
    priority: int = 0


def create_sweep(session: Session, owner: User, new: NewSweep) -> Sweep:
    sweep = Sweep(
        owner_id=owner.id,
        name=new.name,
        state=SweepState.RUNNING,
        priority=new.priority,
        spec_yaml=new.spec_yaml,
        overrides=new.overrides,
        base_job=new.base_job,
        search=new.search,
        base_dir=new.base_dir,
        # Not the id: a study outlives a job store that was reset, and must not be found again.
        study_name=f"trainyard-sweep-{uuid.uuid4().hex}",
        pareto_trials=[],
    )
    session.add(sweep)
    session.flush()
    return sweep


def get_sweep(session: Session, user: User, sweep_id: int, *, for_update: bool = False) -> Sweep:
    query = select(Sweep).where(Sweep.id == sweep_id)
    if not user.is_admin:
        query = query.where(Sweep.owner_id == user.id)
    if for_update:
        query = query.with_for_update()
    sweep = session.scalar(query)
    if sweep is None:
        raise NotFound(f"no sweep {sweep_id}")
    return sweep


def list_sweeps(
    session: Session, user: User, *, limit: int = 50, before_id: int | None = None
) -> list[Sweep]:
    """Newest first; a user's own, or every sweep for an admin."""
    query = select(Sweep).order_by(Sweep.id.desc()).limit(limit)
    if not user.is_admin:
        query = query.where(Sweep.owner_id == user.id)
    if before_id is not None:
        query = query.where(Sweep.id < before_id)
    return list(session.scalars(query))


def trials(session: Session, sweep_id: int) -> list[Job]:
    """The sweep's trial jobs in trial order."""
    return list(
        session.scalars(select(Job).where(Job.sweep_id == sweep_id).order_by(Job.trial_number))
    )


def trial_counts(session: Session, sweep_ids: list[int]) -> dict[int, tuple[int, int]]:
    """Each sweep's trials created and ended so far, in one query."""
    ended = case((Job.state.in_([s for s in JobState if s.terminal]), 1), else_=0)
    rows = session.execute(
        select(Job.sweep_id, func.count(), func.sum(ended))
        .where(Job.sweep_id.in_(sweep_ids))
        .group_by(Job.sweep_id)
    )
    counts = {sweep_id: (0, 0) for sweep_id in sweep_ids}
    counts.update({sweep_id: (int(n), int(done or 0)) for sweep_id, n, done in rows})
    return counts


def search_of(sweep: Sweep) -> SearchConfig:
    return SearchConfig.model_validate(sweep.search)


def trial_values(job: Job, objectives: list[Objective]) -> list[float] | None:
    """The trial's result: the last reported value of each objective's metric (None until the
    job reports them all)."""
    summary = job.summary or {}
    values = [summary.get(objective.metric) for objective in objectives]
    if any(not isinstance(value, int | float) for value in values):
        return None
    return [float(value) for value in values]  # type: ignore[arg-type]


def request_sweep_cancel(session: Session, sweep: Sweep, client: redis.Redis, keys: Keys) -> Sweep:
    """Stop asking for trials and cancel the live ones; the sweep is CANCELLED once they have
    ended (the scheduler's sweep thread sees to it)."""
    state = SweepState(sweep.state)
    if state.terminal:
        raise Conflict(f"sweep {sweep.id} is already {state}; only running sweeps can be cancelled")
    sweep.cancel_requested = True
    cancel_live_trials(session, sweep, client, keys)
    return sweep


def cancel_sweep(
    session: Session, user: User, sweep_id: int, client: redis.Redis, keys: Keys
) -> Sweep:
    """The user's request to cancel their sweep (an admin's: any), committed."""
    sweep = get_sweep(session, user, sweep_id, for_update=True)
    request_sweep_cancel(session, sweep, client, keys)
    session.commit()
    return sweep


def cancel_live_trials(session: Session, sweep: Sweep, client: redis.Redis, keys: Keys) -> None:
    live = session.scalars(
        select(Job)
        .where(Job.sweep_id == sweep.id, Job.state.not_in([s for s in JobState if s.terminal]))
        .with_for_update()
    )
    for job in live:
        request_cancel(session, job, client, keys)


def end_sweep(sweep: Sweep, state: SweepState, error: str | None = None) -> None:
    """Ends the sweep (a row of a session): its owner's webhooks are told when it commits."""
    sweep.state, sweep.ended_at = state, utcnow()
    if error is not None:
        sweep.error = error
    session = object_session(sweep)
    if session is not None:
        sweep_ended(session, sweep)
