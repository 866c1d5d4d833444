"""What each worker process of a job trained with (contract.stream.EnvironmentRecord), as the
ingester stores it."""

from __future__ import annotations

from collections.abc import Iterable

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from contract.stream import EnvironmentRecord
from scheduler.store.models import JobEnvironment, utcnow


def save_environments(session: Session, job_id: int, records: Iterable[EnvironmentRecord]) -> None:
    """Each record becomes its process's (group, rank) row: a restarted process's newer
    report replaces the one before."""
    for record in records:
        session.execute(
            delete(JobEnvironment).where(
                JobEnvironment.job_id == job_id,
                JobEnvironment.group == record.group,
                JobEnvironment.rank == record.rank,
            )
        )
        session.add(
            JobEnvironment(
                job_id=job_id,
                group=record.group,
                rank=record.rank,
                facts=record.facts(),
                packages=list(record.packages),
                reported_at=utcnow(),
            )
        )


def environments(session: Session, job_id: int) -> list[JobEnvironment]:
    """The job's processes' environments, by group and rank (the first: group 0, rank 0)."""
    return list(
        session.scalars(
            select(JobEnvironment)
            .where(JobEnvironment.job_id == job_id)
            .order_by(JobEnvironment.group, JobEnvironment.rank)
        )
    )


def first_environment(session: Session, job_id: int) -> JobEnvironment | None:
    found = environments(session, job_id)
    return found[0] if found else None
