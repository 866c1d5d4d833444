"""Chunked dataset uploads: the row of an open upload, its parts on disk, their assembly.

An upload declares its name, file name, size and sha256 at its start, and the size of its
parts; part n (from 0) then holds bytes [n * part_size, (n + 1) * part_size) of the file, the
last one the rest. A part is written to a file of its own and renamed into place, so a part
is there whole or not at all, and sending it again replaces it (idempotent). Which parts are
there is read from the folder: that is the upload's state a client resumes from.
"""

from __future__ import annotations

import hashlib
import math
import os
import re
import secrets
import shutil
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

from sqlalchemy import delete, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from contract.rundir import upload_dir
from scheduler.store.errors import Conflict, InvalidRequest, NotFound
from scheduler.store.models import DatasetUpload, User, aware, utcnow

MIN_PART = 2**16  # bytes of every part but the last
SHA256 = re.compile(r"^[0-9a-f]{64}$")
_PART = re.compile(r"^(\d{5,})\.part$")
CHUNK = 1 << 20


@dataclass(frozen=True)
class UploadLimits:
    max_bytes: int
    max_part_bytes: int
    max_parts: int
    max_open: int
    expiry: timedelta


@dataclass(frozen=True)
class NewUpload:
    name: str
    filename: str
    kind: str
    size: int
    sha256: str
    part_size: int
    label_column: str | None = None


@dataclass(frozen=True)
class UploadState:
    """An upload as its client sees it: what was declared, which parts arrived."""

    upload: DatasetUpload
    parts: int  # how many the file makes
    received: list[int]  # the parts that arrived, ascending
    received_bytes: int


def part_count(size: int, part_size: int) -> int:
    return max(1, math.ceil(size / part_size))


def part_length(upload: DatasetUpload, number: int) -> int:
    """The bytes part `number` must hold."""
    return min(upload.part_size, upload.size - number * upload.part_size)


def check_declared(new: NewUpload, limits: UploadLimits) -> None:
    if not SHA256.fullmatch(new.sha256):
        raise InvalidRequest("sha256 is the file's SHA-256 digest: 64 lowercase hex digits")
    if new.size < 1:
        raise InvalidRequest("the file is empty")
    if new.size > limits.max_bytes:
        raise InvalidRequest(
            f"the file's {new.size} bytes are more than the service's limit of "
            f"{limits.max_bytes} bytes for one upload"
        )
    if not MIN_PART <= new.part_size <= limits.max_part_bytes:
        raise InvalidRequest(
            f"part_size {new.part_size} is outside {MIN_PART}..{limits.max_part_bytes} bytes"
        )
    parts = part_count(new.size, new.part_size)
    if parts > limits.max_parts:
        raise InvalidRequest(
            f"{new.size} bytes in parts of {new.part_size} make {parts} parts, more than the "
            f"limit of {limits.max_parts}; use parts of at least "
            f"{math.ceil(new.size / limits.max_parts)} bytes"
        )


def open_uploads(session: Session, owner_id: int) -> list[DatasetUpload]:
    """The owner's uploads not expired, oldest first."""
    return list(
        session.scalars(
            select(DatasetUpload)
            .where(DatasetUpload.owner_id == owner_id, DatasetUpload.expires_at > utcnow())
            .order_by(DatasetUpload.created_at, DatasetUpload.id)
        )
    )


def create_upload(
    session: Session, owner: User, new: NewUpload, limits: UploadLimits
) -> DatasetUpload:
    """The upload's row (flushed, not committed); a Conflict where the owner already has an
    open upload of the name or `max_open` open uploads."""
    check_declared(new, limits)
    mine = open_uploads(session, owner.id)
    if any(upload.name == new.name for upload in mine):
        raise Conflict(
            f"an upload of '{new.name}' is already open; resume it (GET "
            "/api/v1/datasets/uploads lists yours) or abort it"
        )
    if len(mine) >= limits.max_open:
        raise Conflict(f"you have {len(mine)} uploads open, the limit; complete or abort one first")
    upload = DatasetUpload(
        id=secrets.token_hex(16),
        owner_id=owner.id,
        name=new.name,
        filename=new.filename,
        kind=new.kind,
        size=new.size,
        part_size=new.part_size,
        sha256=new.sha256,
        label_column=new.label_column,
        completing=False,
        expires_at=utcnow() + limits.expiry,
    )
    session.add(upload)
    try:
        session.flush()
    except IntegrityError:  # an expired upload of the name not yet purged, or a race
        raise Conflict(
            f"an upload of '{new.name}' is already open or expired moments ago; try again"
        ) from None
    return upload


def get_upload(session: Session, owner: User, upload_id: str) -> DatasetUpload:
    upload = session.get(DatasetUpload, upload_id)
    if upload is None or upload.owner_id != owner.id or aware(upload.expires_at) <= utcnow():
        raise NotFound(f"you have no open upload {upload_id}")
    return upload


