"""Datasets coming in and going: the one-request upload (POST /datasets), chunked uploads
(POST /datasets/uploads, PUT .../parts/{n}, POST .../complete) and deletion
(DELETE /datasets/{name}), each one use case held to the user's dataset quota and committed.

A chunked upload's declared size counts against the quota from its start until it completes,
is aborted or expires (scheduler/store/quotas.py `dataset_bytes`), so parts never pass it.
Completion checks the checksum, then the content in the intake's process of its own
(scheduler/store/intake.py), which may unpack it to no more than the quota leaves
(`intake_bounds`); only then is there a dataset. A completion that fails for its content or
checksum drops the upload: nothing of it is stored or counted.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, BinaryIO

from sqlalchemy import select
from sqlalchemy.orm import Session

from contract.settings import Settings
from scheduler.admission.quotas import QuotaExceeded, check_dataset_storage
from scheduler.store.datasets import (
    check_name,
    get_dataset,
    remove_stored,
    save_dataset,
    store_upload,
    upload_kind_of,
)
from scheduler.store.errors import Conflict, InvalidRequest, NotFound, UnpacksTooLarge
from scheduler.store.intake import Bound, IntakeBounds
from scheduler.store.models import DatasetRecord, Job, Sweep, User
from scheduler.store.quotas import dataset_bytes, limits_for
from scheduler.store.states import JobState, SweepState
from scheduler.store.uploads import (
    NewUpload,
    UploadLimits,
    UploadState,
    assemble,
    claim_for_completion,
    create_upload,
    delete_upload_row,
    drop_upload,
    folder_of,
    get_upload,
    missing_parts,
    open_uploads,
    purge_expired,
    state_of,
    write_part,
)

LIVE_JOBS = (JobState.QUEUED, JobState.SCHEDULED, JobState.RUNNING)


class ChecksumMismatch(InvalidRequest):
    """The parts put together are not the file whose SHA-256 the upload declared."""


class DatasetInUse(Conflict):
    """A dataset that queued or running jobs (or a running sweep) read."""

    def __init__(self, message: str, job_ids: list[int], sweep_ids: list[int]) -> None:
        super().__init__(message)
        self.job_ids, self.sweep_ids = job_ids, sweep_ids


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
    bounds = intake_bounds(session, user, settings, one_request=True)
    with past_the_quota(bounds):
        record = save_dataset(
            session,
            user,
            name=name,
            filename=filename,
            content=content,
            artifacts=settings.artifacts(),
            max_bytes=settings.max_dataset_bytes,
            bounds=bounds,
        )
    check_dataset_storage(session, user, limits_for(session, user, settings), record)
    session.commit()
    return record


def intake_bounds(
    session: Session, user: User, settings: Settings, *, one_request: bool = False
) -> IntakeBounds:
    """What taking an upload of the user's in may cost: unpacked, no more than the server's
    max_dataset_unpacked_bytes nor what their quota dataset_bytes leaves (sent in one request,
    no more than max_dataset_bytes either); the intake process's memory and CPU time."""
    quota = limits_for(session, user, settings).dataset_bytes
    bound = Bound(settings.max_dataset_unpacked_bytes, "max_dataset_unpacked_bytes")
    if quota is not None:
        left = max(0, quota - dataset_bytes(session, user.id))
        if left <= bound.bytes:
            bound = Bound(left, f"what your quota dataset_bytes of {quota} leaves", quota=True)
    if one_request and settings.max_dataset_bytes < bound.bytes:
        bound = Bound(settings.max_dataset_bytes, "max_dataset_bytes, sent in one request")
    return IntakeBounds(
        unpacked=bound,
        memory_bytes=settings.dataset_intake_memory_mb * 2**20,
        cpu_seconds=settings.dataset_intake_seconds,
    )


@contextmanager
def past_the_quota(bounds: IntakeBounds) -> Iterator[None]:
    """An upload that would unpack past what the quota leaves is refused as one past the
    quota (QuotaExceeded, as a dataset stored past it is); past the server's bound it stays
    UnpacksTooLarge."""
    try:
        yield
    except UnpacksTooLarge as error:
        if not bounds.unpacked.quota:
            raise
        raise QuotaExceeded(str(error)) from None


def upload_limits(settings: Settings) -> UploadLimits:
    return UploadLimits(
        max_bytes=settings.max_upload_bytes,
        max_part_bytes=settings.max_upload_part_bytes,
        max_parts=settings.max_upload_parts,
        max_open=settings.max_open_uploads,
        expiry=timedelta(seconds=settings.upload_expiry_seconds),
    )


@dataclass(frozen=True)
class StartUpload:
    name: str
    filename: str
    size: int
    sha256: str
    part_size: int | None = None  # None: the service's largest part
    label_column: str | None = None


def start_upload(
    session: Session, user: User, start: StartUpload, settings: Settings
) -> UploadState:
    """Open a chunked upload, its declared size held against the user's quota."""
    artifacts = settings.artifacts()
    purge_expired(session, artifacts)
    check_name(start.name)
    kind = upload_kind_of(start.filename)
    if start.label_column is not None and kind not in ("csv", "parquet"):
        raise InvalidRequest("label_column applies to .csv and .parquet tables only")
    if get_dataset(session, user.id, start.name) is not None:
        raise Conflict(
            f"you already have a dataset named '{start.name}'; delete it or upload under "
            "another name"
        )
    new = NewUpload(
        name=start.name,
        filename=start.filename,
        kind=kind,
        size=start.size,
        sha256=start.sha256.lower(),
        part_size=start.part_size or settings.max_upload_part_bytes,
        label_column=start.label_column,
    )
    upload = create_upload(session, user, new, upload_limits(settings))
    limits = limits_for(session, user, settings)
    if limits.dataset_bytes is not None:
        used = dataset_bytes(session, user.id)  # this upload's size with the rest
        if used > limits.dataset_bytes:
            session.rollback()
            raise QuotaExceeded(
                f"your datasets and open uploads would take {used} bytes with this one, over "
                f"your quota dataset_bytes of {limits.dataset_bytes}; delete a dataset or "
                "abort an upload first"
            )
    session.commit()
    return state_of(upload, artifacts)


