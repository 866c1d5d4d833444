"""Uploaded datasets: checking a file, storing it for its owner, resolving a job's reference.

Each user's uploads live in `<artifacts>/datasets/<user id>/`, the folder the `dataset` data
source reads, so a worker on any machine sharing the artifact directory finds them: `<name>.npz`,
`<name>.csv` (numbers only), `<name>.txt` (UTF-8 text, for the `text` source), or the folder
`<name>/` of npy shards a table with text columns or a Parquet file becomes
(scheduler/store/tables.py). A name is unique per owner; uploading it again is a conflict, so a
queued job never trains on other data than it was checked against. Every upload is taken in
(checked, unpacked or converted, inventoried) in a process of its own, never in the API's
(scheduler/store/intake.py); the record holds the inventory that checking a job reads.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import tempfile
from pathlib import Path
from typing import Any, BinaryIO, Literal

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from contract.rundir import dataset_dir
from dsl.data_config import DATASET_NAME_PATTERN
from scheduler.store.artifacts import confine
from scheduler.store.errors import Conflict, InvalidRequest, TooLarge, UnsupportedKind
from scheduler.store.intake import IntakeBounds, take_in
from scheduler.store.models import DatasetRecord, User

Kind = Literal["npz", "csv", "shards"]
KINDS: tuple[Kind, ...] = ("npz", "csv", "shards")
# A .tar of shards is stored unpacked, as the folder `<name>/` that `source: shards` reads.
SUFFIXES: dict[str, Kind] = {".npz": "npz", ".csv": "csv", ".tar": "shards"}
# What a chunked upload may be, by the file name's extension; `text` is stored as .txt.
UPLOAD_KINDS = {
    ".npz": "npz",
    ".csv": "csv",
    ".parquet": "parquet",
    ".txt": "text",
    ".tar": "shards",
}
CHUNK = 1 << 20


def kind_of(filename: str) -> Kind:
    suffix = Path(filename).suffix.lower()
    if suffix not in SUFFIXES:
        raise UnsupportedKind(
            f"'{filename}' is not .npz, .csv or .tar; datasets are numpy .npz archives, "
            "numeric .csv tables or a .tar of shards"
        )
    return SUFFIXES[suffix]


def upload_kind_of(filename: str) -> str:
    suffix = Path(filename).suffix.lower()
    if suffix not in UPLOAD_KINDS:
        raise UnsupportedKind(
            f"'{filename}' is not a dataset file this service takes in parts: "
            f"{', '.join(UPLOAD_KINDS)} (UTF-8 text for the text source)"
        )
    return UPLOAD_KINDS[suffix]


def check_name(name: str) -> None:
    if not re.fullmatch(DATASET_NAME_PATTERN, name):
        raise InvalidRequest(
            f"dataset name '{name}' is not allowed: use 1-100 letters, digits, '_', '.', '-', "
            "starting with a letter or digit"
        )


def save_dataset(
    session: Session,
    owner: User,
    *,
    name: str,
    filename: str,
    content: BinaryIO,
    artifacts: Path,
    max_bytes: int,
    bounds: IntakeBounds,
) -> DatasetRecord:
    """Store an upload sent in one request: written to a temporary file of its own, taken in
    (checked and inventoried in the intake's process), recorded, renamed into place. The
    record claims the name (a unique index) before the file takes the final path, so of two
    uploads of one name at once the second is a Conflict and never replaces the first's file.
    The caller commits."""
    check_name(name)
    kind = kind_of(filename)
    if get_dataset(session, owner.id, name) is not None:
        raise Conflict(_taken(name))
    folder = dataset_dir(artifacts, owner.id)
    folder.mkdir(parents=True, exist_ok=True)
    handle, partial_name = tempfile.mkstemp(dir=folder, prefix=f".{name}.", suffix=".partial")
    partial = Path(partial_name)
    size = 0
    try:
        with os.fdopen(handle, "wb") as out:
            while chunk := content.read(CHUNK):
                size += len(chunk)
                if size > max_bytes:
                    raise TooLarge(f"the dataset is larger than the limit of {max_bytes} bytes")
                out.write(chunk)
        if size == 0:
            raise InvalidRequest("the uploaded file is empty")
        return _store(
            session, owner, name, kind, partial,
            folder=folder, filename=filename, bounds=bounds, convert=False, size=size,
        )  # fmt: skip
    finally:
        partial.unlink(missing_ok=True)


def store_upload(
    session: Session,
    owner: User,
    *,
    name: str,
    kind: str,
    assembled: Path,
    artifacts: Path,
    filename: str,
    label_column: str | None,
    bounds: IntakeBounds,
) -> DatasetRecord:
    """Store an assembled upload as the dataset `name`, taken in (scheduler/store/intake.py):
    an .npz or a numeric .csv as it is, text once it reads as UTF-8, a .csv with text columns
    or a Parquet table converted to a shard folder. The record is flushed (the caller
    commits); what was stored is removed where anything raises."""
    check_name(name)
    if get_dataset(session, owner.id, name) is not None:
        raise Conflict(_taken(name))
    folder = dataset_dir(artifacts, owner.id)
    folder.mkdir(parents=True, exist_ok=True)
    return _store(
        session, owner, name, kind, assembled,
        folder=folder, filename=filename, bounds=bounds, label_column=label_column,
    )  # fmt: skip


def _store(
    session: Session,
    owner: User,
    name: str,
    kind: str,
    source: Path,
    *,
    folder: Path,
    filename: str,
    bounds: IntakeBounds,
    label_column: str | None = None,
    convert: bool = True,
    size: int | None = None,
) -> DatasetRecord:
    """Take `source` in beside its final place in `folder` (its owner's), record it with its
    inventory and rename it into place; what was staged is removed where anything raises."""
    staged = folder / f".{name}.{secrets.token_hex(6)}.partial"
    try:
        intake = take_in(
            kind, source, staged,
            filename=filename, bounds=bounds, label_column=label_column, convert=convert,
        )  # fmt: skip
        suffix = _SUFFIX.get(intake.kind)
        final = folder / (f"{name}.{suffix}" if suffix else name)
        record = DatasetRecord(
            owner_id=owner.id,
            name=name,
            kind=intake.kind,
            path=str(final),
            size=_size(staged) if size is None else size,
            inventory=intake.inventory,
        )
        session.add(record)
        try:
            session.flush()
        except IntegrityError:  # the caller's session is spent: it rolls back, not us
            raise Conflict(_taken(name)) from None
        staged.replace(final)
    finally:
        remove_stored(staged)
    return record


_SUFFIX = {"npz": "npz", "csv": "csv", "text": "txt"}


def _size(path: Path) -> int:
    if path.is_dir():
        return sum(entry.stat().st_size for entry in path.iterdir() if entry.is_file())
    return path.stat().st_size


def remove_stored(path: Path) -> None:
    """A dataset's file or shard folder, gone."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def _taken(name: str) -> str:
    return f"you already have a dataset named '{name}'; upload under another name"


def get_dataset(session: Session, owner_id: int, name: str) -> DatasetRecord | None:
    return session.scalar(
        select(DatasetRecord).where(DatasetRecord.owner_id == owner_id, DatasetRecord.name == name)
    )


def dataset_file(record: DatasetRecord, artifacts: Path) -> Path:
    """The dataset's file, resolved inside its owner's folder (UnsafePath if not)."""
    return confine(
        record.path,
        dataset_dir(artifacts, record.owner_id),
        what=f"dataset '{record.name}'",
        within=f"the folder of user {record.owner_id}'s datasets",
    )


def inventory_of_file(session: Session, path: str) -> dict[str, Any] | None:
    """The stored inventory of the dataset whose file is `path` (what a job's execution spec
    names), if it is one that has one."""
    return session.scalar(select(DatasetRecord.inventory).where(DatasetRecord.path == path))


def dataset_names(session: Session, owner_id: int) -> list[str]:
    return list(
        session.scalars(
            select(DatasetRecord.name)
            .where(DatasetRecord.owner_id == owner_id)
            .order_by(DatasetRecord.name)
        )
    )


def list_datasets(session: Session, user: User) -> list[tuple[DatasetRecord, str]]:
    """Visible datasets with their owners' names: a user's own, or every one for an admin."""
    query = select(DatasetRecord, User.name).join(User, User.id == DatasetRecord.owner_id)
    if not user.is_admin:
        query = query.where(DatasetRecord.owner_id == user.id)
    rows = session.execute(query.order_by(DatasetRecord.name, DatasetRecord.id))
    return [(record, owner) for record, owner in rows]
