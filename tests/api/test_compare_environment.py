"""GET /compare (several jobs side by side, bounded, only the caller's) and
GET /jobs/{id}/environment with its packages, over real SQL."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from contract.stream import EnvironmentRecord
from scheduler.store.environments import save_environments
from scheduler.store.models import Metric

ROOT = Path(__file__).resolve().parents[2]
MLP = (ROOT / "examples" / "digits_mlp.yaml").read_text()


def submit(api: Any, user: str = "alice", **overrides: Any) -> int:
    body = {"spec": MLP, "overrides": overrides}
    answer = api.client.post("/api/v1/jobs", json=body, headers=api.auth(user))
    assert answer.status_code == 201, answer.text
    return int(answer.json()["id"])


def environment(
    torch: str, host: str, packages: tuple[str, ...], rank: int = 0
) -> EnvironmentRecord:
    return EnvironmentRecord(
        python="3.11.9",
        torch=torch,
        cuda="",
        cudnn="",
        nccl="",
        devices=("cpu (2 cores)",),
        cpu_model="Test CPU",
        cpu_count=2,
        hostname=host,
        trainyard_version="0.1.0",
        trainyard_commit="",
        packages_hash=str(hash(packages)),
        packages=packages,
        packages_total=len(packages),
        rank=rank,
    )


def test_jobs_compared_side_by_side(api: Any) -> None:
    ids = [submit(api), submit(api, **{"updater.momentum": 0.5}), submit(api, train_steps=300)]
    start = time.time()
    with api.db.session() as session:
        for i, job_id in enumerate(ids):
            session.add_all(
                Metric(
                    job_id=job_id, name="train/loss", step=s, value=(i + 1) / (s + 1), at=start + s
                )
                for s in range(0, 300, 10)
            )
        session.add(Metric(job_id=ids[0], name="test/accuracy", step=290, value=0.9, at=start))
        save_environments(
            session, ids[0], [environment("2.13.0", "a", ("numpy==2.0", "torch==2.13.0"))]
        )
        save_environments(session, ids[1], [environment("2.12.0", "a", ("torch==2.12.0",))])
    answer = api.client.get(
        "/api/v1/compare",
        params={"jobs": ",".join(map(str, ids)), "max_points": 10},
        headers=api.auth(),
    )
    assert answer.status_code == 200, answer.text
    found = answer.json()
    assert [job["id"] for job in found["jobs"]] == ids
    losses = [c for c in found["curves"] if c["name"] == "train/loss"]
    assert [c["job_id"] for c in losses] == ids
    assert all(len(c["steps"]) == len(c["times"]) == len(c["values"]) == 10 for c in losses)
    assert losses[1]["steps"][-1] == 290 and losses[1]["times"][-1] == pytest.approx(start + 290)
    settings = {d["key"]: d["values"] for d in found["settings"]}
    assert settings == {"updater.momentum": [0.9, 0.5, 0.9], "train_steps": [2000, 2000, 300]}
    assert found["same_settings"] > 20
    rows = {m["name"]: m for m in found["metrics"]}
    assert rows["train/loss"]["final"] == pytest.approx([1 / 291, 2 / 291, 3 / 291])
    assert rows["train/loss"]["max"] == pytest.approx([1.0, 2.0, 3.0])
    assert rows["test/accuracy"]["final"] == [0.9, None, None]
    assert found["environments"][2] is None and found["environments"][0]["torch"] == "2.13.0"
    assert {d["key"]: d["values"] for d in found["environment"]}["torch"] == [
        "2.13.0",
        "2.12.0",
        None,
    ]
    packages = {d["key"]: d["values"] for d in found["packages"]}
    assert packages == {"numpy": ["2.0", None, None], "torch": ["2.13.0", "2.12.0", None]}


def test_compare_is_bounded_and_sees_only_the_callers_jobs(api: Any) -> None:
    mine, other = submit(api), submit(api, user="bob")
    before = api.counts()

    def ask(jobs: str, user: str = "alice") -> Any:
        return api.client.get("/api/v1/compare", params={"jobs": jobs}, headers=api.auth(user))

    hidden = ask(f"{mine},{other}")
    assert hidden.status_code == 404 and f"no job {other}" in hidden.json()["detail"]
    assert ask(f"{mine},999999").status_code == 404
    for bad in (str(mine), f"{mine},{mine}", ",".join(str(i) for i in range(1, 12)), "1,x", "1;2"):
        answer = ask(bad)
        assert answer.status_code == 422, (bad, answer.text)
    assert ask("1," * 150).status_code == 422  # past the query's length
    # An admin compares anyone's.
    assert ask(f"{mine},{other}", user="admin").status_code == 200
    assert api.counts() == before


def test_a_jobs_environment_and_its_packages(api: Any) -> None:
    job_id = submit(api)
    base = f"/api/v1/jobs/{job_id}/environment"
    empty = api.client.get(base, headers=api.auth()).json()
    assert empty == {"processes": [], "differing": []}
    assert api.client.get(f"{base}/packages", headers=api.auth()).status_code == 404
    with api.db.session() as session:
        save_environments(
            session,
            job_id,
            [
                environment("2.13.0", "node-a", ("numpy==2.0", "torch==2.13.0")),
                environment("2.13.0", "node-b", ("numpy==2.0", "torch==2.13.0"), rank=1),
            ],
        )
    found = api.client.get(base, headers=api.auth()).json()
    assert [(p["group"], p["rank"], p["hostname"]) for p in found["processes"]] == [
        (0, 0, "node-a"),
        (0, 1, "node-b"),
    ]
    assert found["differing"] == ["hostname"]
    assert found["processes"][0]["devices"] == ["cpu (2 cores)"]
    listed = api.client.get(f"{base}/packages", params={"rank": 1}, headers=api.auth())
    assert listed.status_code == 200 and listed.text == "numpy==2.0\ntorch==2.13.0\n"
    assert listed.headers["content-type"].startswith("text/plain")
    assert api.client.get(base, headers=api.auth("bob")).status_code == 404
    assert api.client.get(f"{base}/packages", headers=api.auth("bob")).status_code == 404
