"""Where a worker restarted alone goes on from (scheduler/recovery/actions.py), against a real
database: the step its last report was whole at, its later reports forgotten so that the new
process makes them again. The SIGKILL of a real downpour worker is
tests/scheduler/test_faults.py::test_a_killed_worker_of_an_asynchronous_job_restarts_alone."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from contract.allocation import AllocationState
from scheduler.recovery.actions import alone_restart_step, forget_reports_past, restart_alone
from scheduler.recovery.policy import RestartAlone
from scheduler.store.database import Database
from scheduler.store.jobs import NewJob, create_job
from scheduler.store.models import Allocation, Metric, Node
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


def test_a_pipelines_stages_restart_together_from_the_earliest_of_their_steps(
    db: Database,
) -> None:
    """An asynchronous pipeline's stage failed: the other stages of its pipeline (and only
    those) are written off to restart with it, and all go on from one step."""
    with db.session() as session:
        owner = create_user(session, "bob")
        job = create_job(
            session,
            owner,
            NewJob(
                name="async-pipeline",
                spec_yaml="name: async-pipeline\n",
                overrides={},
                spec={"name": "async-pipeline", "disp_freq": EVERY},
                topology={"workers": 4, "stages": 2, "nworkers_per_group": 2},
                framework="downpour",
                train_steps=2000,
            ),
        )
        node = Node(name="n1", queue="q.n1", slots=6)
        session.add(node)
        session.flush()
        places = [("worker", g, r) for g in (0, 1) for r in (0, 1)] + [("server", 0, 0)]
        allocs = {
            place: Allocation(
                job_id=job.id,
                node_id=node.id,
                role=place[0],
                group=place[1],
                rank=place[2],
                state=AllocationState.RUNNING,
            )
            for place in places
        }
        session.add_all(allocs.values())
        # Stage 1 of pipeline 1 reported step 600 in full; stage 0 was a window behind.
        report(session, job.id, 1, "train/loss", *range(EVERY, 601, EVERY))
        session.add_all(
            Metric(job_id=job.id, name="train/loss", step=s, value=0.5, group=1, rank=1, at=0.0)
            for s in range(EVERY, 651, EVERY)
        )
        session.flush()

        victim = allocs[("worker", 1, 1)]
        victim.state = AllocationState.FAILED
        stops = restart_alone(session, job, victim, RestartAlone("killed", group=True))
        assert stops == [allocs[("worker", 1, 0)].id]
        assert allocs[("worker", 1, 0)].state == AllocationState.FAILED
        others = [allocs[("worker", 0, 0)], allocs[("worker", 0, 1)], allocs[("server", 0, 0)]]
        assert {a.state for a in others} == {AllocationState.RUNNING}
        assert job.restarts == 1
        # Both stages go on from stage 0's last whole report.
        assert alone_restart_step(session, job, 1, 1) == alone_restart_step(session, job, 1, 0)
        assert alone_restart_step(session, job, 1, 0) == 550
