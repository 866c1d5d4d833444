"""The quotas checked at submission: a job the user's quotas can never let run, and uploads
past the user's storage (the quotas themselves: scheduler/store/quotas.py)."""

from __future__ import annotations

import shutil
from pathlib import Path

from sqlalchemy.orm import Session

from scheduler.store.errors import StoreError
from scheduler.store.models import DatasetRecord, User
from scheduler.store.quotas import Limits, artifact_bytes, dataset_bytes, queued_jobs


class QuotaExceeded(StoreError):
    """A request past one of the user's quotas; the message names it."""


def check_new_job(
    session: Session,
    user: User,
    limits: Limits,
    *,
    train_steps: int,
    slots: int,
    gpus: int,
    max_trials: int | None = None,
) -> None:
    """Refuse a job the user's quotas can never let run, one submitted while the user's
    checkpoints fill their storage or their queue, or a sweep of more trials than they may
    run (`max_trials`: a sweep's). Raises QuotaExceeded naming the quota."""
    over = limits.sweep_trials is not None and (max_trials or 0) > limits.sweep_trials
    if over:
        raise QuotaExceeded(
            f"the sweep runs {max_trials} trials (search.max_trials, a grid's size or pbt's "
            "members x generations), over your quota "
            f"sweep_trials of {limits.sweep_trials}"
        )
    if max_trials is None and limits.queued_jobs is not None:
        waiting = queued_jobs(session, user.id)
        if waiting >= limits.queued_jobs:
            raise QuotaExceeded(
                f"you have {waiting} job(s) waiting in the queue, your quota queued_jobs of "
                f"{limits.queued_jobs}; submit more once some have started, or cancel some"
            )
    if limits.train_steps is not None and train_steps > limits.train_steps:
        raise QuotaExceeded(
            f"train_steps {train_steps} is over your quota train_steps of {limits.train_steps}"
        )
    if limits.slots is not None and slots > limits.slots:
        raise QuotaExceeded(
            f"the job needs {slots} worker slot(s); your quota slots is {limits.slots}, so it "
            "could never start"
        )
    if limits.gpus is not None and gpus > limits.gpus:
        raise QuotaExceeded(
            f"the job needs {gpus} GPU(s); your quota gpus is {limits.gpus}, so it could never "
            "start"
        )
    if limits.artifact_bytes is not None:
        used = artifact_bytes(session, user.id)
        if used >= limits.artifact_bytes:
            raise QuotaExceeded(
                f"your jobs' checkpoints use {used} bytes, at or over your quota artifact_bytes "
                f"of {limits.artifact_bytes}; delete finished jobs to submit more"
            )


def check_dataset_storage(
    session: Session, user: User, limits: Limits, record: DatasetRecord
) -> None:
    """After `record`, a new upload, was added (flushed, not committed): if the user's datasets
    now pass their quota, delete its file and refuse it (the caller rolls the row back)."""
    if limits.dataset_bytes is None:
        return
    used = dataset_bytes(session, user.id)
    if used > limits.dataset_bytes:
        stored = Path(record.path)
        if stored.is_dir():  # a .tar of shards, unpacked
            shutil.rmtree(stored, ignore_errors=True)
        else:
            stored.unlink(missing_ok=True)
        raise QuotaExceeded(
            f"with this upload your datasets would take {used} bytes, over your quota "
            f"dataset_bytes of {limits.dataset_bytes}; delete a dataset first"
        )
