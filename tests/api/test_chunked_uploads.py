"""Chunked dataset uploads through the API (real SQL, real files): parts, resume state,
checksums, quotas, expiry, the kinds a completion converts, and deleting datasets."""

from __future__ import annotations

import hashlib
import io
import json
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from sqlalchemy import select, update

from contract.settings import Settings
from scheduler.store.models import DatasetRecord, DatasetUpload, utcnow
from scheduler.store.quotas import set_quotas
from scheduler.store.users import get_user
from tests.api.conftest import Api, make_settings
from tests.helpers.data_bombs import MB, npz_bomb, parquet_bomb

ROOT = Path(__file__).resolve().parents[2]
MLP = (ROOT / "examples" / "digits_mlp.yaml").read_text()
DIGITS = "data: {source: digits, batch_size: 64, test_fraction: 0.2}"
PART = 1 << 16


@pytest.fixture
def api_settings(tmp_path: Path, migrated_sql_url: str, redis_url: str) -> Settings:
    return make_settings(
        tmp_path,
        migrated_sql_url,
        redis_url,
        max_upload_part_bytes=4 * PART,
        max_open_uploads=2,
        upload_expiry_seconds=3600.0,
        max_dataset_unpacked_bytes=32 * MB,
    )


def stored_shards(folder: Path) -> tuple[np.ndarray, np.ndarray]:
    """A converted table's x and y, its shards end to end; a small table makes 10 shards."""
    names = sorted(path.name for path in folder.glob("*.x.npy"))
    assert names == [f"{index:05d}.x.npy" for index in range(10)]
    xs = [np.load(folder / name) for name in names]
    ys = [np.load(folder / name.replace(".x.", ".y.")) for name in names]
    return np.concatenate(xs), np.concatenate(ys)


def npz_bytes(n: int = 3000, features: int = 20) -> bytes:
    rng = np.random.default_rng(0)
    buffer = io.BytesIO()
    np.savez(buffer, x=rng.normal(size=(n, features)).astype(np.float32), y=np.arange(n) % 3)
    return buffer.getvalue()


def start(api: Api, name: str, filename: str, content: bytes, user: str = "alice", **extra: Any):
    body = {
        "name": name,
        "filename": filename,
        "size": len(content),
        "sha256": hashlib.sha256(content).hexdigest(),
        "part_size": PART,
        **extra,
    }
    return api.client.post("/api/v1/datasets/uploads", json=body, headers=api.auth(user))


def put(api: Api, upload_id: str, number: int, content: bytes, user: str = "alice") -> Any:
    return api.client.put(
        f"/api/v1/datasets/uploads/{upload_id}/parts/{number}",
        content=content[number * PART : (number + 1) * PART],
        headers={**api.auth(user), "content-type": "application/octet-stream"},
    )


def complete(api: Api, upload_id: str, user: str = "alice") -> Any:
    return api.client.post(f"/api/v1/datasets/uploads/{upload_id}/complete", headers=api.auth(user))


def upload_whole(api: Api, name: str, filename: str, content: bytes, **extra: Any) -> Any:
    started = start(api, name, filename, content, **extra)
    assert started.status_code == 201, started.text
    upload = started.json()
    for number in range(upload["parts"]):
        assert put(api, upload["id"], number, content).status_code == 200
    return complete(api, upload["id"])


def used(api: Api, user: str = "alice") -> int:
    body = api.client.get("/api/v1/quota", headers=api.auth(user)).json()
    return int(body["usage"]["dataset_bytes"])


