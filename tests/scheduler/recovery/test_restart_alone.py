"""Where a worker restarted alone goes on from (scheduler/recovery/actions.py), against a real
database: the step its last report was whole at, its later reports forgotten so that the new
process makes them again. The SIGKILL of a real downpour worker is
tests/scheduler/test_faults.py::test_a_killed_worker_of_an_asynchronous_job_restarts_alone."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from scheduler.recovery.actions import alone_restart_step, forget_reports_past
from scheduler.store.database import Database
from scheduler.store.jobs import NewJob, create_job
from scheduler.store.models import Metric
from scheduler.store.users import create_user

EVERY = 50


@pytest.fixture
def db(migrated_sql_url: str) -> Iterator[Database]:
    database = Database(migrated_sql_url)
    yield database
    database.dispose()


def report(session: Session, job_id: int, group: int, name: str, *steps: int) -> None:
    for step in steps:
        session.add(
            Metric(job_id=job_id, name=name, step=step, value=0.5, group=group, rank=0, at=0.0)
        )


def test_a_step_half_reported_when_the_worker_died_is_reported_again(db: Database) -> None:
    with db.session() as session:
        owner = create_user(session, "alice")
        job = create_job(
            session,
            owner,
            NewJob(
                name="async",
                spec_yaml="name: async\n",
                overrides={},
                spec={"name": "async", "disp_freq": EVERY},
                topology={"workers": 2},
                framework="downpour",
                train_steps=2000,
            ),
        )
        session.flush()
        # Worker 1/0 reported its update's ps figures of step 1000, then died before its
        # training figures of that step; worker 0/0 went on to step 1100.
        report(session, job.id, 1, "train/loss", *range(EVERY, 1000, EVERY))
        report(session, job.id, 1, "ps/version", *range(EVERY, 1001, EVERY))
        report(session, job.id, 0, "train/loss", *range(EVERY, 1101, EVERY))
        session.flush()

        start = alone_restart_step(session, job, 1, 0)
        assert start == 950
        forget_reports_past(session, job, 1, 0, start)
        session.flush()
        kept = session.execute(
            select(Metric.group, Metric.name, Metric.step).where(Metric.job_id == job.id)
        ).all()
        assert max(step for group, _, step in kept if group == 1) == 950
        assert max(step for group, _, step in kept if group == 0) == 1100  # the others' stay
        # Whole reports are made again too (their evaluation may have been cut off).
        assert alone_restart_step(session, job, 0, 0) == 1050
        assert alone_restart_step(session, job, 2, 0) == 0  # nothing reported: from the start
