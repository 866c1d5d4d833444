"""Bearer tokens: every endpoint but /healthz needs one; users see only what is theirs."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
MLP = (ROOT / "examples" / "digits_mlp.yaml").read_text()

JOB_READS = [
    "",
    "/metrics",
    "/metrics/names",
    "/logs",
    "/events",
    "/graph",
    "/checkpoints",
    "/checkpoints/1",
    "/stream",
    "/export?format=onnx",
]


def every_route(job_id: int) -> list[tuple[str, str]]:
    return [
        ("POST", "/api/v1/jobs"),
        ("POST", "/api/v1/jobs/validate"),
        ("GET", "/api/v1/jobs"),
        ("POST", f"/api/v1/jobs/{job_id}/cancel"),
        ("DELETE", f"/api/v1/jobs/{job_id}"),
        ("GET", "/api/v1/cluster"),
        ("GET", "/api/v1/datasets"),
        ("POST", "/api/v1/datasets"),
        ("GET", "/api/v1/metrics"),
        ("GET", "/metrics"),
        ("GET", "/api/v1/tokens"),
        ("POST", "/api/v1/tokens"),
        ("DELETE", "/api/v1/tokens/1"),
        ("GET", "/api/v1/quota"),
        ("GET", "/api/v1/users/alice/quota"),
        ("PATCH", "/api/v1/users/alice/quota"),
        ("POST", f"/api/v1/jobs/{job_id}/stream-ticket"),
        ("POST", "/api/v1/models"),
        ("GET", "/api/v1/models"),
        ("GET", "/api/v1/models/digits/1"),
        ("GET", "/api/v1/models/digits/1/checkpoint"),
        ("GET", "/api/v1/models/digits/1/export?format=onnx"),
        ("POST", "/api/v1/models/digits/1/tags"),
        ("DELETE", "/api/v1/models/digits/1/tags/production"),
        ("DELETE", "/api/v1/models/digits/1"),
        *(("GET", f"/api/v1/jobs/{job_id}{path}") for path in JOB_READS),
    ]


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Bearer not-a-token"},
        {"Authorization": "Basic YWxpY2U6c2VjcmV0"},
        {"Authorization": "Bearer"},
        {"Authorization": "bearer  "},
    ],
    ids=["missing", "unknown", "basic", "empty", "blank"],
)
def test_every_endpoint_but_health_refuses_a_missing_or_bad_token(
    api: Any, headers: dict[str, str]
) -> None:
    job_id = api.submit(MLP)["id"]
    before = api.counts()
    for method, path in every_route(job_id):
        response = api.client.request(method, path, headers=headers, content=MLP)
        assert response.status_code == 401, (method, path, response.text)
        assert response.json()["detail"] and response.headers["www-authenticate"].startswith(
            "Bearer"
        )
    assert api.counts() == before
    assert api.client.get("/healthz", headers=headers).status_code == 200
    # the token is checked before the body is read
    for body, media in ((b"x", "application/xml"), (b"{bad", "application/json")):
        response = api.client.post(
            "/api/v1/jobs", content=body, headers={**headers, "content-type": media}
        )
        assert response.status_code == 401


def test_other_users_jobs_are_not_found_and_untouched(api: Any) -> None:
    job_id = api.submit(MLP, user="alice")["id"]
    before = api.counts()
    for path in JOB_READS:
        response = api.client.get(f"/api/v1/jobs/{job_id}{path}", headers=api.auth("bob"))
        assert response.status_code == 404, (path, response.text)
        assert response.json()["detail"] == f"no job {job_id}"
    cancel = api.client.post(f"/api/v1/jobs/{job_id}/cancel", headers=api.auth("bob"))
    delete = api.client.delete(f"/api/v1/jobs/{job_id}", headers=api.auth("bob"))
    assert cancel.status_code == delete.status_code == 404
    assert api.client.get("/api/v1/jobs", headers=api.auth("bob")).json()["items"] == []
    assert api.counts() == before
    assert not api.redis.exists(api.keys.cancel(job_id))
    # the same answer as for an id that does not exist, so ids do not leak
    unknown = api.client.get(f"/api/v1/jobs/{job_id + 100}", headers=api.auth("bob"))
    assert unknown.status_code == 404 and unknown.json()["detail"] == f"no job {job_id + 100}"


def test_admins_see_and_touch_every_job(api: Any) -> None:
    job_id = api.submit(MLP, user="alice")["id"]
    detail = api.client.get(f"/api/v1/jobs/{job_id}", headers=api.auth("admin"))
    assert detail.status_code == 200 and detail.json()["owner"] == "alice"
    cancel = api.client.post(f"/api/v1/jobs/{job_id}/cancel", headers=api.auth("admin"))
    assert cancel.status_code == 200 and cancel.json()["state"] == "CANCELLED"


def test_datasets_are_private_to_their_owner(api: Any) -> None:
    buffer = io.BytesIO()
    np.savez(buffer, x=np.zeros((10, 3), dtype=np.float32), y=np.arange(10) % 2)
    upload = api.client.post(
        "/api/v1/datasets",
        files={"file": ("pairs.npz", buffer.getvalue())},
        data={"name": "pairs"},
        headers=api.auth("alice"),
    )
    assert upload.status_code == 201, upload.text
    assert api.client.get("/api/v1/datasets", headers=api.auth("bob")).json() == []
    seen = api.client.get("/api/v1/datasets", headers=api.auth("admin")).json()
    assert [(d["name"], d["owner"]) for d in seen] == [("pairs", "alice")]
    job = MLP.replace(
        "data: {source: digits, batch_size: 64, test_fraction: 0.2}",
        "data: {source: dataset, name: pairs}",
    )
    refused = api.client.post("/api/v1/jobs/validate", content=job, headers=api.yaml_headers("bob"))
    assert refused.status_code == 422
    (issue,) = refused.json()["errors"]
    assert issue["path"] == "data.name" and "no dataset named 'pairs'" in issue["message"]
    accepted = api.client.post(
        "/api/v1/jobs/validate", content=job, headers=api.yaml_headers("alice")
    )
    assert accepted.status_code == 200, accepted.text


def test_token_last_use_is_recorded(api: Any) -> None:
    from sqlalchemy import select

    from scheduler.store.models import ApiToken, User

    api.client.get("/api/v1/jobs", headers=api.auth("bob"))
    with api.db.session() as session:
        used = session.execute(
            select(User.name, ApiToken.last_used_at).join(User, User.id == ApiToken.user_id)
        ).all()
    assert {name for name, at in used if at is not None} == {"bob"}
