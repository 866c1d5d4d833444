"""Uploaded datasets: checking a file, storing it for its owner, resolving a job's reference.

Each user's uploads live in `<artifacts>/datasets/<user id>/<name>.<kind>`, the folder the
`dataset` data source reads, so a worker on any machine sharing the artifact directory finds
them. A name is unique per owner; uploading it again is a conflict, so a queued job never
trains on other data than it was checked against.
"""

from __future__ import annotations

import csv
import os
import re
import shutil
import tarfile
import tempfile
import zipfile
from pathlib import Path, PurePosixPath
from typing import BinaryIO, Literal

import numpy as np
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from contract.rundir import dataset_dir
from contract.shards import MAX_SHARDS, ShardError, ShardFormat, describe_shards
from dsl.data_config import DATASET_NAME_PATTERN
from scheduler.store.artifacts import confine
from scheduler.store.errors import Conflict, InvalidRequest
from scheduler.store.models import DatasetRecord, User

Kind = Literal["npz", "csv", "shards"]
KINDS: tuple[Kind, ...] = ("npz", "csv", "shards")
# A .tar of shards is stored unpacked, as the folder `<name>/` that `source: shards` reads.
SUFFIXES: dict[str, Kind] = {".npz": "npz", ".csv": "csv", ".tar": "shards"}
CHUNK = 1 << 20
CSV_SNIFF_ROWS = 1000
MAX_TAR_MEMBERS = 2 * MAX_SHARDS + 2


class TooLarge(InvalidRequest):
    """The upload passed the size limit."""


class UnsupportedKind(InvalidRequest):
    """The file is neither .npz nor .csv."""


def kind_of(filename: str) -> Kind:
    suffix = Path(filename).suffix.lower()
    if suffix not in SUFFIXES:
        raise UnsupportedKind(
            f"'{filename}' is not .npz, .csv or .tar; datasets are numpy .npz archives, "
            "numeric .csv tables or a .tar of shards"
        )
    return SUFFIXES[suffix]


def check_name(name: str) -> None:
    if not re.fullmatch(DATASET_NAME_PATTERN, name):
        raise InvalidRequest(
            f"dataset name '{name}' is not allowed: use 1-100 letters, digits, '_', '.', '-', "
            "starting with a letter or digit"
        )


def check_npz_sizes(path: Path, max_bytes: int) -> None:
    """Refuse an archive whose arrays would unpack past `max_bytes`, before unpacking any.

    Reads only the zip's directory (each member's declared size, which the zip reader also
    holds it to) and each .npy header (a few hundred bytes at the head of a member): a small
    upload that inflates to gigabytes of zeros is caught without inflating it.
    """
    total = 0
    try:
        with zipfile.ZipFile(path) as archive:
            members = archive.infolist()
            for member in members:
                total += member.file_size
                if total > max_bytes:
                    raise TooLarge(
                        f"the arrays of the .npz archive would unpack to more than the limit of "
                        f"{max_bytes} bytes (member '{member.filename}' alone declares "
                        f"{member.file_size} bytes); nothing was unpacked"
                    )
            for member in members:
                if member.filename.endswith(".npy"):
                    _check_npy_header(archive, member, max_bytes)
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as error:
        raise InvalidRequest(
            f"the file is not a readable numpy .npz archive ({error}); write it with "
            "numpy.savez(path, x=..., y=...) and no object arrays"
        ) from None


def _check_npy_header(archive: zipfile.ZipFile, member: zipfile.ZipInfo, max_bytes: int) -> None:
    with archive.open(member) as stream:
        version = np.lib.format.read_magic(stream)
        if version == (1, 0):
            shape, _, dtype = np.lib.format.read_array_header_1_0(stream)
        else:
            shape, _, dtype = np.lib.format.read_array_header_2_0(stream)
    nbytes = int(np.prod(shape, dtype=object)) * dtype.itemsize
    if nbytes > max_bytes:
        raise TooLarge(
            f"array '{member.filename.removesuffix('.npy')}' of the .npz archive has shape "
            f"{tuple(shape)} of {dtype} ({nbytes} bytes), more than the limit of {max_bytes} "
            "bytes; nothing was unpacked"
        )


