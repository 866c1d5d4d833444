"""A dataset's intake: an uploaded file checked, unpacked or converted, and inventoried, in a
process of its own bounded in memory, CPU time and output.

Whatever a user uploads is unpacked here and nowhere else: an .npz's arrays are read through
(their values summarised for the dataset's inventory, contract/inventory.py), a table with text
columns or a Parquet file is converted to npy shards (scheduler/store/tables.py), a .tar of
shards is unpacked. The API process that stores an upload calls `take_in`, which runs
`python -m scheduler.store.intake` and waits for its answer. That process limits itself before
it reads a byte of the file (RLIMIT_DATA: `memory_bytes` past its imports; RLIMIT_CPU;
RLIMIT_FSIZE), so that a file built to inflate or to take long costs a bounded process and a
refusal, never the API's memory.

What a dataset may take unpacked (`Bound`: what its owner's quota dataset_bytes leaves, else
the server's max_dataset_unpacked_bytes) is held to before anything is unpacked wherever the
file declares it (an .npz's zip directory and .npy headers, a .tar's headers, a table's rows
and columns counted by a first pass), and again while shards are written. A refusal names the
file, the member and the bytes declared against the bytes allowed; nothing of it is kept.
"""

from __future__ import annotations

import codecs
import csv
import errno
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from dataclasses import asdict, dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np
import pyarrow as pa

from contract.inventory import csv_inventory, npz_inventory
from contract.shards import MAX_SHARDS, ShardError, ShardFormat, describe_shards
from scheduler.store.errors import InvalidRequest, TooLarge, UnpacksTooLarge, UnsupportedKind
from scheduler.store.tables import (
    csv_batches,
    csv_header,
    csv_schema,
    parquet_batches,
    parquet_file,
    survey_table,
    write_shards,
)

CHUNK = 1 << 20
CSV_SNIFF_ROWS = 1000
MAX_TAR_MEMBERS = 2 * MAX_SHARDS + 2
# The intake's answer: the kind stored and the inventory, which is stored with the dataset.
MAX_ANSWER_BYTES = 8 * 2**20
MB = 2**20
# Its wall time: twice its CPU time and this (a loaded machine starts processes slowly).
WALL_SLACK_SECONDS = 30.0


@dataclass(frozen=True)
class Bound:
    """The most bytes a dataset may take unpacked, and what sets that, in words."""

    bytes: int
    reason: str  # "what your quota dataset_bytes leaves", "max_dataset_unpacked_bytes"
    quota: bool = False  # set by the owner's quota (a refusal is then one past the quota)

    @property
    def words(self) -> str:
        return f"the limit of {self.bytes} bytes ({self.reason})"


@dataclass(frozen=True)
class IntakeBounds:
    """What taking one upload in may cost: its bytes unpacked, the process's memory (past
    its imports) and CPU time (its wall time: twice that and WALL_SLACK_SECONDS)."""

    unpacked: Bound
    memory_bytes: int
    cpu_seconds: float


@dataclass(frozen=True)
class IntakeRequest:
    """What the intake's process is asked (its one argument, as JSON)."""

    kind: str  # the upload's kind: npz, csv, parquet, text, shards (a .tar)
    source: str  # the uploaded file
    staged: str  # where what is stored goes: the file moved there, or the shard folder made
    answer: str  # the file the answer is written to
    filename: str  # the file's name as uploaded, for messages
    label_column: str | None
    convert: bool  # a table with text columns becomes shards (chunked uploads)
    unpacked_bytes: int
    unpacked_reason: str
    memory_bytes: int
    cpu_seconds: float

    @property
    def bound(self) -> Bound:
        return Bound(self.unpacked_bytes, self.unpacked_reason)


@dataclass(frozen=True)
class Intake:
    """What the intake stored at `staged`: its kind, and the inventory of an .npz or .csv."""

    kind: str  # npz, csv, text or shards
    inventory: dict[str, Any] | None


