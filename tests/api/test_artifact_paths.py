"""Checkpoint paths that came from records are confined to their job's run directory: a record
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
        assert f"leads outside job {job_id}'s run directory" in detail
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
    assert f"outside job {job_id}'s run directory" in response.json()["detail"]
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


# Confinement by job (issue 28): inside the artifact directory is not enough. A training
# process writes its own job's stream, and a forged record there must not reach another job's
# checkpoint or another user's dataset, through the ingester, a download, a delete or PBT.


def neighbours(api: Any) -> tuple[int, Path, Path]:
    """alice's finished job (its checkpoints folder), and bob's checkpoint in his own job."""
    mine, checkpoints = finished_job(api)
    theirs = int(api.submit(example("digits_mlp.yaml"), user="bob")["id"])  # type: ignore[call-overload]
    their_file = job_run_dir(api.settings.artifacts(), theirs) / "checkpoints"
    their_file.mkdir(parents=True)
    their_file = their_file / "step-00000001.safetensors"
    their_file.write_bytes(b"bob's weights")
    return mine, checkpoints, their_file


def bobs_dataset(api: Any) -> Path:
    from tests.api.test_datasets import npz_bytes, upload

    assert upload(api, "private", "private.npz", npz_bytes(), user="bob").status_code == 201
    return api.settings.artifacts() / "datasets" / str(api.user_ids["bob"]) / "private.npz"


def test_a_forged_record_cannot_name_another_jobs_checkpoint_or_a_dataset(api: Any) -> None:
    mine, checkpoints, theirs = neighbours(api)
    dataset = bobs_dataset(api)
    link = checkpoints / "step-00000003.safetensors"
    link.symlink_to(theirs)
    forged = [str(theirs), str(dataset), str(link)]
    # The ingester drops them.
    stream = JobStream(api.redis, api.keys, mine)
    for step, path in enumerate(forged, start=1):
        stream.publish(CheckpointPublished(step, path, 9))
    Ingester(api.db, api.redis, api.keys, artifacts=api.settings.artifacts()).run_once()
    with api.db.session() as session:
        assert (
            session.scalars(select(CheckpointRecord).where(CheckpointRecord.job_id == mine)).all()
            == []
        )
    # Recorded anyway (a forged row): not listed, not downloaded, and the delete refuses.
    for step, path in enumerate(forged, start=1):
        record(api, mine, step, path)
    listed = api.client.get(f"/api/v1/jobs/{mine}/checkpoints", headers=api.auth())
    assert listed.json() == []
    for step in (1, 2, 3):
        response = api.client.get(f"/api/v1/jobs/{mine}/checkpoints/{step}", headers=api.auth())
        assert response.status_code == 403, response.text
        assert f"outside job {mine}'s run directory" in response.json()["detail"]
        assert b"weights" not in response.content
    deleted = api.client.delete(f"/api/v1/jobs/{mine}", headers=api.auth())
    assert deleted.status_code == 403, deleted.text
    assert theirs.read_bytes() == b"bob's weights" and dataset.is_file()


def test_pbt_copies_no_checkpoint_from_outside_the_source_trials_run_directory(
    api: Any,
) -> None:
    from scheduler.sweeps.pbt import latest_checkpoint

    mine, checkpoints, theirs = neighbours(api)
    record(api, mine, 5, theirs)  # the newest record: another job's checkpoint
    (checkpoints / "step-00000004.safetensors").symlink_to(bobs_dataset(api))
    artifacts = api.settings.artifacts()
    with api.db.session() as session:
        job = session.get(Job, mine)
        assert latest_checkpoint(session, job, artifacts) is None  # nothing of its own
        own = checkpoints / "step-00000002.safetensors"
        own.write_bytes(b"alice's weights")
        assert latest_checkpoint(session, job, artifacts) == own.resolve()


def test_a_dataset_record_outside_its_owners_folder_trains_nothing(api: Any) -> None:
    from scheduler.store.models import DatasetRecord
    from tests.api.test_datasets import job_on

    dataset = bobs_dataset(api)
    with api.db.session() as session:  # alice's row, forged to point at bob's file
        session.add(
            DatasetRecord(
                owner_id=api.user_ids["alice"], name="stolen", kind="npz", path=str(dataset), size=9
            )
        )
    before = api.counts()
    response = api.client.post(
        "/api/v1/jobs",
        content=job_on("{source: dataset, name: stolen, batch_size: 8}"),
        headers=api.yaml_headers(),
    )
    assert response.status_code == 403, response.text
    assert f"the folder of user {api.user_ids['alice']}'s datasets" in response.json()["detail"]
    assert api.counts() == before
