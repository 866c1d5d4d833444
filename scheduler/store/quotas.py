"""Per-user quotas: the operator's defaults (settings `quota_*`), what an admin changed, and
what a user uses now.

Two kinds, enforced in two places:
- at submission (scheduler/admission/quotas.py refuses with 403, nothing is stored):
  `train_steps`, storage (`dataset_bytes` on upload, `artifact_bytes` kept by the user's jobs),
  and a job that asks for more slots or GPUs than the user may ever hold;
- at placement (scheduler/placement/plan.py): `running_jobs`, `slots` and `gpus` held at once.
  A job past them waits in the queue, with the quota as its reason, and starts when the user's
  other jobs end: users of a training service expect to queue work, not to resubmit it.
`submissions_per_minute` is the submission rate, `validations_per_minute` that of dry runs
(POST /jobs/validate), each with its own allowance (scheduler/admission/rate_limit.py);
`queued_jobs` bounds the jobs a user has waiting at once and `sweep_trials` a sweep's
`max_trials`, both at submission.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from contract.allocation import AllocationState
from contract.settings import Settings
from scheduler.store.models import (
    QUOTA_NAMES,
    Allocation,
    CheckpointRecord,
    DatasetRecord,
    DatasetUpload,
    Job,
    User,
    UserQuota,
    utcnow,
)
from scheduler.store.states import JobState

ACTIVE = (AllocationState.PENDING, AllocationState.RUNNING)
LIVE = (JobState.SCHEDULED, JobState.RUNNING)


@dataclass(frozen=True)
class Limits:
    """The quotas in force for one user; None: no limit."""

    running_jobs: int | None = None
    slots: int | None = None
    gpus: int | None = None
    train_steps: int | None = None
    dataset_bytes: int | None = None
    artifact_bytes: int | None = None
    submissions_per_minute: int | None = None
    validations_per_minute: int | None = None
    queued_jobs: int | None = None
    sweep_trials: int | None = None

    @classmethod
    def defaults(cls, settings: Settings) -> Limits:
        return cls(**{name: getattr(settings, f"quota_{name}") for name in QUOTA_NAMES})

    def with_overrides(self, row: UserQuota | None) -> Limits:
        if row is None:
            return self
        given = {name: getattr(row, name) for name in QUOTA_NAMES}
        return Limits(
            **{
                name: given[name] if given[name] is not None else getattr(self, name)
                for name in QUOTA_NAMES
            }
        )


@dataclass(frozen=True)
class Usage:
    running_jobs: int = 0
    slots: int = 0
    gpus: int = 0
    queued_jobs: int = 0
    dataset_bytes: int = 0
    artifact_bytes: int = 0


def overrides(session: Session, user_id: int) -> UserQuota | None:
    return session.get(UserQuota, user_id)


def limits_for(session: Session, user: User, settings: Settings) -> Limits:
    return Limits.defaults(settings).with_overrides(overrides(session, user.id))


@dataclass(frozen=True)
class QuotaReport:
    """A user's quotas in force, which of them were set for the user, and what they use."""

    user: str
    limits: Limits
    overrides: list[str]  # the quotas set for this user rather than the operator's defaults
    usage: Usage


def quota_report(session: Session, user: User, settings: Settings) -> QuotaReport:
    own = overrides(session, user.id)
    return QuotaReport(
        user=user.name,
        limits=Limits.defaults(settings).with_overrides(own),
        overrides=[
            name for name in QUOTA_NAMES if own is not None and getattr(own, name) is not None
        ],
        usage=usage_of(session, user),
    )


def set_quotas(session: Session, user: User, changes: dict[str, Any]) -> UserQuota:
    """Set the user's own quotas in `changes` (a None value: back to the default)."""
    unknown = sorted(set(changes) - set(QUOTA_NAMES))
    if unknown:
        raise ValueError(f"unknown quota(s) {unknown}; quotas are {list(QUOTA_NAMES)}")
    row = overrides(session, user.id)
    if row is None:
        row = UserQuota(user_id=user.id)
        session.add(row)
    for name, value in changes.items():
        setattr(row, name, value)
    row.updated_at = utcnow()
    session.flush()
    return row


def change_quotas(session: Session, user: User, changes: dict[str, Any]) -> None:
    """An admin's change of the user's quotas (set_quotas), committed."""
    set_quotas(session, user, changes)
    session.commit()


def usage_of(session: Session, user: User) -> Usage:
    running = session.scalar(
        select(func.count()).where(Job.owner_id == user.id, Job.state.in_(LIVE))
    )
    slots, gpus = session.execute(
        select(
            func.coalesce(func.sum(Allocation.slots), 0),
            func.coalesce(func.sum(Allocation.gpus), 0),
        )
        .join(Job, Job.id == Allocation.job_id)
        .where(Job.owner_id == user.id, Allocation.state.in_(ACTIVE))
    ).one()
    return Usage(
        running_jobs=int(running or 0),
        queued_jobs=queued_jobs(session, user.id),
        slots=int(slots),
        gpus=int(gpus),
        dataset_bytes=dataset_bytes(session, user.id),
        artifact_bytes=artifact_bytes(session, user.id),
    )


def queued_jobs(session: Session, user_id: int) -> int:
    """The user's jobs waiting in the queue (a sweep's trials included)."""
    count = session.scalar(
        select(func.count()).where(Job.owner_id == user_id, Job.state == JobState.QUEUED)
    )
    return int(count or 0)


def dataset_bytes(session: Session, user_id: int) -> int:
    """The user's datasets, and the declared sizes of their chunked uploads still open."""
    stored = session.scalar(
        select(func.coalesce(func.sum(DatasetRecord.size), 0)).where(
            DatasetRecord.owner_id == user_id
        )
    )
    uploading = session.scalar(
        select(func.coalesce(func.sum(DatasetUpload.size), 0)).where(
            DatasetUpload.owner_id == user_id, DatasetUpload.expires_at > utcnow()
        )
    )
    return int(stored or 0) + int(uploading or 0)


def artifact_bytes(session: Session, user_id: int) -> int:
    total = session.scalar(
        select(func.coalesce(func.sum(CheckpointRecord.size), 0))
        .join(Job, Job.id == CheckpointRecord.job_id)
        .where(Job.owner_id == user_id)
    )
    return int(total or 0)
