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


def test_a_job_no_node_could_hold_is_refused_at_submission_with_the_reason(api: Any) -> None:
    add_node(api, slots=2)
    overrides = {"cluster.framework": "allreduce", "cluster.nworkers_per_group": 4}
    before = api.counts()
    for route in ("/api/v1/jobs", "/api/v1/jobs/validate"):
        response = api.client.post(
            route, json={"spec": MLP, "overrides": overrides}, headers=api.auth()
        )
        if route.endswith("validate"):  # a dry run says it, as where the job would go
            assert response.status_code == 200, response.text
            reason = response.json()["placement"]["reason"]
        else:
            assert response.status_code == 422, response.text
            [issue] = response.json()["errors"]
            assert issue["path"] == "cluster"
            reason = issue["message"]
        assert reason.startswith("can never run on this cluster: needs 4 worker(s)")
        assert "1 node(s), 2 slot(s)" in reason
    assert api.counts() == before  # nothing queued for ever


def test_with_no_node_alive_yet_a_job_is_queued_to_wait_for_one(api: Any) -> None:
    job = api.submit(MLP)
    assert job["state"] == "QUEUED" and "no node agent is alive" in job["pending_reason"]


def test_a_job_that_fits_has_no_reason_to_wait(api: Any) -> None:
    add_node(api, slots=2)
    job = api.submit(MLP)
    assert job["pending_reason"] is None
