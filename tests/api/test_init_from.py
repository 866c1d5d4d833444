"""checkpoint.init_from: {job: ID, checkpoint: ...}: fine-tuning from one of your own jobs, for
every user; checked against the net when the job is submitted."""

from __future__ import annotations

import pytest
import yaml
from sqlalchemy import select

from scheduler.store.models import Job
from tests.api.conftest import Api, example
from tests.api.test_exports import job_with_checkpoints
from tests.conftest import TrainedRun

pytestmark = pytest.mark.parametrize("sql_backend", ["sqlite"], indirect=True)


def document(init_from: object, **changes: object) -> str:
    job = yaml.safe_load(example("digits_mlp.yaml"))
    job["checkpoint"] = {"init_from": init_from}
    job.update(changes)
    return yaml.safe_dump(job, sort_keys=False)


def post(api: Api, text: str, user: str = "alice") -> tuple[int, dict[str, object]]:
    answer = api.client.post("/api/v1/jobs", content=text, headers=api.yaml_headers(user))
    return answer.status_code, answer.json()


def stored_init_from(api: Api, job_id: int) -> str:
    with api.db.session() as session:
        spec = session.scalar(select(Job.spec).where(Job.id == job_id))
    assert spec is not None
    found: str = spec["checkpoint"]["init_from"]
    return found


def test_a_user_starts_from_their_own_jobs_checkpoint(
    api: Api, trained_runs: dict[str, TrainedRun]
) -> None:
    source, files = job_with_checkpoints(api, trained_runs["digits_mlp"], best=20)
    status, body = post(api, document({"job": source}))
    assert status == 201, body
    assert stored_init_from(api, int(body["id"])) == str(files[20].resolve())  # type: ignore[call-overload]
    status, body = post(api, document({"job": source, "checkpoint": "latest"}))
    assert status == 201, body
    assert stored_init_from(api, int(body["id"])) == str(files[40].resolve())  # type: ignore[call-overload]


def test_what_cannot_start_from_a_job_is_located(
    api: Api, trained_runs: dict[str, TrainedRun]
) -> None:
    source, _ = job_with_checkpoints(api, trained_runs["digits_mlp"], best=20)
    before = api.counts()
    layers = yaml.safe_load(example("digits_mlp.yaml"))["neuralnet"]["layers"]
    narrower = [dict(layer) for layer in layers]
    narrower[1]["units"] = 200  # fc1: 200 units, not 256
    renamed = [{**layer, "name": f"x{layer['name']}"} for layer in layers]
    for srcs in renamed:
        srcs["srclayers"] = [f"x{name}" for name in srcs.get("srclayers", [])]
    cases = [
        ("bob", document({"job": source}), "checkpoint.init_from.job", f"you have no job {source}"),
        ("admin", document({"job": source}), "checkpoint.init_from.job", "you have no job"),
        ("alice", document({"job": 999}), "checkpoint.init_from.job", "you have no job 999"),
        (
            "alice",
            document({"job": source, "checkpoint": "7"}),
            "checkpoint.init_from",
            "no checkpoint at step 7",
        ),
        (
            "alice",
            document({"job": source}, neuralnet={"layers": narrower}),
            "checkpoint.init_from",
            "fc1/w (the checkpoint's [256, 64], this net's [200, 64])",
        ),
        (
            "alice",
            document({"job": source}, neuralnet={"layers": renamed}),
            "checkpoint.init_from",
            "no parameter of job",
        ),
        ("alice", document("/etc/passwd"), "checkpoint.init_from", "only admins"),
    ]
    for user, text, path, words in cases:
        status, body = post(api, text, user)
        assert status == 422, (user, words, body)
        errors = body["errors"]
        assert isinstance(errors, list) and errors, body
        assert errors[0]["path"] == path and words in errors[0]["message"], errors
        assert errors[0]["line"] > 0
    assert api.counts() == before