def test_parts_in_any_order_resume_state_and_completion(api: Api) -> None:
    content = npz_bytes()
    started = start(api, "blobs", "blobs.npz", content)
    assert started.status_code == 201, started.text
    upload = started.json()
    assert upload["parts"] == -(-len(content) // PART) and upload["received"] == []
    # The declared size counts against the quota from the start.
    assert used(api) == len(content)
    last = upload["parts"] - 1
    for number in (last, 0, 0):  # the last part first, and part 0 twice: idempotent
        answer = put(api, upload["id"], number, content)
        assert answer.status_code == 200, answer.text
    state = api.client.get(f"/api/v1/datasets/uploads/{upload['id']}", headers=api.auth())
    assert state.json()["received"] == [0, last]
    # A part of the wrong length changes nothing; an early completion says what is missing.
    short = api.client.put(
        f"/api/v1/datasets/uploads/{upload['id']}/parts/1",
        content=b"x" * 10,
        headers={**api.auth(), "content-type": "application/octet-stream"},
    )
    assert short.status_code == 422 and "holds 65536 bytes" in short.json()["detail"]
    early = complete(api, upload["id"])
    assert early.status_code == 422 and "have not arrived: 1" in early.json()["detail"]
    for number in range(1, last):
        assert put(api, upload["id"], number, content).status_code == 200
    done = complete(api, upload["id"])
    assert done.status_code == 201, done.text
    assert (done.json()["name"], done.json()["kind"]) == ("blobs", "npz")
    assert used(api) == len(content)  # the dataset's bytes, no longer the upload's
    listed = api.client.get("/api/v1/datasets/uploads", headers=api.auth()).json()
    assert listed == []
    # Other users see neither the upload nor its dataset.
    assert api.client.get("/api/v1/datasets", headers=api.auth("bob")).json() == []
    stored = api.settings.artifacts() / "datasets" / str(api.user_ids["alice"]) / "blobs.npz"
    assert stored.read_bytes() == content
    assert not any((api.settings.artifacts() / "uploads").rglob("*.part"))


def test_checksum_mismatch_is_refused_and_nothing_counts(api: Api) -> None:
    content = npz_bytes(n=500)
    started = start(api, "bad", "bad.npz", content, sha256="0" * 64)
    upload = started.json()
    for number in range(upload["parts"]):
        put(api, upload["id"], number, content)
    answer = complete(api, upload["id"])
    assert answer.status_code == 422 and "SHA-256" in answer.json()["detail"]
    assert api.counts()[2] == 0
    assert used(api) == 0
    assert api.client.get("/api/v1/datasets/uploads", headers=api.auth()).json() == []
    assert not (
        api.settings.artifacts() / "uploads" / str(api.user_ids["alice"]) / upload["id"]
    ).exists()


def test_quota_counts_open_uploads_and_refuses_past_it(api: Api) -> None:
    content = npz_bytes(n=500)
    with api.db.session() as session:
        user = get_user(session, "alice")
        assert user is not None
        set_quotas(session, user, {"dataset_bytes": int(len(content) * 1.5)})
        session.commit()
    one = start(api, "one", "one.npz", content)
    assert one.status_code == 201
    second = start(api, "two", "two.npz", content)
    assert second.status_code == 403 and "dataset_bytes" in second.json()["detail"]
    assert api.counts()[2] == 0
    # Aborting an upload frees what it held.
    aborted = api.client.delete(f"/api/v1/datasets/uploads/{one.json()['id']}", headers=api.auth())
    assert aborted.status_code == 204 and used(api) == 0
    assert start(api, "two", "two.npz", content).status_code == 201
    # Bounds: the kind by extension, the part size, the open uploads per user.
    assert start(api, "t", "t.bin", content).status_code == 415
    assert start(api, "p", "p.npz", content, part_size=100).status_code == 422
    assert start(api, "two", "two.npz", content).status_code == 409
    assert start(api, "b1", "b1.npz", b"12", user="bob").status_code == 201
    assert start(api, "b2", "b2.npz", b"12", user="bob").status_code == 201
    third = start(api, "b3", "b3.npz", b"12", user="bob")
    assert third.status_code == 409 and "open" in third.json()["detail"]


def test_abandoned_uploads_expire_and_free_their_bytes(api: Api) -> None:
    content = npz_bytes(n=500)
    upload = start(api, "gone", "gone.npz", content).json()
    time.sleep(0.01)
    put(api, upload["id"], 0, content)
    state = api.client.get(f"/api/v1/datasets/uploads/{upload['id']}", headers=api.auth())
    assert state.json()["expires_at"] > upload["expires_at"]  # each part moves it on
    folder = api.settings.artifacts() / "uploads" / str(api.user_ids["alice"]) / upload["id"]
    assert folder.is_dir() and used(api) == len(content)
    with api.db.session() as session:  # the hour of upload_expiry_seconds has passed
        session.execute(
            update(DatasetUpload)
            .where(DatasetUpload.id == upload["id"])
            .values(expires_at=utcnow() - timedelta(seconds=1))
        )
        session.commit()
    assert used(api) == 0
    assert api.client.get("/api/v1/datasets/uploads", headers=api.auth()).json() == []
    assert not folder.exists()  # purged by the listing
    assert put(api, upload["id"], 1, content).status_code == 404


def test_a_csv_with_text_columns_becomes_shards_with_categories(api: Api) -> None:
    rows = ["colour,size,weight,fruit"]
    rng = np.random.default_rng(1)
    for _ in range(300):
        colour = ["red", "green", "yellow"][rng.integers(3)]
        fruit = {"red": "apple", "green": "pear", "yellow": "banana"}[colour]
        rows.append(f"{colour},{rng.integers(1, 4)},{rng.normal():.3f},{fruit}")
    content = ("\n".join(rows) + "\n").encode()
    done = upload_whole(api, "fruit", "fruit.csv", content)
    assert done.status_code == 201, done.text
    assert done.json()["kind"] == "shards"
    folder = api.settings.artifacts() / "datasets" / str(api.user_ids["alice"]) / "fruit"
    categories = json.loads((folder / "categories.json").read_text())
    assert categories == {
        "features": {"colour": ["green", "red", "yellow"]},
        "label": ["apple", "banana", "pear"],
    }
    x, y = stored_shards(folder)
    assert x.shape == (300, 3) and x.dtype == np.float32 and y.dtype == np.int64
    colours = [line.split(",")[0] for line in rows[1:]]
    assert [categories["features"]["colour"][int(i)] for i in x[:, 0]] == colours
    assert [categories["label"][i] for i in y[:5]] == [line.split(",")[3] for line in rows[1:6]]
    # A job names it as any dataset; the service checks it from the shards' headers.
    document = MLP.replace(DIGITS, "data: {source: dataset, name: fruit, batch_size: 32}")
    checked = api.client.post("/api/v1/jobs/validate", content=document, headers=api.yaml_headers())
    assert checked.status_code == 200, checked.text


def test_parquet_tables_scalar_and_vector(api: Api, tmp_path: Path) -> None:
    table = pa.table(
        {
            "city": pa.array(["oslo", "rome", "oslo", "lima"] * 50).dictionary_encode(),
            "temp": pa.array(np.linspace(-5, 30, 200)),
            "rain": pa.array([True, False] * 100),
            "label": pa.array(["cold", "warm", "cold", "warm"] * 50),
        }
    )
    path = tmp_path / "weather.parquet"
    pq.write_table(table, path)
    done = upload_whole(api, "weather", "weather.parquet", path.read_bytes(), label_column="label")
    assert done.status_code == 201, done.text
    folder = api.settings.artifacts() / "datasets" / str(api.user_ids["alice"]) / "weather"
    categories = json.loads((folder / "categories.json").read_text())
    assert categories["features"] == {"city": ["lima", "oslo", "rome"]}
    assert categories["label"] == ["cold", "warm"]
    assert stored_shards(folder)[0].shape == (200, 3)

    x = np.arange(40 * 5, dtype=np.float32).reshape(40, 5)
    vectors = pa.FixedSizeListArray.from_arrays(pa.array(x.ravel()), 5)
    pq.write_table(pa.table({"x": vectors, "y": pa.array(np.linspace(0, 1, 40))}), path)
    done = upload_whole(api, "vectors", "vectors.parquet", path.read_bytes())
    assert done.status_code == 201, done.text
    folder = folder.with_name("vectors")
    stored_x, stored_y = stored_shards(folder)
    assert np.array_equal(stored_x, x)
    assert stored_y.dtype == np.float32  # a regression target

    pq.write_table(pa.table({"when": pa.array([1, 2], pa.timestamp("s")), "y": [0, 1]}), path)
    refused = upload_whole(api, "dates", "dates.parquet", path.read_bytes())
    assert refused.status_code == 422 and "column 'when'" in refused.json()["detail"]
    assert api.client.get("/api/v1/datasets/uploads", headers=api.auth()).json() == []


def test_text_uploads_are_utf8_and_train_the_text_source(api: Api) -> None:
    refused = upload_whole(api, "latin", "latin.txt", "café".encode("latin-1") * 10)
    assert refused.status_code == 422 and "UTF-8" in refused.json()["detail"]
    done = upload_whole(api, "poem", "poem.txt", ("the quick brown fox. " * 400).encode())
    assert done.status_code == 201 and done.json()["kind"] == "text"
    char_rnn = (ROOT / "examples" / "char_rnn.yaml").read_text()
    document = char_rnn.replace("{source: text,", "{source: text, dataset: poem,")
    checked = api.client.post("/api/v1/jobs/validate", content=document, headers=api.yaml_headers())
    assert checked.status_code == 200, checked.text
    wrong = char_rnn.replace("{source: text,", "{source: dataset, name: poem,").replace(
        "seq_len: 64, ", ""
    )
    answer = api.client.post("/api/v1/jobs/validate", content=wrong, headers=api.yaml_headers())
    assert answer.status_code == 422 and "source: text, dataset: poem" in answer.text


def test_delete_frees_the_quota_and_waits_for_the_jobs_reading_it(api: Api) -> None:
    content = npz_bytes(n=300)
    assert upload_whole(api, "mine", "mine.npz", content).status_code == 201
    document = MLP.replace(DIGITS, "data: {source: dataset, name: mine, batch_size: 32}")
    job = api.submit(document)  # no scheduler here: it stays queued
    refused = api.client.delete("/api/v1/datasets/mine", headers=api.auth())
    assert refused.status_code == 409 and f"job {job['id']}" in refused.json()["detail"]
    assert used(api) == len(content)
    cancel = api.client.post(f"/api/v1/jobs/{job['id']}/cancel", headers=api.auth())
    assert cancel.status_code == 200, cancel.text
    assert api.client.delete("/api/v1/datasets/mine", headers=api.auth()).status_code == 204
    assert used(api) == 0 and api.counts()[2] == 0
    assert not any((api.settings.artifacts() / "datasets").rglob("mine.npz"))
    assert api.client.delete("/api/v1/datasets/mine", headers=api.auth()).status_code == 404


def test_an_npz_is_checked_from_its_headers(api: Api) -> None:
    buffer = io.BytesIO()
    np.savez(buffer, x=np.zeros((10, 3), np.float32), y=np.zeros(9, np.int64))
    refused = upload_whole(api, "uneven", "uneven.npz", buffer.getvalue())
    assert refused.status_code == 422 and "one label per sample" in refused.json()["detail"]
    buffer = io.BytesIO()
    np.savez(buffer, x=np.array([{"a": 1}, None], dtype=object), y=np.arange(2))
    refused = upload_whole(api, "pickled", "pickled.npz", buffer.getvalue())
    assert refused.status_code == 422 and "object arrays" in refused.json()["detail"]
    assert api.counts()[2] == 0 and used(api) == 0


def alices(api: Api, *names: str) -> Path:
    return api.settings.artifacts().joinpath("datasets", str(api.user_ids["alice"]), *names)


def test_a_job_is_checked_against_the_inventory_its_upload_stored(api: Api) -> None:
    content = npz_bytes(n=300, features=20)
    assert upload_whole(api, "kept", "kept.npz", content).status_code == 201
    with api.db.session() as session:
        record = session.scalars(select(DatasetRecord)).one()
        inventory = record.inventory
    assert inventory is not None and inventory["arrays"]["x"]["shape"] == [300, 20]
    assert inventory["arrays"]["y"]["values"]["high"] == 2
    document = MLP.replace(DIGITS, "data: {source: dataset, name: kept, batch_size: 32}")

    def check() -> Any:
        return api.client.post(
            "/api/v1/jobs/validate", content=document, headers=api.yaml_headers()
        )

    job = api.submit(document)
    # The check reads the stored inventory, not the file: bytes in its place change nothing,
    # nor to the compiled net of a job already submitted.
    alices(api, "kept.npz").write_bytes(bytes(len(content)))
    checked = check()
    assert checked.status_code == 200, checked.text
    assert checked.json()["layers"][0]["out_shape"] == [20]
    graph = api.client.get(f"/api/v1/jobs/{job['id']}/graph", headers=api.auth())
    assert graph.status_code == 200 and graph.json()["nodes"][0]["out_shape"] == [20]
    # A dataset stored before inventories (null) is inventoried from its file, as it is.
    with api.db.session() as session:
        session.execute(update(DatasetRecord).values(inventory=None))
    refused = check()
    assert refused.status_code == 422 and "cannot read" in refused.text
    alices(api, "kept.npz").write_bytes(content)
    assert check().json()["layers"][0]["out_shape"] == [20]


def set_dataset_quota(api: Api, nbytes: int) -> None:
    with api.db.session() as session:
        user = get_user(session, "alice")
        assert user is not None
        set_quotas(session, user, {"dataset_bytes": nbytes})


def test_an_archive_that_unpacks_past_the_quota_is_refused_and_leaves_nothing(
    api: Api, tmp_path: Path
) -> None:
    set_dataset_quota(api, 8 * MB)
    bomb = npz_bomb(tmp_path / "bomb.npz", nbytes=64 * MB).read_bytes()  # 64 kB on the wire
    refused = upload_whole(api, "bomb", "bomb.npz", bomb)
    assert refused.status_code == 403, refused.text  # past the quota
    detail = refused.json()["detail"]
    assert detail.startswith("bomb.npz: ") and "member 'x.npy' alone declares 67108992" in detail
    assert f"the limit of {8 * MB} bytes (what your quota dataset_bytes of {8 * MB}" in detail
    assert used(api) == 0 and api.counts()[2] == 0
    assert api.client.get("/api/v1/datasets/uploads", headers=api.auth()).json() == []
    assert not alices(api).exists() or list(alices(api).iterdir()) == []


def test_without_a_quota_the_servers_bound_holds(api: Api, tmp_path: Path) -> None:
    bomb = npz_bomb(tmp_path / "bomb.npz", nbytes=64 * MB).read_bytes()
    refused = upload_whole(api, "bomb", "bomb.npz", bomb)
    assert refused.status_code == 413, refused.text
    detail = refused.json()["detail"]
    assert "more than the limit of 33554432 bytes (max_dataset_unpacked_bytes)" in detail
    assert used(api) == 0 and api.counts()[2] == 0
    assert not alices(api).exists() or list(alices(api).iterdir()) == []


def test_a_table_whose_shards_would_pass_the_quota_is_refused_before_any_is_written(
    api: Api, tmp_path: Path
) -> None:
    set_dataset_quota(api, 8 * MB)
    table = parquet_bomb(tmp_path / "zeros.parquet", rows=2**16, columns=64).read_bytes()
    refused = upload_whole(api, "zeros", "zeros.parquet", table)
    assert refused.status_code == 403, refused.text  # past the quota
    detail = refused.json()["detail"]
    assert detail.startswith("zeros.parquet converts to 65536 rows of 64 features: ")
    assert "what your quota dataset_bytes of 8388608 leaves" in detail
    assert used(api) == 0 and api.counts()[2] == 0
    assert not alices(api).exists() or list(alices(api).iterdir()) == []
