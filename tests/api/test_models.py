"""/models: the model registry. Versions of a user's named models, from their jobs'
checkpoints; tags; other users' models are absent; a version outlives its job; fine-tuning
from a registered model."""

from __future__ import annotations

import yaml
from sqlalchemy import select

from scheduler.store.models import Job, Metric
from tests.api.conftest import Api, example
from tests.api.test_exports import job_with_checkpoints
from tests.conftest import TrainedRun


def register(api: Api, user: str = "alice", **body: object) -> tuple[int, dict[str, object]]:
    answer = api.client.post("/api/v1/models", json=body, headers=api.auth(user))
    return answer.status_code, answer.json()


def test_register_tag_download_and_delete(api: Api, trained_runs: dict[str, TrainedRun]) -> None:
    job_id, files = job_with_checkpoints(api, trained_runs["digits_mlp"], best=20)
    with api.db.session() as session:
        session.add(Metric(job_id=job_id, name="test/accuracy", step=20, value=0.75, at=0.0))
        session.commit()
    status, first = register(api, name="digits", job_id=job_id)
    assert status == 201, first
    assert (first["ref"], first["step"], first["tags"]) == ("digits@1", 20, [])
    assert (first["objective"], first["objective_value"]) == ("test/accuracy", 0.75)
    assert first["input"]["sample_shape"] == [1, 8, 8]  # type: ignore[index]
    assert first["spec"]["name"] == "digits-mlp"  # type: ignore[index]
    status, second = register(api, name="digits", job_id=job_id, checkpoint="latest")
    assert status == 201 and second["ref"] == "digits@2" and second["step"] == 40, second

    models = "/api/v1/models"
    listed = api.client.get(models, headers=api.auth()).json()
    assert [m["ref"] for m in listed] == ["digits@1", "digits@2"]
    for version in (1, 2):  # the tag moves to the version tagged last
        tagged = api.client.post(
            f"{models}/digits/{version}/tags", json={"tag": "production"}, headers=api.auth()
        )
        assert tagged.status_code == 200 and tagged.json()["tags"] == ["production"]
    shown = api.client.get(f"{models}/digits/production", headers=api.auth()).json()
    assert shown["version"] == 2
    assert api.client.get(f"{models}/digits/1", headers=api.auth()).json()["tags"] == []

    # The version outlives its job: its checkpoint is the service's own.
    assert api.client.delete(f"/api/v1/jobs/{job_id}", headers=api.auth()).status_code == 204
    assert not files[20].exists()
    download = api.client.get(f"{models}/digits/1/checkpoint", headers=api.auth())
    assert download.status_code == 200
    source = trained_runs["digits_mlp"].run_dir / "checkpoints" / files[20].name
    assert download.content == source.read_bytes()
    assert api.client.get(f"{models}/digits/1", headers=api.auth()).json()["job_id"] is None

    assert api.client.delete(f"{models}/digits/1", headers=api.auth()).status_code == 204
    assert api.client.get(f"{models}/digits/1", headers=api.auth()).status_code == 404
    assert [m["ref"] for m in api.client.get(models, headers=api.auth()).json()] == ["digits@2"]


