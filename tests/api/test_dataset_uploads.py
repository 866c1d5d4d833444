"""Uploads that try to hurt the server: archives that inflate past the limit (zip bombs), and
several uploads of one dataset name at the same moment."""

from __future__ import annotations

import io
import threading
import tracemalloc
import zipfile
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from sqlalchemy import select

from contract.settings import Settings
from scheduler.admission.uploads import intake_bounds
from scheduler.store import errors as store_errors
from scheduler.store.datasets import save_dataset
from scheduler.store.errors import TooLarge
from scheduler.store.intake import Bound, check_npz_sizes
from scheduler.store.models import DatasetRecord
from scheduler.store.users import get_user
from tests.api.conftest import make_settings

GB = 1 << 30
MB = 1 << 20
# The zip bomb is ~1 MB on the wire, so these tests take uploads up to 2 MB.
UPLOAD_LIMIT = 2 * MB


@pytest.fixture
def api_settings(tmp_path: Path, migrated_sql_url: str, redis_url: str) -> Settings:
    return make_settings(tmp_path, migrated_sql_url, redis_url, max_dataset_bytes=UPLOAD_LIMIT)


def npy_header(shape: tuple[int, ...], descr: str = "<f4") -> bytes:
    buffer = io.BytesIO()
    header = {"descr": descr, "fortran_order": False, "shape": shape}
    np.lib.format.write_array_header_2_0(buffer, header)
    return buffer.getvalue()


def zip_bomb(nbytes: int = GB) -> bytes:
    """A real .npz whose array `x` is `nbytes` of float32 zeros, deflated to ~nbytes/1000.
    Written in 1 MB pieces, so building it never holds the array in memory."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("y.npy", _npy(np.zeros(4, dtype=np.int64)))
        with archive.open("x.npy", "w", force_zip64=True) as member:
            member.write(npy_header((nbytes // 4,)))
            zeros = bytes(MB)
            for _ in range(nbytes // MB):
                member.write(zeros)
    return buffer.getvalue()


def lying_zip(declared: int) -> bytes:
    """A small stored member whose .npy header claims a huge shape."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("x.npy", npy_header((declared // 8, 2), "<f4") + bytes(64))
    return buffer.getvalue()


def _npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


def upload(client: Any, url: str, headers: dict[str, str], name: str, content: bytes) -> Any:
    return client.post(
        url,
        files={"file": (f"{name}.npz", content, "application/octet-stream")},
        data={"name": name},
        headers=headers,
    )


@pytest.fixture(scope="module")
def bomb() -> bytes:
    return zip_bomb()


def test_a_zip_bomb_is_refused_without_inflating_it(bomb: bytes, tmp_path: Path) -> None:
    path = tmp_path / "bomb.npz"
    path.write_bytes(bomb)
    assert len(bomb) < UPLOAD_LIMIT
    tracemalloc.start()
    try:
        with pytest.raises(TooLarge, match="more than the limit of 2097152 bytes") as refused:
            check_npz_sizes(path, Bound(UPLOAD_LIMIT, "max_dataset_bytes"), "bomb.npz")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert str(refused.value).startswith("bomb.npz: ")
    assert "member 'x.npy' alone declares 1073741952 bytes" in str(refused.value)
    assert peak < 4 * MB  # the 1 GB array was never built


def test_an_npy_header_that_claims_more_than_its_member_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "liar.npz"
    path.write_bytes(lying_zip(declared=GB))
    with pytest.raises(TooLarge, match=r"array 'x' .* shape \(134217728, 2\) of float32"):
        check_npz_sizes(path, Bound(UPLOAD_LIMIT, "max_dataset_bytes"))


def test_the_api_answers_a_zip_bomb_413_and_keeps_nothing(api: Any, bomb: bytes) -> None:
    response = upload(api.client, "/api/v1/datasets", api.auth(), "bomb", bomb)
    assert response.status_code == 413, response.text
    detail = response.json()["detail"]
    assert detail.startswith("bomb.npz: ") and "member 'x.npy' alone declares 1073741952" in detail
    assert "more than the limit of 2097152 bytes (max_dataset_bytes" in detail
    assert api.counts()[2] == 0
    folder = api.settings.artifacts() / "datasets" / str(api.user_ids["alice"])
    assert list(folder.iterdir()) == []
    lie = upload(api.client, "/api/v1/datasets", api.auth(), "liar", lying_zip(declared=GB))
    assert lie.status_code == 413 and "shape (134217728, 2)" in lie.json()["detail"]