def list_uploads(session: Session, user: User, settings: Settings) -> list[UploadState]:
    artifacts = settings.artifacts()
    purge_expired(session, artifacts)
    return [state_of(upload, artifacts) for upload in open_uploads(session, user.id)]


def upload_state(session: Session, user: User, upload_id: str, settings: Settings) -> UploadState:
    return state_of(get_upload(session, user, upload_id), settings.artifacts())


def put_part(
    session: Session,
    user: User,
    upload_id: str,
    number: int,
    chunks: Iterable[bytes],
    settings: Settings,
) -> int:
    """Store part `number` of the upload (again, if it was there); its bytes."""
    upload = get_upload(session, user, upload_id)
    written = write_part(
        session,
        upload,
        number,
        chunks,
        artifacts=settings.artifacts(),
        expiry=upload_limits(settings).expiry,
    )
    session.commit()
    return written


def abort_upload(session: Session, user: User, upload_id: str, settings: Settings) -> None:
    upload = get_upload(session, user, upload_id)
    if upload.completing:
        raise Conflict(f"upload {upload_id} is being completed")
    drop_upload(session, upload, settings.artifacts())
    session.commit()


def complete_upload(
    session: Session, user: User, upload_id: str, settings: Settings
) -> DatasetRecord:
    """Put the parts together, check the checksum and the content, store the dataset. Every
    part must be there (else nothing changes); past that, a failure drops the upload."""
    artifacts = settings.artifacts()
    upload = get_upload(session, user, upload_id)
    missing = missing_parts(upload, artifacts)
    if missing:
        shown = ", ".join(map(str, missing[:20])) + (" ..." if len(missing) > 20 else "")
        raise InvalidRequest(
            f"{len(missing)} part(s) of the upload have not arrived: {shown}; send them "
            "(PUT .../parts/{n}) and complete again"
        )
    claim_for_completion(session, upload, upload_limits(settings).expiry)
    name, filename, kind, label_column, declared = (
        upload.name,
        upload.filename,
        upload.kind,
        upload.label_column,
        upload.sha256,
    )
    folder = folder_of(upload, artifacts)
    assembled = folder / f"assembled.{kind}"
    try:
        digest = assemble(upload, artifacts, assembled)
        if digest != declared:
            raise ChecksumMismatch(
                f"the parts put together have SHA-256 {digest}, not the {declared} declared "
                "at the start: the file changed or a part was corrupted. Nothing was stored; "
                "upload the file again"
            )
        # The upload's reservation goes as the dataset's own size comes to count.
        delete_upload_row(session, upload_id)
        bounds = intake_bounds(session, user, settings)
        with past_the_quota(bounds):
            record = store_upload(
                session,
                user,
                name=name,
                kind=kind,
                assembled=assembled,
                artifacts=artifacts,
                filename=filename,
                label_column=label_column,
                bounds=bounds,
            )
        check_dataset_storage(session, user, limits_for(session, user, settings), record)
        session.commit()
    except BaseException:
        session.rollback()
        delete_upload_row(session, upload_id)
        session.commit()
        raise
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return record


def delete_dataset(session: Session, user: User, name: str, settings: Settings) -> None:
    """Delete the user's dataset `name` and free its bytes; refused while a queued or running
    job or a running sweep reads it."""
    record = get_dataset(session, user.id, name)
    if record is None:
        raise NotFound(f"you have no dataset named '{name}'")
    job_ids = jobs_reading(session, record)
    sweep_ids = sweeps_reading(session, record)
    if job_ids or sweep_ids:
        users = [f"job {i}" for i in job_ids] + [f"sweep {i}" for i in sweep_ids]
        raise DatasetInUse(
            f"dataset '{name}' is read by {', '.join(users)}, queued or running; cancel them "
            "or wait for them to end",
            job_ids,
            sweep_ids,
        )
    path = Path(record.path)
    session.delete(record)
    session.commit()
    remove_stored(path)


def jobs_reading(session: Session, record: DatasetRecord) -> list[int]:
    """The owner's queued or running jobs whose execution spec reads the dataset's file."""
    stored = Path(record.path).resolve()
    rows = session.execute(
        select(Job.id, Job.spec).where(Job.owner_id == record.owner_id, Job.state.in_(LIVE_JOBS))
    )
    return sorted(
        job_id
        for job_id, spec in rows
        if (path := (spec or {}).get("data", {}).get("path")) and Path(path).resolve() == stored
    )


def sweeps_reading(session: Session, record: DatasetRecord) -> list[int]:
    """The owner's running sweeps whose trials name the dataset."""
    rows = session.execute(
        select(Sweep.id, Sweep.base_job).where(
            Sweep.owner_id == record.owner_id, Sweep.state == SweepState.RUNNING
        )
    )
    return sorted(
        sweep_id
        for sweep_id, base_job in rows
        if _names_dataset((base_job or {}).get("data") or {}, record.name)
    )


def _names_dataset(data: dict[str, Any], name: str) -> bool:
    return (data.get("source") == "dataset" and data.get("name") == name) or data.get(
        "dataset"
    ) == name
