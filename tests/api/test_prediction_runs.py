"""A prediction run's job as the /jobs endpoints serve it, in-process, on both SQL backends."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from dsl.run_kinds import PREDICTION, TRAINING
from scheduler.store.jobs import NewJob, create_job
from scheduler.store.models import Job, Prediction, User
from scheduler.store.states import JobState
from tests.api.test_jobs import MLP, set_state


def test_a_prediction_runs_job_is_of_its_kind_and_progresses_by_its_rows(api: Any) -> None:
    """A prediction run's job (as scheduler/admission/predict.py queues it) is served with its
    kind, no framework and no train_steps; its progress is its furthest worker's rows over its
    largest shard's, alike in the list and the detail view. A training job is of kind
    training."""
    trained = api.submit(MLP)["id"]
    with api.db.session() as session:
        owner = session.get_one(User, api.user_ids["alice"])
        spec = session.get_one(Job, trained).spec  # the model's, as admission copies it
        new = NewJob(
            "predict-digits", "", {}, spec, {"framework": "", "nworkers_per_group": 3}, "", 0
        )
        run = create_job(session, owner, replace(new, kind=PREDICTION.name, objective=""))
        session.add(
            Prediction(
                owner_id=owner.id,
                job_id=trained,
                run_job_id=run.id,
                dataset="many",
                rows=10,  # shards of 4, 3 and 3 rows
                step=40,
                workers=3,
                checkpoint="/c.safetensors",
                dataset_file="/d.npz",
                dataset_format="npz",
                sample_key="x",
                batch_size=8,
            )
        )
        run_id = run.id
    set_state(api, run_id, JobState.SCHEDULED, JobState.RUNNING, step=2)
    listed = api.client.get("/api/v1/jobs", headers=api.auth()).json()["items"]
    by_id = {item["id"]: item for item in listed}
    detail = api.client.get(f"/api/v1/jobs/{run_id}", headers=api.auth()).json()
    for item in (by_id[run_id], detail):
        assert (item["kind"], item["framework"], item["train_steps"]) == (PREDICTION.name, "", 0)
        assert item["progress"] == 0.5
    assert by_id[trained]["kind"] == TRAINING.name and by_id[trained]["progress"] == 0.0
