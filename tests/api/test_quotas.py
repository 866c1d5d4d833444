"""Quotas checked at submission (403 naming the quota, nothing stored), the per-user rate
limit (429 with Retry-After), priority above the default (admins only) and the quota API."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from sqlalchemy import func, select

from contract.settings import Settings
from scheduler.store.models import CheckpointRecord, UserQuota

ROOT = Path(__file__).resolve().parents[2]
MLP = (ROOT / "examples" / "digits_mlp.yaml").read_text()  # train_steps: 2000, 1 slot
ALLREDUCE = (
    (ROOT / "examples" / "mnist1d_allreduce.yaml")
    .read_text()
    .replace("train_steps: 3000", "train_steps: 1000")
    .replace("nworkers_per_group: 2", "nworkers_per_group: 3")
    .replace("batch_size: 64", "batch_size: 66")  # split evenly between the 3 workers
)  # 3 worker slots
SWEEP = (ROOT / "examples" / "mnist1d_sweep.yaml").read_text()  # train_steps: 1000


@pytest.fixture
def api_settings(api_settings: Settings) -> Settings:
    return api_settings.model_copy(
        update={
            "quota_train_steps": 2000,
            "quota_slots": 2,
            "quota_dataset_bytes": 3000,
            "quota_artifact_bytes": 1000,
            "quota_submissions_per_minute": 4,
        }
    )


def post_job(api: Any, document: str, user: str = "alice", **params: Any) -> Any:
    return api.client.post(
        "/api/v1/jobs", content=document, headers=api.yaml_headers(user), params=params
    )


def test_a_job_past_a_quota_is_refused_naming_it(api: Any) -> None:
    before = api.counts()
    steps = post_job(api, MLP.replace("train_steps: 2000", "train_steps: 2001"))
    assert steps.status_code == 403
    assert steps.json()["detail"] == "train_steps 2001 is over your quota train_steps of 2000"
    slots = post_job(api, ALLREDUCE)
    assert slots.status_code == 403
    assert "needs 3 worker slot(s); your quota slots is 2" in slots.json()["detail"]
    sweep = api.client.post(
        "/api/v1/sweeps",
        content=SWEEP.replace("train_steps: 1000", "train_steps: 5000"),
        headers=api.yaml_headers(),
    )
    assert sweep.status_code == 403 and "quota train_steps" in sweep.json()["detail"]
    assert api.counts() == before
    assert post_job(api, MLP).status_code == 201  # at the quota: fine


def test_checkpoints_past_the_artifact_quota_stop_new_submissions(api: Any) -> None:
    job_id = api.submit(MLP)["id"]
    with api.db.session() as session:
        session.add(CheckpointRecord(job_id=job_id, step=100, path="/nowhere", size=1000))
    before = api.counts()
    refused = post_job(api, MLP)
    assert refused.status_code == 403
    assert "at or over your quota artifact_bytes of 1000" in refused.json()["detail"]
    assert api.counts() == before
    assert post_job(api, MLP, user="bob").status_code == 201  # bob's storage is his own


def test_an_upload_past_the_dataset_quota_is_refused_and_not_kept(api: Any) -> None:
    def upload(name: str, rows: int) -> Any:
        buffer = io.BytesIO()
        np.savez(buffer, x=np.zeros((rows, 3), dtype=np.float32), y=np.arange(rows) % 2)
        return api.client.post(
            "/api/v1/datasets",
            files={"file": (f"{name}.npz", buffer.getvalue())},
            data={"name": name},
            headers=api.auth(),
        )

    assert upload("small", 10).status_code == 201
    before = api.counts()
    refused = upload("big", 200)
    assert refused.status_code == 403
    # Its arrays would unpack to more than the quota leaves: refused before anything is kept.
    assert "(what your quota dataset_bytes of 3000 leaves)" in refused.json()["detail"]
    assert api.counts() == before
    folder = api.settings.artifacts() / "datasets"
    assert not list(folder.rglob("big*"))


def test_submissions_past_the_rate_get_429_with_retry_after(api: Any) -> None:
    for _ in range(4):
        assert post_job(api, MLP).status_code == 201
    before = api.counts()
    refused = post_job(api, MLP)
    assert refused.status_code == 429
    assert 1 <= int(refused.headers["retry-after"]) <= 60
    assert "submissions_per_minute is 4" in refused.json()["detail"]
    assert api.counts() == before
    assert post_job(api, MLP, user="bob").status_code == 201  # per user
    # an admin raises alice's own rate: she may submit again
    raised = api.client.patch(
        "/api/v1/users/alice/quota",
        json={"submissions_per_minute": 10},
        headers=api.auth("admin"),
    )
    assert raised.status_code == 200
    assert post_job(api, MLP).status_code == 201


def test_only_admins_set_a_priority_above_the_default(api: Any) -> None:
    before = api.counts()
    refused = post_job(api, MLP, priority=5)
    assert refused.status_code == 403
    assert "only admins may set a priority above the default" in refused.json()["detail"]
    json_body = api.client.post(
        "/api/v1/jobs", json={"spec": MLP, "priority": 1}, headers=api.auth()
    )
    assert json_body.status_code == 403
    assert api.counts() == before
    assert post_job(api, MLP, priority=-3).json()["priority"] == -3
    assert post_job(api, MLP, user="admin", priority=5).json()["priority"] == 5


def test_admins_change_quotas_and_users_read_theirs(api: Any) -> None:
    mine = api.client.get("/api/v1/quota", headers=api.auth())
    assert mine.status_code == 200
    body = mine.json()
    assert body["limits"]["train_steps"] == 2000 and body["limits"]["running_jobs"] is None
    assert body["overrides"] == [] and body["usage"]["running_jobs"] == 0
    url = "/api/v1/users/alice/quota"
    changed = api.client.patch(
        url, json={"train_steps": 5000, "running_jobs": 1}, headers=api.auth("admin")
    )
    assert changed.status_code == 200, changed.text
    assert changed.json()["limits"]["train_steps"] == 5000
    assert changed.json()["overrides"] == ["running_jobs", "train_steps"]
    assert post_job(api, MLP.replace("train_steps: 2000", "train_steps: 4000")).status_code == 201
    reset = api.client.patch(url, json={"train_steps": None}, headers=api.auth("admin"))
    assert reset.json()["limits"]["train_steps"] == 2000
    assert reset.json()["overrides"] == ["running_jobs"]


def test_bad_quota_requests_are_clear_4xx_and_change_nothing(api: Any) -> None:
    def rows() -> int:
        with api.db.session() as session:
            return session.scalar(select(func.count()).select_from(UserQuota)) or 0

    url = "/api/v1/users/alice/quota"
    cases = [
        ("alice", url, {"train_steps": 10}, 403, "only admins"),
        ("admin", "/api/v1/users/nobody/quota", {"slots": 1}, 404, "no user named 'nobody'"),
        ("admin", url, {"slots": -1}, 422, "body.slots"),
        ("admin", url, {"train_steps": 0}, 422, "body.train_steps"),
        ("admin", url, {"disk": 1}, 422, "body.disk"),
        ("admin", url, {"slots": "many"}, 422, "body.slots"),
    ]
    for user, path, body, status, message in cases:
        response = api.client.patch(path, json=body, headers=api.auth(user))
        assert response.status_code == status, (body, response.text)
        assert message in response.json()["detail"], (body, response.text)
    assert rows() == 0
    other = api.client.get("/api/v1/users/bob/quota", headers=api.auth())
    assert other.status_code == 403
    assert api.client.get("/api/v1/users/bob/quota", headers=api.auth("admin")).status_code == 200