# -- the API's side ------------------------------------------------------------------------------
def take_in(
    kind: str,
    source: Path,
    staged: Path,
    *,
    filename: str,
    bounds: IntakeBounds,
    label_column: str | None = None,
    convert: bool = True,
) -> Intake:
    """Check `source` (an upload of `kind`), store what is kept at `staged` and inventory it,
    in the intake's process; raises TooLarge, UnsupportedKind or InvalidRequest (the caller
    removes `staged` then)."""
    handle, answer_name = tempfile.mkstemp(dir=staged.parent, prefix=".", suffix=".intake")
    os.close(handle)
    answer = Path(answer_name)
    request = IntakeRequest(
        kind=kind,
        source=str(source),
        staged=str(staged),
        answer=str(answer),
        filename=filename,
        label_column=label_column,
        convert=convert,
        unpacked_bytes=bounds.unpacked.bytes,
        unpacked_reason=bounds.unpacked.reason,
        memory_bytes=bounds.memory_bytes,
        cpu_seconds=bounds.cpu_seconds,
    )
    command = [sys.executable, "-m", "scheduler.store.intake", json.dumps(asdict(request))]
    # Arrow's own allocator reserves gigabytes of address space that RLIMIT_DATA counts;
    # malloc's takes what it uses.
    env = {**os.environ, "OMP_NUM_THREADS": "1", "ARROW_DEFAULT_MEMORY_POOL": "system"}
    wall = 2 * bounds.cpu_seconds + WALL_SLACK_SECONDS
    try:
        try:
            done = subprocess.run(
                command,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                env=env,
                timeout=wall,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise TooLarge(
                f"checking {filename} took more than {wall:g} s (twice dataset_intake_seconds, "
                f"and {WALL_SLACK_SECONDS:g} s) and was stopped; nothing was stored"
            ) from None
        return _answer(done, answer, request)
    finally:
        answer.unlink(missing_ok=True)


def _answer(
    done: subprocess.CompletedProcess[bytes], answer: Path, request: IntakeRequest
) -> Intake:
    if done.returncode == -signal.SIGXCPU:
        raise TooLarge(
            f"checking {request.filename} took more than {request.cpu_seconds:g} s of CPU "
            "time (dataset_intake_seconds) and was stopped; nothing was stored"
        )
    if done.returncode == -signal.SIGKILL:
        raise TooLarge(
            f"checking {request.filename} was stopped: past its {request.cpu_seconds:g} s "
            "of CPU time (dataset_intake_seconds), or out of memory; nothing was stored"
        )
    size = answer.stat().st_size if answer.exists() else 0
    if done.returncode != 0 or not 0 < size <= MAX_ANSWER_BYTES:
        last = (done.stderr.decode(errors="replace").strip().splitlines() or ["no output"])[-1]
        raise InvalidRequest(
            f"{request.filename} could not be checked: the checking process ended with code "
            f"{done.returncode} ({last[:300]}); nothing was stored"
        )
    body = json.loads(answer.read_text(encoding="utf-8"))
    refused = body.get("refused")
    if refused is not None:
        error = {
            "unpacks_too_large": UnpacksTooLarge,
            "too_large": TooLarge,
            "unsupported": UnsupportedKind,
        }.get(refused, InvalidRequest)
        raise error(body["message"])
    return Intake(kind=body["kind"], inventory=body["inventory"])


# -- the intake's process ------------------------------------------------------------------------
def main(argv: list[str]) -> int:
    """`python -m scheduler.store.intake REQUEST`: limit this process, take the file in, write
    the answer (what was stored, or why nothing was) and exit 0."""
    request = IntakeRequest(**json.loads(argv[1]))
    confine(request)
    try:
        kind, inventory = stage(request)
        body: dict[str, Any] = {"kind": kind, "inventory": inventory}
    except (MemoryError, pa.ArrowMemoryError):
        body = _refusal(
            "too_large",
            f"checking {request.filename} needed more than {request.memory_bytes // MB} MB of "
            "memory (dataset_intake_memory_mb); nothing was stored",
        )
    except UnpacksTooLarge as error:
        body = _refusal("unpacks_too_large", str(error))
    except TooLarge as error:
        body = _refusal("too_large", str(error))
    except UnsupportedKind as error:
        body = _refusal("unsupported", str(error))
    except InvalidRequest as error:
        body = _refusal("invalid", str(error))
    text = json.dumps(body)
    if len(text) > MAX_ANSWER_BYTES:
        text = json.dumps(
            _refusal(
                "too_large",
                f"the inventory of {request.filename} (what a job's check reads of it) takes "
                f"{len(text)} bytes, more than the {MAX_ANSWER_BYTES} a dataset's may take; "
                "nothing was stored",
            )
        )
    Path(request.answer).write_text(text, encoding="utf-8")
    return 0


def _refusal(reason: str, message: str) -> dict[str, str]:
    return {"refused": reason, "message": message}


def confine(request: IntakeRequest) -> None:
    """Limit this process: its data segment to what its imports took plus `memory_bytes`
    (an allocation past it fails here, as MemoryError), its CPU time (past it, SIGXCPU ends
    it), and each file it writes to the unpacked bound (past it, writing fails: Python
    ignores SIGXFSZ)."""
    limit = _data_segment() + request.memory_bytes
    resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))
    seconds = max(1, int(request.cpu_seconds))
    resource.setrlimit(resource.RLIMIT_CPU, (seconds, seconds + 5))
    file_bytes = max(request.unpacked_bytes, MAX_ANSWER_BYTES) + MB
    resource.setrlimit(resource.RLIMIT_FSIZE, (file_bytes, file_bytes))
    pa.set_cpu_count(1)
    pa.set_io_thread_count(1)


