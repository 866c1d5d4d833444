"""A job the cluster cannot place says why at once: in the submission's answer and its detail."""

from __future__ import annotations

from typing import Any

from scheduler.store.models import Node
from scheduler.store.states import NodeState
from tests.api.conftest import example

MLP = example("digits_mlp.yaml")


def add_node(api: Any, slots: int) -> None:
    with api.db.session() as session:
        session.add(Node(name="node-a", queue="q.node-a", slots=slots, state=NodeState.ALIVE))


def test_a_job_no_node_could_hold_is_told_so_at_submission(api: Any) -> None:
    add_node(api, slots=2)
    overrides = {"cluster.framework": "allreduce", "cluster.nworkers_per_group": 4}
    response = api.client.post(
        "/api/v1/jobs", json={"spec": MLP, "overrides": overrides}, headers=api.auth()
    )
    assert response.status_code == 201, response.text
    job = response.json()
    assert job["state"] == "QUEUED"
    assert job["pending_reason"].startswith("can never run on this cluster: needs 4 worker(s)")
    assert "1 node(s), 2 slot(s)" in job["pending_reason"]
    detail = api.client.get(f"/api/v1/jobs/{job['id']}", headers=api.auth()).json()
    assert detail["pending_reason"] == job["pending_reason"] and detail["restarts"] == 0


def test_a_job_that_fits_has_no_reason_to_wait(api: Any) -> None:
    add_node(api, slots=2)
    job = api.submit(MLP)
    assert job["pending_reason"] is None
