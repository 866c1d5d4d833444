"""Uploaded datasets: checking a file, storing it for its owner, resolving a job's reference.

Each user's uploads live in `<artifacts>/datasets/<user id>/`, the folder the `dataset` data
source reads, so a worker on any machine sharing the artifact directory finds them: `<name>.npz`,
`<name>.csv` (numbers only), `<name>.txt` (UTF-8 text, for the `text` source), or the folder
`<name>/` of npy shards a table with text columns or a Parquet file becomes
(scheduler/store/tables.py). A name is unique per owner; uploading it again is a conflict, so a
queued job never trains on other data than it was checked against.
"""

from __future__ import annotations

import codecs
import csv
import os
import re
import secrets
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
from scheduler.store.tables import (
    csv_batches,
    csv_header,
    csv_schema,
    parquet_batches,
    parquet_file,
    survey_table,
    write_shards,
)

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


def check_npz_sizes(path: Path, max_bytes: int) -> dict[str, tuple[int, ...]]:
    """Refuse an archive whose arrays would unpack past `max_bytes`, before unpacking any;
    the shape of each array.

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
            arrays = [member for member in members if member.filename.endswith(".npy")]
            if not arrays:
                raise InvalidRequest("the .npz archive holds no arrays")
            shapes = {
                member.filename.removesuffix(".npy"): _check_npy_header(archive, member, max_bytes)
                for member in arrays
            }
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as error:
        raise InvalidRequest(
            f"the file is not a readable numpy .npz archive ({error}); write it with "
            "numpy.savez(path, x=..., y=...) and no object arrays"
        ) from None
    return shapes


def check_npz_pairs(shapes: dict[str, tuple[int, ...]]) -> None:
    """The usual pairs of arrays (x and y, x_test and y_test, x_val and y_val) hold as many
    samples as labels."""
    for x, y in (("x", "y"), ("x_test", "y_test"), ("x_val", "y_val")):
        if x in shapes and y in shapes and shapes[x][:1] != shapes[y][:1]:
            raise InvalidRequest(
                f"the .npz archive's '{x}' holds {shapes[x][:1] or 'no'} samples but '{y}' "
                f"{shapes[y][:1] or 'no'} labels: one label per sample"
            )


def _check_npy_header(
    archive: zipfile.ZipFile, member: zipfile.ZipInfo, max_bytes: int
) -> tuple[int, ...]:
    with archive.open(member) as stream:
        version = np.lib.format.read_magic(stream)
        if version == (1, 0):
            shape, _, dtype = np.lib.format.read_array_header_1_0(stream)
        else:
            shape, _, dtype = np.lib.format.read_array_header_2_0(stream)
    if dtype.hasobject:
        raise InvalidRequest(
            f"array '{member.filename.removesuffix('.npy')}' of the .npz archive is of Python "
            "objects, which only pickle reads; object arrays are not accepted: store plain "
            "numeric arrays"
        )
    nbytes = int(np.prod(shape, dtype=object)) * dtype.itemsize
    if nbytes > max_bytes:
        raise TooLarge(
            f"array '{member.filename.removesuffix('.npy')}' of the .npz archive has shape "
            f"{tuple(shape)} of {dtype} ({nbytes} bytes), more than the limit of {max_bytes} "
            "bytes; nothing was unpacked"
        )
    return tuple(shape)


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


def store_upload(
    session: Session,
    owner: User,
    *,
    name: str,
    kind: str,
    assembled: Path,
    artifacts: Path,
    label_column: str | None,
    max_bytes: int,
) -> DatasetRecord:
    """Check and store an assembled upload as the dataset `name`: an .npz or a numeric .csv as
    it is, text once it reads as UTF-8, a .csv with text columns or a Parquet table converted
    to a shard folder. The record is flushed (the caller commits); what was stored is removed
    where anything raises."""
    check_name(name)
    if get_dataset(session, owner.id, name) is not None:
        raise Conflict(_taken(name))
    folder = dataset_dir(artifacts, owner.id)
    folder.mkdir(parents=True, exist_ok=True)
    staged = folder / f".{name}.{secrets.token_hex(6)}.partial"
    try:
        stored_kind = _stage(kind, assembled, staged, label_column, max_bytes)
        final = folder / (name if stored_kind == "shards" else f"{name}.{_SUFFIX[stored_kind]}")
        record = DatasetRecord(
            owner_id=owner.id, name=name, kind=stored_kind, path=str(final), size=_size(staged)
        )
        session.add(record)
        try:
            session.flush()
        except IntegrityError:
            raise Conflict(_taken(name)) from None
        staged.replace(final)
    finally:
        remove_stored(staged)
    return record


_SUFFIX = {"npz": "npz", "csv": "csv", "text": "txt"}


def _stage(
    kind: str, assembled: Path, staged: Path, label_column: str | None, max_bytes: int
) -> str:
    """Check `assembled` and put what is stored at `staged`; the kind stored."""
    if kind == "parquet":
        file = parquet_file(assembled)
        survey = survey_table(
            parquet_batches(assembled), file.schema_arrow, label_column=label_column
        )
        write_shards(survey, parquet_batches(assembled), staged)
        return "shards"
    if kind == "csv":
        header = csv_header(assembled)
        survey = survey_table(
            csv_batches(assembled, header), csv_schema(header), label_column=label_column
        )
        # Numbers only and no label chosen: kept as it is, for the csv source's options.
        if survey.categorical or label_column is not None:
            write_shards(survey, csv_batches(assembled, header), staged)
            return "shards"
        check_content(assembled, "csv", max_bytes)
    elif kind == "npz":
        # The archive's directory and each array's header, nothing inflated: a chunked upload
        # may be gigabytes (a job's check reads the arrays).
        check_npz_pairs(check_npz_sizes(assembled, max_bytes))
    elif kind == "text":
        check_text(assembled)
    elif kind == "shards":
        unpack_shards(assembled, staged, max_bytes)
        assembled.unlink()
        return "shards"
    else:
        raise UnsupportedKind(f"uploads of kind {kind} are not taken")
    assembled.replace(staged)
    return kind


def check_text(path: Path) -> None:
    """UTF-8 all through (read a megabyte at a time), and at least 2 characters."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    characters = 0
    offset = 0
    with path.open("rb") as handle:
        while chunk := handle.read(CHUNK):
            try:
                characters += len(decoder.decode(chunk))
            except UnicodeDecodeError as error:
                raise InvalidRequest(
                    f"the file is not UTF-8 text: byte {offset + error.start} cannot be decoded"
                ) from None
            offset += len(chunk)
    try:
        characters += len(decoder.decode(b"", final=True))
    except UnicodeDecodeError:
        raise InvalidRequest("the file is not UTF-8 text: it ends inside a character") from None
    if characters < 2:
        raise InvalidRequest("the text has fewer than 2 characters")


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
