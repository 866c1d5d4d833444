"""Job states and their transitions; every transition is an event with a time and a reason.

QUEUED -> SCHEDULED -> RUNNING -> SUCCEEDED | FAILED | CANCELLED. A job whose node is lost
goes back to QUEUED to be placed again; any live state may end in FAILED or CANCELLED. A
sweep's trial that trails the others is PRUNED by the sweep's pruner once placed.
"""

from __future__ import annotations

from sqlalchemy.orm import Session

from scheduler.store.models import Job, JobEvent, JobState, utcnow

_ALLOWED: dict[JobState, set[JobState]] = {
    JobState.QUEUED: {JobState.SCHEDULED, JobState.CANCELLED, JobState.FAILED},
    JobState.SCHEDULED: {
        JobState.RUNNING,
        JobState.QUEUED,
        JobState.SUCCEEDED,
        JobState.FAILED,
        JobState.CANCELLED,
        JobState.PRUNED,
    },
    JobState.RUNNING: {
        JobState.SUCCEEDED,
        JobState.FAILED,
        JobState.CANCELLED,
        JobState.QUEUED,
        JobState.PRUNED,
    },
    JobState.SUCCEEDED: set(),
    JobState.FAILED: set(),
    JobState.CANCELLED: set(),
    JobState.PRUNED: set(),
}


class IllegalTransition(ValueError):
    def __init__(self, job_id: int, current: str, new: str) -> None:
        super().__init__(f"job {job_id} cannot go from {current} to {new}")


def transition(session: Session, job: Job, new: JobState, reason: str) -> bool:
    """Move `job` to `new`, recording the event. False if it is already there (idempotent)."""
    current = JobState(job.state)
    if current == new:
        return False
    if new not in _ALLOWED[current]:
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
    session.add(JobEvent(job_id=job.id, at=now, state=new, reason=reason))
    return True


def can_transition(current: str, new: JobState) -> bool:
    return new in _ALLOWED[JobState(current)]
