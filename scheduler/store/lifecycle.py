"""A job's transitions, each an event with a time and a reason (the states and the moves they
allow: scheduler/store/states.py); a job's end is an event for its owner's webhooks too."""

from __future__ import annotations

from sqlalchemy.orm import Session

from scheduler.store.models import Job, JobEvent, utcnow
from scheduler.store.states import ALLOWED, JobState
from scheduler.store.webhooks import job_ended


class IllegalTransition(ValueError):
    def __init__(self, job_id: int, current: str, new: str) -> None:
        super().__init__(f"job {job_id} cannot go from {current} to {new}")


def transition(session: Session, job: Job, new: JobState, reason: str) -> bool:
    """Move `job` to `new`, recording the event. False if it is already there (idempotent)."""
    current = JobState(job.state)
    if current == new:
        return False
    if new not in ALLOWED[current]:
        raise IllegalTransition(job.id, current, new)
    now = utcnow()
    job.state = new
    if new == JobState.SCHEDULED:
        job.scheduled_at = now
    elif new == JobState.RUNNING and job.started_at is None:
        job.started_at = now
    elif new == JobState.QUEUED:
        job.scheduled_at = None
    if new.terminal:
        job.ended_at = now
        job_ended(session, job)  # its owner's webhooks, told once the transaction commits
    session.add(JobEvent(job_id=job.id, at=now, state=new, reason=reason))
    return True