def _data_segment() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmData:"):
            return int(line.split()[1]) * 1024
    return 0


def stage(request: IntakeRequest) -> tuple[str, dict[str, Any] | None]:
    """Check the file and put what is stored at `staged`; the kind stored and the inventory
    of an .npz or .csv."""
    source, staged, bound = Path(request.source), Path(request.staged), request.bound
    what = request.filename
    try:
        if request.kind == "parquet":
            file = parquet_file(source)
            survey = survey_table(
                parquet_batches(source), file.schema_arrow, label_column=request.label_column
            )
            write_shards(
                survey, parquet_batches(source), staged, max_bytes=bound.bytes, limit=bound.words,
                what=what,
            )  # fmt: skip
            return "shards", None
        if request.kind == "csv" and request.convert:
            header = csv_header(source)
            survey = survey_table(
                csv_batches(source, header), csv_schema(header), label_column=request.label_column
            )
            # Numbers only and no label chosen: kept as it is, for the csv source's options.
            if survey.categorical or request.label_column is not None:
                write_shards(
                    survey, csv_batches(source, header), staged, max_bytes=bound.bytes,
                    limit=bound.words, what=what,
                )  # fmt: skip
                return "shards", None
        if request.kind == "csv":
            check_csv(source)
            inventory = csv_inventory(source).model_dump(mode="json")
        elif request.kind == "npz":
            check_npz_pairs(check_npz_sizes(source, bound, what))
            inventory = npz_inventory(source).model_dump(mode="json")
        elif request.kind == "text":
            check_text(source)
            inventory = None
        elif request.kind == "shards":
            unpack_shards(source, staged, bound, what)
            return "shards", None
        else:
            raise UnsupportedKind(f"uploads of kind {request.kind} are not taken")
    except OSError as error:
        if error.errno == errno.EFBIG:  # a file past RLIMIT_FSIZE
            message = f"{what} unpacks past {bound.words}; nothing was stored"
            raise UnpacksTooLarge(message) from None
        raise
    source.replace(staged)
    return request.kind, inventory


# -- the checks of each kind ---------------------------------------------------------------------
def check_npz_sizes(
    path: Path, bound: Bound, what: str = "the archive"
) -> dict[str, tuple[int, ...]]:
    """Refuse an archive whose arrays would unpack past `bound`, before unpacking any; the
    shape of each array.

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
                if total > bound.bytes:
                    raise UnpacksTooLarge(
                        f"{what}: the arrays of the .npz archive would unpack to {total} bytes or "
                        f"more, more than {bound.words} (member '{member.filename}' alone "
                        f"declares {member.file_size} bytes); nothing was unpacked"
                    )
            arrays = [member for member in members if member.filename.endswith(".npy")]
            if not arrays:
                raise InvalidRequest("the .npz archive holds no arrays")
            shapes = {
                member.filename.removesuffix(".npy"): _check_npy_header(
                    archive, member, bound, what
                )
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
    archive: zipfile.ZipFile, member: zipfile.ZipInfo, bound: Bound, what: str
) -> tuple[int, ...]:
    with archive.open(member) as stream:
        version = np.lib.format.read_magic(stream)
        if version == (1, 0):
            shape, _, dtype = np.lib.format.read_array_header_1_0(stream)
        else:
            shape, _, dtype = np.lib.format.read_array_header_2_0(stream)
    name = member.filename.removesuffix(".npy")
    if dtype.hasobject:
        raise InvalidRequest(
            f"array '{name}' of the .npz archive is of Python objects, which only pickle "
            "reads; object arrays are not accepted: store plain numeric arrays"
        )
    nbytes = int(np.prod(shape, dtype=object)) * dtype.itemsize
    if nbytes > bound.bytes:
        raise UnpacksTooLarge(
            f"{what}: array '{name}' (member '{member.filename}') of the .npz archive has shape "
            f"{tuple(shape)} of {dtype} ({nbytes} bytes), more than {bound.words}; nothing "
            "was unpacked"
        )
    return tuple(shape)


def check_csv(path: Path) -> None:
    """A look at a table's first rows: UTF-8 CSV, rows of one width, at least 2 columns and
    2 rows. Which columns a job uses is checked when a job names the dataset."""
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


def unpack_shards(tar: Path, into: Path, bound: Bound, what: str = "the .tar") -> Path:
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
            if total > bound.bytes:
                largest = max(files, key=lambda member: member.size)
                raise UnpacksTooLarge(
                    f"{what}: the shards would unpack to {total} bytes, more than "
                    f"{bound.words} (member '{largest.name}' declares {largest.size} bytes); "
                    "nothing was unpacked"
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
        if isinstance(error, OSError) and error.errno == errno.EFBIG:  # past RLIMIT_FSIZE
            raise
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


if __name__ == "__main__":
    sys.exit(main(sys.argv))