def test_the_best_is_the_objectives_best_checkpoint_without_keep_best(
    api: Api, trained_runs: dict[str, TrainedRun]
) -> None:
    """No checkpoint was kept as the best (no keep_best): the best is the kept checkpoint whose
    step has the objective's best value, not the latest."""
    job_id, files = job_with_checkpoints(api, trained_runs["digits_mlp"], best=-1)
    first, latest = sorted(files)
    with api.db.session() as session:
        for step, value in ((first, 0.973), (latest, 0.971)):
            session.add(Metric(job_id=job_id, name="test/accuracy", step=step, value=value, at=0))
        # another worker's figure is not the objective's
        other = Metric(job_id=job_id, name="test/accuracy", step=latest, value=1.0, at=0, rank=1)
        session.add(other)
        session.commit()
    status, version = register(api, name="digits-best", job_id=job_id)
    assert status == 201, version
    assert (version["step"], version["objective_value"]) == (first, 0.973)
    status, named = register(api, name="digits-best", job_id=job_id, checkpoint="best")
    assert status == 201 and named["step"] == first, named
    status, newest = register(api, name="digits-best", job_id=job_id, checkpoint="latest")
    assert status == 201 and newest["step"] == latest, newest
    listed = api.client.get(f"/api/v1/jobs/{job_id}/checkpoints", headers=api.auth()).json()
    assert [(c["step"], c["best"]) for c in listed] == [(first, True), (latest, False)]

    unmeasured, _ = job_with_checkpoints(api, trained_runs["digits_mlp"], best=-1)
    status, body = register(api, name="digits-best", job_id=unmeasured, checkpoint="best")
    assert status == 404 and "measured at none of its checkpoints" in str(body["detail"])
    status, fallback = register(api, name="digits-best", job_id=unmeasured)
    assert status == 201 and fallback["step"] == latest, fallback


def test_other_users_and_bad_requests(api: Api, trained_runs: dict[str, TrainedRun]) -> None:
    job_id, _ = job_with_checkpoints(api, trained_runs["digits_mlp"], best=20)
    assert register(api, name="digits", job_id=job_id)[0] == 201
    models = "/api/v1/models"
    assert register(api, "bob", name="mine", job_id=job_id)[0] == 404
    assert register(api, "admin", name="mine", job_id=job_id)[0] == 404
    assert api.client.get(models, headers=api.auth("bob")).json() == []
    for method, path, body in (
        ("GET", "/digits/1", None),
        ("GET", "/digits/1/checkpoint", None),
        ("GET", "/digits/1/export?format=onnx", None),
        ("POST", "/digits/1/tags", {"tag": "production"}),
        ("DELETE", "/digits/1", None),
    ):
        answer = api.client.request(method, models + path, json=body, headers=api.auth("bob"))
        assert answer.status_code == 404, (path, answer.text)
    for body in (
        {"name": "no spaces", "job_id": job_id},
        {"name": "digits", "job_id": job_id, "checkpoint": "newest"},
    ):
        assert register(api, **body)[0] == 422
    assert register(api, name="digits", job_id=job_id, checkpoint="7")[0] == 404
    bad_tag = api.client.post(f"{models}/digits/1/tags", json={"tag": "3"}, headers=api.auth())
    assert bad_tag.status_code == 422
    assert api.client.get(f"{models}/digits/staging", headers=api.auth()).status_code == 404


def test_fine_tune_from_a_registered_model(api: Api, trained_runs: dict[str, TrainedRun]) -> None:
    job_id, _ = job_with_checkpoints(api, trained_runs["digits_mlp"], best=20)
    assert register(api, name="digits", job_id=job_id)[0] == 201
    models = "/api/v1/models"
    api.client.post(f"{models}/digits/1/tags", json={"tag": "production"}, headers=api.auth())
    document = yaml.safe_load(example("digits_mlp.yaml"))
    document["checkpoint"] = {"init_from": {"model": "digits@production"}}
    text = yaml.safe_dump(document)
    answer = api.client.post("/api/v1/jobs", content=text, headers=api.yaml_headers())
    assert answer.status_code == 201, answer.text
    with api.db.session() as session:
        spec = session.scalar(select(Job.spec).where(Job.id == answer.json()["id"]))
    assert spec is not None and spec["checkpoint"]["init_from"].endswith("digits-v1.safetensors")
    answer = api.client.post("/api/v1/jobs", content=text, headers=api.yaml_headers("bob"))
    assert answer.status_code == 422
    (issue,) = answer.json()["errors"]
    assert issue["path"] == "checkpoint.init_from.model"
    assert "you have no model digits@production" in issue["message"]
    document["checkpoint"] = {"init_from": {"model": "digits@1", "job": job_id}}
    answer = api.client.post(
        "/api/v1/jobs", content=yaml.safe_dump(document), headers=api.yaml_headers()
    )
    assert answer.status_code == 422 and "give one of job" in answer.text
