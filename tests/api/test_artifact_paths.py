"""Checkpoint paths that came from records are confined to the artifact directory: a record
pointing at /etc/passwd, through `..` or a symlink out is refused wherever the API or the
scheduler would open or delete the file, and that file is left alone (both SQL backends)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from contract.rundir import job_run_dir
from contract.stream import CheckpointRecord as CheckpointPublished
from contract.stream import JobStream
from scheduler.ingest.ingester import Ingester
from scheduler.store.models import CheckpointRecord, Job
from tests.api.conftest import example


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A file outside the artifact directory that nothing may read or delete."""
    path = tmp_path / "outside" / "secret.txt"
    path.parent.mkdir()
    path.write_text("not yours")
    return path


def finished_job(api: Any) -> tuple[int, Path]:
    job_id = int(api.submit(example("digits_mlp.yaml"))["id"])  # type: ignore[call-overload]
    cancel = api.client.post(f"/api/v1/jobs/{job_id}/cancel", headers=api.auth())
    assert cancel.status_code == 200, cancel.text
    checkpoints = job_run_dir(api.settings.artifacts(), job_id) / "checkpoints"
    checkpoints.mkdir(parents=True)
    return job_id, checkpoints


def record(api: Any, job_id: int, step: int, path: Path | str) -> None:
    with api.db.session() as session:
        session.add(CheckpointRecord(job_id=job_id, step=step, path=str(path), size=9))


def bad_paths(checkpoints: Path, outside: Path) -> list[str]:
    link = checkpoints / "step-3.safetensors"
    link.symlink_to(outside)
    return ["/etc/passwd", f"{checkpoints}/../../../../outside/secret.txt", str(link)]


def test_the_ingester_drops_checkpoint_records_that_lead_out(api: Any, outside: Path) -> None:
    job_id, checkpoints = finished_job(api)
    good = checkpoints / "step-4.safetensors"
    good.write_bytes(b"weights")
    stream = JobStream(api.redis, api.keys, job_id)
    for step, path in enumerate(bad_paths(checkpoints, outside), start=1):
        stream.publish(CheckpointPublished(step, path, 9))
    stream.publish(CheckpointPublished(4, str(good), 7))
    Ingester(api.db, api.redis, api.keys, artifacts=api.settings.artifacts()).run_once()
    with api.db.session() as session:
        stored = session.execute(select(CheckpointRecord.step, CheckpointRecord.path)).all()
    assert stored == [(4, str(good.resolve()))]


def test_downloads_refuse_recorded_paths_outside(api: Any, outside: Path) -> None:
    job_id, checkpoints = finished_job(api)
    for step, path in enumerate(bad_paths(checkpoints, outside), start=1):
        record(api, job_id, step, path)
    good = checkpoints / "step-4.safetensors"
    good.write_bytes(b"weights")
    record(api, job_id, 4, good)
    listed = api.client.get(f"/api/v1/jobs/{job_id}/checkpoints", headers=api.auth())
    assert [c["step"] for c in listed.json()] == [4]
    for step in (1, 2, 3):
        response = api.client.get(f"/api/v1/jobs/{job_id}/checkpoints/{step}", headers=api.auth())
        assert response.status_code == 403, response.text
        detail = response.json()["detail"]
        assert f"checkpoint at step {step}'s recorded path" in detail
        assert "leads outside the artifact directory" in detail
        assert "not yours" not in response.text and "root:" not in response.text
    fine = api.client.get(f"/api/v1/jobs/{job_id}/checkpoints/4", headers=api.auth())
    assert fine.status_code == 200 and fine.content == b"weights"
    assert outside.read_text() == "not yours"


def test_deleting_a_job_with_a_record_outside_touches_nothing(api: Any, outside: Path) -> None:
    job_id, checkpoints = finished_job(api)
    good = checkpoints / "step-1.safetensors"
    good.write_bytes(b"weights")
    record(api, job_id, 1, good)
    record(api, job_id, 2, f"{checkpoints}/../../../../outside/secret.txt")
    response = api.client.delete(f"/api/v1/jobs/{job_id}", headers=api.auth())
    assert response.status_code == 403, response.text
    assert "job " in response.json()["detail"] and "outside the artifact" in response.text
    assert outside.read_text() == "not yours"
    assert good.read_bytes() == b"weights"  # checked before anything was deleted
    with api.db.session() as session:
        assert session.get(Job, job_id) is not None
    # Through a symlink in the run directory, likewise.
    with api.db.session() as session:
        row = session.scalar(select(CheckpointRecord).where(CheckpointRecord.step == 2))
        row.path = bad_paths(checkpoints, outside)[2]
    assert api.client.delete(f"/api/v1/jobs/{job_id}", headers=api.auth()).status_code == 403
    assert outside.read_text() == "not yours" and good.is_file()
