"""Uploading datasets and training jobs on them by name (`data: {source: dataset}`)."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from sqlalchemy import select

from dsl.schema import JobSpec
from scheduler.store.models import DatasetRecord, Job
from workers.data import load_dataset

ROOT = Path(__file__).resolve().parents[2]
MLP = (ROOT / "examples" / "digits_mlp.yaml").read_text()
DIGITS = "data: {source: digits, batch_size: 64, test_fraction: 0.2}"


def npz_bytes(n: int = 40, features: int = 6, classes: int = 3, **extra: np.ndarray) -> bytes:
    rng = np.random.default_rng(0)
    buffer = io.BytesIO()
    np.savez(
        buffer,
        x=rng.normal(size=(n, features)).astype(np.float32),
        y=np.arange(n) % classes,
        **extra,
    )
    return buffer.getvalue()


def csv_bytes(rows: int = 30) -> bytes:
    lines = ["a,b,c,label"] + [f"{i},{i * 0.5},{-i},{i % 2}" for i in range(rows)]
    return ("\n".join(lines) + "\n").encode()


def upload(api: Any, name: str, filename: str, content: bytes, user: str = "alice") -> Any:
    return api.client.post(
        "/api/v1/datasets",
        files={"file": (filename, content, "application/octet-stream")},
        data={"name": name},
        headers=api.auth(user),
    )


def job_on(data: str) -> str:
    return MLP.replace(DIGITS, f"data: {data}")


def test_upload_npz_and_csv_then_list(api: Any) -> None:
    first = upload(api, "blobs", "blobs.npz", npz_bytes())
    assert first.status_code == 201, first.text
    body = first.json()
    assert (body["name"], body["kind"], body["owner"]) == ("blobs", "npz", "alice")
    assert body["size"] == len(npz_bytes())
    second = upload(api, "table.v1", "t.CSV", csv_bytes())
    assert second.status_code == 201 and second.json()["kind"] == "csv"
    listed = api.client.get("/api/v1/datasets", headers=api.auth()).json()
    assert [d["name"] for d in listed] == ["blobs", "table.v1"]
    with api.db.session() as session:
        paths = [Path(p) for p in session.scalars(select(DatasetRecord.path))]
    assert all(p.is_file() and p.parent.name == str(api.user_ids["alice"]) for p in paths)
    assert not list(paths[0].parent.glob(".*partial"))


@pytest.mark.parametrize(
    ("filename", "content", "status", "message"),
    [
        ("data.txt", b"1,2\n3,4\n", 415, "is not .npz, .csv or .tar"),
        ("data", b"1,2\n3,4\n", 415, "is not .npz, .csv or .tar"),
        ("data.npz", b"this is not a zip", 422, "not a readable numpy .npz"),
        ("data.csv", b"\xff\xfe\x00bad", 422, "not UTF-8"),
        ("data.csv", b"1,2,3\n4,5\n", 422, "same number of columns"),
        ("data.csv", b"just-one-column\n1\n", 422, "at least 2"),
        ("data.csv", b"", 422, "empty"),
    ],
)
def test_bad_files_are_refused_and_nothing_is_kept(
    api: Any, filename: str, content: bytes, status: int, message: str
) -> None:
    response = upload(api, "bad", filename, content)
    assert response.status_code == status, response.text
    assert message in response.json()["detail"]
    assert api.counts()[2] == 0
    folder = api.settings.artifacts() / "datasets" / str(api.user_ids["alice"])
    assert not folder.exists() or list(folder.iterdir()) == []


def test_pickled_object_arrays_are_refused(api: Any) -> None:
    buffer = io.BytesIO()
    np.savez(buffer, x=np.array([{"a": 1}, None], dtype=object), y=np.arange(2))
    response = upload(api, "pickled", "p.npz", buffer.getvalue())
    assert response.status_code == 422 and "object arrays" in response.json()["detail"]


def test_names_are_unique_per_user_and_checked(api: Any) -> None:
    assert upload(api, "same", "a.npz", npz_bytes()).status_code == 201
    again = upload(api, "same", "b.csv", csv_bytes())
    assert again.status_code == 409 and "already have a dataset named 'same'" in again.text
    assert upload(api, "same", "a.npz", npz_bytes(), user="bob").status_code == 201
    for bad in ("../escape", "-dash", "", "x" * 101, "a b"):
        response = upload(api, bad, "a.npz", npz_bytes())
        assert response.status_code == 422, (bad, response.text)
    assert api.counts()[2] == 2


def test_size_limit_gives_413_and_keeps_nothing(api: Any) -> None:
    limit = api.settings.max_dataset_bytes
    message = f"the dataset is larger than the limit of {limit} bytes"
    just_over = npz_bytes(n=int(limit / 30) + 100, features=6)  # passes the multipart cap
    huge = npz_bytes(n=4000, features=20)  # refused on its Content-Length alone
    assert limit < len(just_over) < limit + 60_000 < len(huge)
    for content in (just_over, huge):
        response = upload(api, "big", "big.npz", content)
        assert response.status_code == 413 and response.json()["detail"] == message
    assert api.counts()[2] == 0
    folder = api.settings.artifacts() / "datasets" / str(api.user_ids["alice"])
    assert not folder.exists() or list(folder.iterdir()) == []


def test_a_job_trains_on_its_owners_dataset_by_name(api: Any, tmp_path: Path) -> None:
    assert upload(api, "blobs", "blobs.npz", npz_bytes(features=6, classes=3)).status_code == 201
    job = job_on("{source: dataset, name: blobs, batch_size: 8, test_fraction: 0.25}")
    checked = api.client.post("/api/v1/jobs/validate", content=job, headers=api.yaml_headers())
    assert checked.status_code == 200, checked.text
    layers = {layer["name"]: layer for layer in checked.json()["layers"]}
    assert layers["data"]["out_shape"] == [6] and layers["fc3"]["out_shape"] == [10]
    assert layers["fc1"]["params"] == 6 * 256 + 256

    submitted = api.submit(job)
    with api.db.session() as session:
        spec = session.get(Job, submitted["id"]).spec
        stored = session.scalar(select(DatasetRecord.path).where(DatasetRecord.name == "blobs"))
    # workers get the stored file by absolute path, with only the options that were written
    assert spec["data"] == {
        "source": "npz",
        "path": stored,
        "batch_size": 8,
        "test_fraction": 0.25,
    }
    assert "source: dataset" in submitted["spec_yaml"]
    execution = JobSpec.model_validate(spec)
    data = load_dataset(execution.data, seed=0, cache_dir=tmp_path)
    assert data.info.sample_shape == (6,) and len(data.x_test) == 10


def test_csv_dataset_options_and_options_of_the_other_kind(api: Any) -> None:
    assert upload(api, "table", "table.csv", csv_bytes()).status_code == 201
    ok = api.client.post(
        "/api/v1/jobs/validate",
        content=job_on("{source: dataset, name: table, label_column: label}"),
        headers=api.yaml_headers(),
    )
    assert ok.status_code == 200, ok.text
    assert ok.json()["layers"][0]["out_shape"] == [3]
    wrong = api.client.post(
        "/api/v1/jobs/validate",
        content=job_on("{source: dataset, name: table, x_key: feats}"),
        headers=api.yaml_headers(),
    )
    assert wrong.status_code == 422
    (issue,) = wrong.json()["errors"]
    assert issue["path"] == "data.x_key" and "does not read x_key" in issue["message"]
    assert issue["line"] == 5  # the data line of the example
    missing_column = api.client.post(
        "/api/v1/jobs/validate",
        content=job_on("{source: dataset, name: table, label_column: target}"),
        headers=api.yaml_headers(),
    )
    (issue,) = missing_column.json()["errors"]
    assert issue["path"] == "data.label_column" and "no column named 'target'" in issue["message"]


def test_a_datasets_error_names_its_file_not_the_servers_folders(api: Any) -> None:
    """A 422 about an uploaded dataset named its full path on the server (the data directory,
    `artifacts/datasets/<user id>/`): it names the file alone now."""
    assert upload(api, "table", "table.csv", csv_bytes()).status_code == 201
    assert upload(api, "blobs", "b.npz", npz_bytes()).status_code == 201
    for data, said in (
        ("{source: dataset, name: table, label_column: target}", "table.csv has no column"),
        ("{source: dataset, name: blobs, x_key: nope}", "blobs.npz has no array 'nope'"),
    ):
        answer = api.client.post(
            "/api/v1/jobs/validate", content=job_on(data), headers=api.yaml_headers()
        )
        assert answer.status_code == 422, answer.text
        (issue,) = answer.json()["errors"]
        assert issue["message"].startswith(said), issue
        assert said in answer.json()["detail"]
        for private in (api.settings.resolved_data_dir(), "datasets/"):
            assert str(private) not in answer.text


def test_unknown_dataset_names_yours(api: Any) -> None:
    upload(api, "mine", "m.npz", npz_bytes())
    response = api.client.post(
        "/api/v1/jobs", content=job_on("{source: dataset, name: mien}"), headers=api.yaml_headers()
    )
    assert response.status_code == 422
    (issue,) = response.json()["errors"]
    assert issue["path"] == "data.name" and issue["hint"] == "your datasets: mine"
    assert api.counts()[0] == 0


@pytest.mark.parametrize(
    ("data", "path"),
    [
        ("{source: npz, path: /etc/passwd}", "data.path"),
        ("{source: csv, path: data.csv}", "data.path"),
        ("{source: text, path: /etc/hostname}", "data.path"),
    ],
)
def test_only_admins_may_read_server_files(api: Any, data: str, path: str) -> None:
    response = api.client.post(
        "/api/v1/jobs/validate", content=job_on(data), headers=api.yaml_headers()
    )
    assert response.status_code == 422
    (issue,) = response.json()["errors"]
    assert issue["path"] == path and "POST /api/v1/datasets" in issue["hint"]


def test_admin_file_paths_resolve_against_base_dir(api: Any, tmp_path: Path) -> None:
    (tmp_path / "blobs.npz").write_bytes(npz_bytes(features=5))
    document = job_on("{source: npz, path: blobs.npz}")
    response = api.client.post(
        "/api/v1/jobs",
        json={"spec": document, "base_dir": str(tmp_path)},
        headers=api.auth("admin"),
    )
    assert response.status_code == 201, response.text
    with api.db.session() as session:
        spec = session.get(Job, response.json()["id"]).spec
    assert spec["data"]["path"] == str(tmp_path / "blobs.npz")
    init = api.client.post(
        "/api/v1/jobs/validate",
        json={"spec": document, "overrides": {"checkpoint.init_from": "old.safetensors"}},
        headers=api.auth("alice"),
    )
    assert init.status_code == 422
    assert {e["path"] for e in init.json()["errors"]} == {"data.path", "checkpoint.init_from"}


def test_a_validation_file_is_a_server_file_and_an_uploads_arrays_are_not(
    api: Any, tmp_path: Path
) -> None:
    refused = api.client.post(
        "/api/v1/jobs/validate",
        content=job_on("{source: text, val_path: /etc/hostname}"),
        headers=api.yaml_headers(),
    )
    assert refused.status_code == 422
    (issue,) = refused.json()["errors"]
    assert issue["path"] == "data.val_path" and "validation_fraction" in issue["hint"]
    # An admin's validation file is stored by its absolute path, as its training file is.
    (tmp_path / "t.csv").write_bytes(csv_bytes())
    (tmp_path / "v.csv").write_bytes(csv_bytes(rows=10))
    response = api.client.post(
        "/api/v1/jobs",
        json={
            "spec": job_on("{source: csv, path: t.csv, val_path: v.csv}"),
            "base_dir": str(tmp_path),
        },
        headers=api.auth("admin"),
    )
    assert response.status_code == 201, response.text
    assert response.json()["objective"] == "val/accuracy"
    with api.db.session() as session:
        data = session.get(Job, response.json()["id"]).spec["data"]
    assert (data["path"], data["val_path"]) == (str(tmp_path / "t.csv"), str(tmp_path / "v.csv"))
    # An uploaded .npz dataset's own validation arrays are the validation split.
    xv = np.zeros((8, 6), dtype=np.float32)
    assert upload(api, "held", "held.npz", npz_bytes(xv=xv, yv=np.arange(8) % 3)).status_code == 201
    named = api.client.post(
        "/api/v1/jobs/validate",
        content=job_on("{source: dataset, name: held, x_val_key: xv, y_val_key: yv}"),
        headers=api.yaml_headers(),
    )
    assert named.status_code == 200, named.text