def folder_of(upload: DatasetUpload, artifacts: Path) -> Path:
    return upload_dir(artifacts, upload.owner_id, upload.id)


def received_parts(upload: DatasetUpload, artifacts: Path) -> list[int]:
    folder = folder_of(upload, artifacts)
    if not folder.is_dir():
        return []
    numbers = (_PART.fullmatch(entry.name) for entry in os.scandir(folder))
    return sorted(int(match.group(1)) for match in numbers if match)


def state_of(upload: DatasetUpload, artifacts: Path) -> UploadState:
    received = received_parts(upload, artifacts)
    return UploadState(
        upload,
        part_count(upload.size, upload.part_size),
        received,
        sum(part_length(upload, number) for number in received),
    )


def write_part(
    session: Session,
    upload: DatasetUpload,
    number: int,
    chunks: Iterable[bytes],
    *,
    artifacts: Path,
    expiry: timedelta,
) -> int:
    """Store part `number` from `chunks`, which must hold exactly its length; the upload's
    expiry moves on. The caller commits."""
    parts = part_count(upload.size, upload.part_size)
    if not 0 <= number < parts:
        raise InvalidRequest(f"the upload has parts 0..{parts - 1}, not {number}")
    if upload.completing:
        raise Conflict(f"upload {upload.id} is being completed; it takes no more parts")
    expected = part_length(upload, number)
    folder = folder_of(upload, artifacts)
    folder.mkdir(parents=True, exist_ok=True)
    handle, partial_name = tempfile.mkstemp(dir=folder, prefix=f".{number:05d}.")
    partial = Path(partial_name)
    written = 0
    try:
        with os.fdopen(handle, "wb") as out:
            for chunk in chunks:
                written += len(chunk)
                if written > expected:
                    break
                out.write(chunk)
        if written != expected:
            raise InvalidRequest(
                f"part {number} holds {expected} bytes (part_size {upload.part_size} of a file "
                f"of {upload.size}); this request sent {'more' if written > expected else written}"
            )
        partial.replace(folder / f"{number:05d}.part")
    finally:
        partial.unlink(missing_ok=True)
    touched = session.execute(
        update(DatasetUpload)
        .where(DatasetUpload.id == upload.id)
        .values(expires_at=utcnow() + expiry)
    )
    if touched.rowcount != 1:  # type: ignore[attr-defined]
        # Aborted or completed while the part came in: leave no part behind.
        shutil.rmtree(folder, ignore_errors=True)
        raise NotFound(f"upload {upload.id} was aborted or completed meanwhile")
    return written


def claim_for_completion(session: Session, upload: DatasetUpload, expiry: timedelta) -> None:
    """Mark the upload as completing (committed), once: a second completion is a Conflict.
    Its expiry moves on, so that no purge takes its parts while they are put together."""
    claimed = session.execute(
        update(DatasetUpload)
        .where(DatasetUpload.id == upload.id, DatasetUpload.completing.is_(False))
        .values(completing=True, expires_at=utcnow() + expiry)
    )
    if claimed.rowcount != 1:  # type: ignore[attr-defined]
        session.rollback()
        raise Conflict(f"upload {upload.id} is already being completed")
    session.commit()


def assemble(upload: DatasetUpload, artifacts: Path, target: Path) -> str:
    """Append the parts in order to `target`, each deleted once copied (the disk holds the
    file about once); their SHA-256 (hex)."""
    digest = hashlib.sha256()
    folder = folder_of(upload, artifacts)
    with target.open("wb") as out:
        for number in range(part_count(upload.size, upload.part_size)):
            path = folder / f"{number:05d}.part"
            with path.open("rb") as part:
                while chunk := part.read(CHUNK):
                    digest.update(chunk)
                    out.write(chunk)
            path.unlink()
    return digest.hexdigest()


def missing_parts(upload: DatasetUpload, artifacts: Path) -> list[int]:
    have = set(received_parts(upload, artifacts))
    return [n for n in range(part_count(upload.size, upload.part_size)) if n not in have]


def delete_upload_row(session: Session, upload_id: str) -> None:
    """The upload's row, deleted (the caller commits); its folder stays."""
    session.execute(delete(DatasetUpload).where(DatasetUpload.id == upload_id))


def drop_upload(session: Session, upload: DatasetUpload, artifacts: Path) -> None:
    """Delete the upload's row (the caller commits) and its parts."""
    folder = folder_of(upload, artifacts)
    delete_upload_row(session, upload.id)
    shutil.rmtree(folder, ignore_errors=True)


def purge_expired(session: Session, artifacts: Path, now: datetime | None = None) -> int:
    """Delete every expired upload's row and parts (committed); how many there were."""
    expired = list(
        session.scalars(
            select(DatasetUpload).where(DatasetUpload.expires_at <= (now or utcnow())).limit(100)
        )
    )
    for upload in expired:
        drop_upload(session, upload, artifacts)
    if expired:
        session.commit()
    return len(expired)
