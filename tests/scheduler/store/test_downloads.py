"""A job's records as files (scheduler/store/downloads.py) against real SQLite and PostgreSQL:
read a page at a time, every row once, and bounded."""

from __future__ import annotations

import csv
import io
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from contract.rundir import TENSORBOARD, WORKERS, job_run_dir
from scheduler.store import downloads
from scheduler.store.database import Database
from scheduler.store.errors import TooLarge
from scheduler.store.jobs import NewJob, create_job
from scheduler.store.models import LogLine, Metric
from scheduler.store.users import create_user


@pytest.fixture
def db(migrated_sql_url: str) -> Iterator[Database]:
    database = Database(migrated_sql_url)
    yield database
    database.dispose()


def a_job(db: Database, points: int, lines: int) -> int:
    """A job with `points` metric points (2 per step; worker 1/0 reports the last step too) and
    `lines` log lines."""
    with db.session() as session:
        owner = create_user(session, "alice")
        job = create_job(
            session,
            owner,
            NewJob(
                name="files",
                spec_yaml="name: files\n",
                overrides={},
                spec={"name": "files"},
                topology={"workers": 1},
                framework="local",
                train_steps=10,
            ),
        )
        for i in range(points):
            step, name = divmod(i, 2)
            session.add(
                Metric(
                    job_id=job.id, name=("loss", "acc")[name], step=step, value=i / 10, at=1e9 + i
                )
            )
        session.add(Metric(job_id=job.id, name="loss", step=0, value=9.0, at=2e9, group=1))
        for i in range(lines):
            session.add(LogLine(job_id=job.id, at=1e9 + i, line=f"line {i}"))
        session.add(LogLine(job_id=job.id, at=2e9, group=1, rank=0, line="from the other group"))
        return job.id


def test_metrics_csv_and_log_text_hold_every_row_once_over_pages(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(downloads, "PAGE", 7)  # several pages, the last one short
    job_id = a_job(db, points=30, lines=20)
    with db.session() as session:
        found = downloads.metrics_csv(db.sessions, session, job_id, max_rows=100)
    assert found.size == 31
    rows = list(csv.DictReader(io.StringIO(b"".join(found.chunks).decode())))
    assert len(rows) == 31
    assert list(rows[0]) == ["step", "time", "name", "group", "rank", "value"]
    assert rows[0] == {
        "step": "0",
        "time": "1000000000.0",
        "name": "loss",
        "group": "0",
        "rank": "0",
        "value": "0.0",
    }
    assert rows[3]["value"] == "0.3"
    assert rows[-1]["group"] == "1"
    with db.session() as session:
        text = b"".join(downloads.logs_text(db.sessions, session, job_id, max_rows=100).chunks)
    assert text.decode().splitlines() == [f"line {i}" for i in range(20)] + [
        "[1/0] from the other group"
    ]


def test_a_download_past_its_bound_is_refused_before_anything_is_sent(db: Database) -> None:
    job_id = a_job(db, points=10, lines=5)
    with db.session() as session:
        with pytest.raises(TooLarge, match="11 points, more than the 10"):
            downloads.metrics_csv(db.sessions, session, job_id, max_rows=10)
        with pytest.raises(TooLarge, match="6 lines, more than the 5"):
            downloads.logs_text(db.sessions, session, job_id, max_rows=5)


def test_tensorboard_tar_holds_every_workers_event_files_and_is_bounded(tmp_path: Path) -> None:
    run_dir = job_run_dir(tmp_path, 7)
    first = run_dir / TENSORBOARD / "events.out.tfevents.1.host.1"
    other = run_dir / WORKERS / "g1r0" / TENSORBOARD / "events.out.tfevents.2.host.2"
    for path, size in ((first, 70_000), (other, 10)):
        path.parent.mkdir(parents=True)
        path.write_bytes(bytes(range(256)) * (size // 256) + b"x" * (size % 256))
    (run_dir / "metrics.jsonl").write_text("{}\n")  # not an event file: left out
    found = downloads.tensorboard_tar(tmp_path, 7, max_bytes=70_010)
    assert found.size == 70_010
    with tarfile.open(fileobj=io.BytesIO(b"".join(found.chunks))) as tar:
        assert tar.getnames() == [
            "job-7/tensorboard/events.out.tfevents.1.host.1",
            "job-7/workers/g1r0/tensorboard/events.out.tfevents.2.host.2",
        ]
        member = tar.extractfile("job-7/tensorboard/events.out.tfevents.1.host.1")
        assert member is not None and member.read() == first.read_bytes()
    with pytest.raises(TooLarge, match="70010 bytes"):
        downloads.tensorboard_tar(tmp_path, 7, max_bytes=70_009)
    empty = downloads.tensorboard_tar(tmp_path, 8, max_bytes=1)  # never started: no files
    with tarfile.open(fileobj=io.BytesIO(b"".join(empty.chunks))) as tar:
        assert tar.getnames() == []
