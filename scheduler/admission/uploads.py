"""A dataset upload (POST /datasets): stored and checked (scheduler/store/datasets.py), held to
the user's dataset quota, committed."""

from __future__ import annotations

from typing import BinaryIO

from sqlalchemy.orm import Session

from contract.settings import Settings
from scheduler.admission.quotas import check_dataset_storage
from scheduler.store.datasets import save_dataset
from scheduler.store.models import DatasetRecord, User
from scheduler.store.quotas import limits_for


def upload_dataset(
    session: Session,
    user: User,
    *,
    name: str,
    filename: str,
    content: BinaryIO,
    settings: Settings,
) -> DatasetRecord:
    """Store `content` as the user's dataset `name`; an upload past a limit or the user's
    quota leaves nothing behind (the session is not committed, its file is removed)."""
    record = save_dataset(
        session,
        user,
        name=name,
        filename=filename,
        content=content,
        artifacts=settings.artifacts(),
        max_bytes=settings.max_dataset_bytes,
    )
    check_dataset_storage(session, user, limits_for(session, user, settings), record)
    session.commit()
    return record