def check_content(path: Path, kind: Kind, max_bytes: int) -> None:
    """A cheap look at the file: the kind its name claims, readable without code execution,
    no larger unpacked than `max_bytes`. Which arrays or columns a job uses is checked when a
    job names the dataset."""
    if kind == "npz":
        check_npz_sizes(path, max_bytes)
        try:
            with np.load(path, allow_pickle=False) as archive:
                if not archive.files:
                    raise InvalidRequest("the .npz archive holds no arrays")
                for name in archive.files:
                    archive[name]  # object arrays need pickle and fail here
        except (OSError, ValueError, zipfile.BadZipFile, EOFError) as error:
            raise InvalidRequest(
                f"the file is not a readable numpy .npz archive ({error}); write it with "
                "numpy.savez(path, x=..., y=...) and no object arrays"
            ) from None
        return
    try:
        with path.open(newline="", encoding="utf-8") as handle:
            rows = [row for _, row in zip(range(CSV_SNIFF_ROWS), csv.reader(handle), strict=False)]
    except (UnicodeDecodeError, csv.Error) as error:
        raise InvalidRequest(f"the file is not UTF-8 CSV text ({error})") from None
    rows = [row for row in rows if row]
    if len(rows) < 2:
        raise InvalidRequest("the .csv file needs at least a header or first row and one more")
    widths = {len(row) for row in rows}
    if len(widths) > 1 or widths.pop() < 2:
        raise InvalidRequest(
            "the .csv rows must all have the same number of columns, at least 2 "
            "(features and a label)"
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
) -> DatasetRecord:
    """Store an upload: written to a temporary file of its own, checked, recorded, renamed
    into place. The record claims the name (a unique index) before the file takes the final
    path, so of two uploads of one name at once the second is a Conflict and never replaces
    the first's file. The caller commits."""
    check_name(name)
    kind = kind_of(filename)
    if get_dataset(session, owner.id, name) is not None:
        raise Conflict(_taken(name))
    folder = dataset_dir(artifacts, owner.id)
    folder.mkdir(parents=True, exist_ok=True)
    final = folder / f"{name}.{kind}"
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
        if kind == "shards":
            final = folder / name
            unpacked = unpack_shards(partial, folder / f".{name}.{partial.name}.d", max_bytes)
        else:
            check_content(partial, kind, max_bytes)
        record = DatasetRecord(owner_id=owner.id, name=name, kind=kind, path=str(final), size=size)
        session.add(record)
        try:
            session.flush()
        except IntegrityError:  # the caller's session is spent: it rolls back, not us
            raise Conflict(_taken(name)) from None
        (unpacked if kind == "shards" else partial).replace(final)
    finally:
        partial.unlink(missing_ok=True)
        if kind == "shards":
            shutil.rmtree(folder / f".{name}.{partial.name}.d", ignore_errors=True)
    return record


def unpack_shards(tar: Path, into: Path, max_bytes: int) -> Path:
    """Unpack a .tar of shards into the new folder `into` and check it with describe_shards.

    Only regular files are taken, each under its own base name (a leading folder is dropped):
    no links, devices or paths that climb out. The declared sizes and the member count are
    held to their limits before anything is written."""
    try:
        with tarfile.open(tar, mode="r:") as archive:
            members = archive.getmembers()
            if len(members) > MAX_TAR_MEMBERS:
                raise TooLarge(f"the .tar holds more than {MAX_TAR_MEMBERS} members")
            files = [member for member in members if not member.isdir()]
            total = sum(member.size for member in files)
            if total > max_bytes:
                raise TooLarge(
                    f"the shards would unpack to {total} bytes, more than the limit of "
                    f"{max_bytes}; nothing was unpacked"
                )
            names: set[str] = set()
            into.mkdir()
            for member in files:
                base = PurePosixPath(member.name).name
                if not member.isfile() or not base or base.startswith("."):
                    raise InvalidRequest(
                        f"the .tar member '{member.name}' is not a plain file; a .tar of "
                        "shards holds NNNNN.x.npy / NNNNN.y.npy or .parquet files (and "
                        "categories.json) only"
                    )
                if base in names:
                    raise InvalidRequest(f"the .tar holds '{base}' twice")
                names.add(base)
                source = archive.extractfile(member)
                assert source is not None  # a regular file
                with source, (into / base).open("xb") as out:
                    shutil.copyfileobj(source, out, CHUNK)
    except (OSError, tarfile.TarError) as error:
        raise InvalidRequest(f"the file is not a readable .tar archive ({error})") from None
    shard_format: ShardFormat = (
        "parquet" if any(name.endswith(".parquet") for name in names) else "npy"
    )
    try:
        describe_shards(into, shard_format)
    except ShardError as error:
        where = f"{error.shard}: " if error.shard else ""
        raise InvalidRequest(f"the .tar is not a valid set of shards: {where}{error}") from None
    return into


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
