"""A job's records as files to download: its metrics as CSV, its log as text, its TensorBoard
event files as a tar. Each is produced piece by piece as the answer is sent, and bounded.

The CSV and the log are read from SQL a page at a time, each page in a session of its own, so
that a slow reader holds no connection between pages. The tar is written as it is read: only
the file's sizes are known first, which is what the bound checks.
"""

from __future__ import annotations

import csv
import io
import tarfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import Select, func, select
from sqlalchemy.orm import Session

from contract.rundir import TENSORBOARD, WORKERS, job_run_dir
from scheduler.store.errors import TooLarge
from scheduler.store.models import LogLine, Metric

PAGE = 5000  # rows read from SQL per session
METRICS_COLUMNS = ("step", "time", "name", "group", "rank", "value")
CHUNK = 64 * 1024


@dataclass(frozen=True)
class Download:
    """An answer to send: its chunks (produced as they are read) and how big it is known to
    be before it is sent (rows for the CSV and the log, bytes for the tar)."""

    chunks: Iterator[bytes]
    size: int


def metrics_csv(
    sessions: Callable[[], Session], session: Session, job_id: int, *, max_rows: int
) -> Download:
    """Every metric point of the job, oldest first: `step,time,name,group,rank,value` (time in
    unix seconds as the worker took it). TooLarge past `max_rows` points."""
    count = _count(session, select(func.count()).where(Metric.job_id == job_id), max_rows, "points")

    def rows(after: int) -> list[tuple[int, tuple[object, ...]]]:
        with sessions() as page:
            found = page.execute(
                select(
                    Metric.id,
                    Metric.step,
                    Metric.at,
                    Metric.name,
                    Metric.group,
                    Metric.rank,
                    Metric.value,
                )
                .where(Metric.job_id == job_id, Metric.id > after)
                .order_by(Metric.id)
                .limit(PAGE)
            )
            return [(row[0], tuple(row[1:])) for row in found]

    def chunks() -> Iterator[bytes]:
        yield (",".join(METRICS_COLUMNS) + "\r\n").encode()
        yield from _pages(rows, max_rows, _csv_lines)

    return Download(chunks(), count)


def logs_text(
    sessions: Callable[[], Session], session: Session, job_id: int, *, max_rows: int
) -> Download:
    """Every log line of the job, oldest first, as `trainyard logs` prints them; a line of a
    worker other than the first is prefixed `[group/rank] `. TooLarge past `max_rows` lines."""
    count = _count(session, select(func.count()).where(LogLine.job_id == job_id), max_rows, "lines")

    def rows(after: int) -> list[tuple[int, tuple[object, ...]]]:
        with sessions() as page:
            found = page.execute(
                select(LogLine.id, LogLine.group, LogLine.rank, LogLine.line)
                .where(LogLine.job_id == job_id, LogLine.id > after)
                .order_by(LogLine.id)
                .limit(PAGE)
            )
            return [(row[0], tuple(row[1:])) for row in found]

    def text(page: list[tuple[object, ...]]) -> bytes:
        return "".join(
            (f"[{group}/{rank}] " if (group, rank) != (0, 0) else "") + f"{line}\n"
            for group, rank, line in page
        ).encode()

    return Download(_pages(rows, max_rows, text), count)


def _count(session: Session, query: Select[int], bound: int, what: str) -> int:
    count = int(session.scalar(query) or 0)
    if count > bound:
        raise TooLarge(
            f"the job has {count} {what}, more than the {bound} one download may hold "
            "(TRAINYARD_MAX_DOWNLOAD_ROWS); page through the JSON API instead"
        )
    return count


def _pages(
    rows: Callable[[int], list[tuple[int, tuple[object, ...]]]],
    bound: int,
    render: Callable[[list[tuple[object, ...]]], bytes],
) -> Iterator[bytes]:
    """Pages of rows after the last id sent, rendered, until none is left or `bound` rows
    went out (rows that arrive while the answer is sent come along, up to the bound)."""
    after, sent = 0, 0
    while sent < bound:
        page = rows(after)[: bound - sent]
        if not page:
            return
        after, sent = page[-1][0], sent + len(page)
        yield render([values for _, values in page])


def _csv_lines(page: list[tuple[object, ...]]) -> bytes:
    out = io.StringIO()
    csv.writer(out).writerows(page)
    return out.getvalue().encode()


def tensorboard_files(artifacts: Path, job_id: int) -> list[tuple[str, Path]]:
    """(name in the tar, path) of every event file of the job: the first worker's under
    `tensorboard/`, another worker's under `workers/g<G>r<R>/` (TensorBoard shows each
    folder as a run)."""
    run_dir = job_run_dir(artifacts, job_id)
    folders = [run_dir / TENSORBOARD]
    workers = run_dir / WORKERS
    if workers.is_dir():
        folders += sorted(path / TENSORBOARD for path in workers.iterdir() if path.is_dir())
    found = []
    for folder in folders:
        if not folder.is_dir():
            continue
        for path in sorted(folder.iterdir()):
            if path.is_file() and not path.is_symlink():
                found.append((path.relative_to(run_dir).as_posix(), path))
    return found


def tensorboard_tar(artifacts: Path, job_id: int, *, max_bytes: int) -> Download:
    """The job's event files as an uncompressed tar, under `job-<id>/`. TooLarge past
    `max_bytes` of files; a job with none yet (it has not started) gets an empty tar. Files
    still being written go in at the size they had when the answer began."""
    files = [
        (name, path, path.stat().st_size) for name, path in tensorboard_files(artifacts, job_id)
    ]
    total = sum(size for _, _, size in files)
    if total > max_bytes:
        raise TooLarge(
            f"the job's TensorBoard files hold {total} bytes, more than the {max_bytes} one "
            "download may (TRAINYARD_MAX_TENSORBOARD_BYTES)"
        )
    return Download(_tar_chunks(job_id, files), total)


class _Spool(io.RawIOBase):
    """Where tarfile writes: the bytes wait here until the generator hands them on."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []

    def writable(self) -> bool:
        return True

    def write(self, data: bytes) -> int:  # type: ignore[override]
        self.parts.append(bytes(data))
        return len(data)

    def take(self) -> bytes:
        out, self.parts = b"".join(self.parts), []
        return out


def _tar_chunks(job_id: int, files: list[tuple[str, Path, int]]) -> Iterator[bytes]:
    spool = _Spool()
    with tarfile.open(fileobj=spool, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        for name, path, size in files:
            info = tarfile.TarInfo(f"job-{job_id}/{name}")
            info.size, info.mtime, info.mode = size, int(path.stat().st_mtime), 0o644
            with path.open("rb") as handle:
                tar.addfile(info, _Exactly(handle, size))
            yield spool.take()
    yield spool.take()


class _Exactly(io.RawIOBase):
    """The first `size` bytes of a file that may grow while it is read."""

    def __init__(self, handle: io.BufferedReader, size: int) -> None:
        self.handle, self.left = handle, size

    def readable(self) -> bool:
        return True

    def read(self, n: int | None = -1) -> bytes:
        n = self.left if n is None or n < 0 else min(n, self.left)
        data = self.handle.read(n)
        self.left -= len(data)
        return data
