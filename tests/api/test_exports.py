"""GET /jobs/{id}/export: a job's trained net as ONNX or a torch.export program, the owner's
alone, bounded in size, time and exports at once."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnxruntime
import pytest
import torch

from contract.rundir import CHECKPOINTS, job_run_dir, list_checkpoints
from dsl.inference import load_inference_net
from scheduler.store.models import CheckpointRecord
from tests.api.conftest import Api, example
from tests.conftest import TrainedRun

# The export's SQL is one query of the checkpoint records, which tests of the store run on both
# databases; each export here takes seconds of a process of its own, so SQLite alone.
pytestmark = pytest.mark.parametrize("sql_backend", ["sqlite"], indirect=True)


def job_with_checkpoints(api: Api, run: TrainedRun, best: int) -> tuple[int, dict[int, Path]]:
    """A job of alice's whose run directory holds the trained run's checkpoints, `best` marked."""
    job_id = int(api.submit(example("digits_mlp.yaml"))["id"])  # type: ignore[call-overload]
    assert api.client.post(f"/api/v1/jobs/{job_id}/cancel", headers=api.auth()).status_code == 200
    folder = job_run_dir(api.settings.artifacts(), job_id) / CHECKPOINTS
    folder.mkdir(parents=True)
    files = {}
    with api.db.session() as session:
        for step, path in list_checkpoints(run.run_dir / CHECKPOINTS):
            files[step] = Path(shutil.copy(path, folder / path.name))
            size = path.stat().st_size
            session.add(
                CheckpointRecord(
                    job_id=job_id, step=step, path=str(files[step]), size=size, best=step == best
                )
            )
        session.commit()
    return job_id, files


def test_export_onnx_and_torch_export(api: Api, trained_runs: dict[str, TrainedRun]) -> None:
    run = trained_runs["digits_mlp"]
    job_id, files = job_with_checkpoints(api, run, best=20)
    url = f"/api/v1/jobs/{job_id}/export"
    answer = api.client.get(url, params={"format": "onnx"}, headers=api.auth())
    assert answer.status_code == 200, answer.text
    meta = json.loads(answer.headers["x-trainyard-model"])
    assert meta["step"] == 20  # the best checkpoint by default
    assert meta["input"] == {"name": "x", "shape": ["batch", 1, 8, 8], "dtype": "float32"}
    session = onnxruntime.InferenceSession(answer.content, providers=["CPUExecutionProvider"])
    (scores,) = session.run(None, {"x": run.x_test.numpy()})
    with torch.no_grad():
        expected = load_inference_net(files[20])(run.x_test).numpy()
    np.testing.assert_allclose(scores, expected, atol=1e-4, rtol=0)

    latest = api.client.get(
        url,
        params={"format": "torch-export", "checkpoint": "latest", "probabilities": True},
        headers=api.auth(),
    )
    assert latest.status_code == 200, latest.text
    assert json.loads(latest.headers["x-trainyard-model"])["output"]["name"] == "probabilities"
    assert latest.headers["content-disposition"].endswith('step40.pt2"')
    assert latest.content[:2] == b"PK"  # a .pt2 is a zip archive


def test_others_and_bad_requests(api: Api, trained_runs: dict[str, TrainedRun]) -> None:
    job_id, files = job_with_checkpoints(api, trained_runs["digits_mlp"], best=20)
    url = f"/api/v1/jobs/{job_id}/export"
    for user in ("bob", "admin"):  # an admin sees the job, and exports only their own
        answer = api.client.get(url, params={"format": "onnx"}, headers=api.auth(user))
        assert answer.status_code == 404, answer.text
    for params, status, words in (
        ({"format": "tflite"}, 422, "format"),
        ({"format": "onnx", "checkpoint": "newest"}, 422, "checkpoint"),
        ({"format": "onnx", "checkpoint": "7"}, 404, "no checkpoint at step 7"),
    ):
        answer = api.client.get(url, params=params, headers=api.auth())
        assert answer.status_code == status and words in answer.json()["detail"], answer.text

    api.settings.max_export_bytes = 1000
    answer = api.client.get(url, params={"format": "onnx"}, headers=api.auth())
    assert answer.status_code == 413 and "max_export_bytes" in answer.json()["detail"]
    api.settings.max_export_bytes = 512_000_000

    exporter = api.app.state.services.exporter
    exporter.slots.acquire()
    answer = api.client.get(url, params={"format": "onnx"}, headers=api.auth())
    exporter.slots.release()
    assert answer.status_code == 429 and answer.headers["retry-after"] == "5"

    api.settings.export_timeout_seconds = 0.05
    answer = api.client.get(url, params={"format": "onnx"}, headers=api.auth())
    assert answer.status_code == 503 and "export_timeout_seconds" in answer.json()["detail"]
    api.settings.export_timeout_seconds = 120.0

    files[40].write_bytes(b"not a checkpoint")
    answer = api.client.get(
        url, params={"format": "onnx", "checkpoint": "latest"}, headers=api.auth()
    )
    assert answer.status_code == 422 and "cannot be exported" in answer.json()["detail"]
