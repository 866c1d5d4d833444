"""A .tar of shards as a dataset: unpacked safely into the owner's `<name>/` folder, checked
with describe_shards, and named by jobs as `data: {source: shards, dataset: NAME}`."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path
from typing import Any

import numpy as np
from sqlalchemy import select

from scheduler.store.models import DatasetRecord, Job
from tests.api.test_datasets import job_on, upload


def npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


def tar_of(files: dict[str, bytes], links: dict[str, str] | None = None) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for name, content in files.items():
            member = tarfile.TarInfo(name)
            member.size = len(content)
            archive.addfile(member, io.BytesIO(content))
        for name, target in (links or {}).items():
            link = tarfile.TarInfo(name)
            link.type, link.linkname = tarfile.SYMTYPE, target
            archive.addfile(link)
    return buffer.getvalue()


def shard_files(shards: int = 3, rows: int = 16, features: int = 6) -> dict[str, bytes]:
    rng = np.random.default_rng(0)
    files = {}
    for index in range(shards):
        x = rng.normal(size=(rows, features)).astype(np.float32)
        files[f"blobs/{index:05d}.x.npy"] = npy(x)
        files[f"blobs/{index:05d}.y.npy"] = npy(np.arange(rows) % 3)
    return files


def folder_of(api: Any, user: str = "alice") -> Path:
    return api.settings.artifacts() / "datasets" / str(api.user_ids[user])


def test_a_tar_of_shards_is_unpacked_and_trains_by_name(api: Any) -> None:
    response = upload(api, "blobs", "blobs.tar", tar_of(shard_files()))
    assert response.status_code == 201, response.text
    assert response.json()["kind"] == "shards"
    stored = folder_of(api) / "blobs"
    assert sorted(p.name for p in stored.iterdir())[:2] == ["00000.x.npy", "00000.y.npy"]
    job = job_on("{source: shards, dataset: blobs, batch_size: 8}")
    checked = api.client.post("/api/v1/jobs/validate", content=job, headers=api.yaml_headers())
    assert checked.status_code == 200, checked.text
    layers = {layer["name"]: layer for layer in checked.json()["layers"]}
    assert layers["data"]["out_shape"] == [6]
    submitted = api.submit(job)
    with api.db.session() as session:
        spec = session.get(Job, submitted["id"]).spec
        path = session.scalar(select(DatasetRecord.path).where(DatasetRecord.name == "blobs"))
    # workers read the stored folder by absolute path
    assert spec["data"] == {"source": "shards", "path": path, "batch_size": 8}
    assert Path(path) == stored


def test_bad_tars_are_refused_and_nothing_is_kept(api: Any) -> None:
    mismatched = shard_files()
    mismatched["blobs/00001.x.npy"] = npy(np.zeros((16, 5), dtype=np.float32))
    cases = {
        "mismatch": (tar_of(mismatched), "00001.x.npy"),
        "linked": (tar_of(shard_files(), {"00009.x.npy": "/etc/passwd"}), "not a plain file"),
        "twice": (tar_of({**shard_files(), "other/00000.x.npy": b"x"}), "'00000.x.npy' twice"),
        "empty": (tar_of({"readme.txt": b"hello"}), "no NNNNN.x.npy"),
        "broken": (b"not a tar at all" * 100, "not a readable .tar"),
    }
    for name, (content, message) in cases.items():
        response = upload(api, name, f"{name}.tar", content)
        assert response.status_code == 422, (name, response.text)
        assert message in response.json()["detail"], (name, response.text)
    folder = folder_of(api)
    assert not folder.exists() or list(folder.iterdir()) == []
    assert api.counts()[2] == 0


def test_a_path_climbing_out_lands_inside_the_folder(api: Any) -> None:
    files = {name.replace("blobs/", "../../"): data for name, data in shard_files().items()}
    response = upload(api, "climb", "climb.tar", tar_of(files))
    assert response.status_code == 201, response.text
    assert len(list((folder_of(api) / "climb").iterdir())) == 6
    assert not (folder_of(api).parent / "00000.x.npy").exists()


def test_only_admins_may_name_a_server_folder(api: Any) -> None:
    job = job_on("{source: shards, path: /data/big, test_path: /data/test}")
    response = api.client.post("/api/v1/jobs/validate", content=job, headers=api.yaml_headers())
    assert response.status_code == 422
    paths = {issue["path"] for issue in response.json()["errors"]}
    assert paths == {"data.path", "data.test_path"}