def test_an_archive_just_under_the_limit_is_kept(api: Any) -> None:
    x = np.ones((UPLOAD_LIMIT // 4 - 1024) // 4, dtype=np.float32)  # under once with y
    buffer = io.BytesIO()
    np.savez_compressed(buffer, x=x, y=np.zeros(len(x), np.int8))
    response = upload(api.client, "/api/v1/datasets", api.auth(), "fits", buffer.getvalue())
    assert response.status_code == 201, response.text


ROUNDS, RACERS = 4, 3


def test_uploads_of_one_name_at_once_give_one_201_and_409s(api: Any, live_server: Any) -> None:
    """Real concurrent requests on a real server: per name, one upload wins, the others get 409
    (never 500), and the file on disk is the winner's."""
    url = f"{live_server.url}/api/v1/datasets"
    contents = [
        _npz(np.full((20_000, 2), racer, dtype=np.float32), np.arange(20_000) % 2)
        for racer in range(RACERS)
    ]
    results: dict[tuple[int, int], httpx.Response] = {}

    def race(round_: int, racer: int, start: threading.Barrier) -> None:
        with httpx.Client(timeout=60) as client:
            start.wait()
            results[round_, racer] = upload(
                client, url, api.auth(), f"same{round_}", contents[racer]
            )

    for round_ in range(ROUNDS):
        start = threading.Barrier(RACERS)
        threads = [
            threading.Thread(target=race, args=(round_, racer, start)) for racer in range(RACERS)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    folder = api.settings.artifacts() / "datasets" / str(api.user_ids["alice"])
    for round_ in range(ROUNDS):
        answers = [results[round_, racer] for racer in range(RACERS)]
        codes = sorted(answer.status_code for answer in answers)
        assert codes == [201] + [409] * (RACERS - 1), [a.text for a in answers]
        (winner,) = [racer for racer in range(RACERS) if answers[racer].status_code == 201]
        stored = np.load(folder / f"same{round_}.npz")
        assert float(stored["x"][0, 0]) == winner  # a loser never replaced the winner's file
        for answer in answers:
            if answer.status_code == 409:
                assert "already have a dataset named" in answer.json()["detail"]
    assert sorted(p.name for p in folder.iterdir()) == [f"same{r}.npz" for r in range(ROUNDS)]
    assert api.counts()[2] == ROUNDS


def test_the_unique_index_decides_when_the_first_check_passes(api: Any) -> None:
    """The race's losing side, step by step: a second session that passed the name check
    before the first committed gets a Conflict at its insert and leaves the file alone."""
    artifacts = api.settings.artifacts()
    with api.db.session() as first, api.db.session() as second:
        alice = get_user(first, "alice")
        again = get_user(second, "alice")
        assert alice is not None and again is not None
        save_dataset(
            first,
            alice,
            name="twice",
            filename="a.npz",
            content=io.BytesIO(_npz(np.zeros((4, 2)), np.zeros(4))),
            artifacts=artifacts,
            max_bytes=UPLOAD_LIMIT,
            bounds=intake_bounds(first, alice, api.settings, one_request=True),
        )
        first.commit()
        second.connection()  # its own transaction, as a request that began at the same time
        with pytest.raises(store_errors.Conflict, match="already have a dataset named 'twice'"):
            save_dataset(
                second,
                again,
                name="twice",
                filename="b.npz",
                content=io.BytesIO(_npz(np.ones((4, 2)), np.zeros(4))),
                artifacts=artifacts,
                max_bytes=UPLOAD_LIMIT,
                bounds=intake_bounds(second, again, api.settings, one_request=True),
            )
    with api.db.session() as session:
        (path,) = session.scalars(select(DatasetRecord.path))
    assert float(np.load(path)["x"][0, 0]) == 0.0
    assert [p.name for p in Path(path).parent.iterdir()] == ["twice.npz"]


def _npz(x: np.ndarray, y: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, x=x, y=y)
    return buffer.getvalue()
