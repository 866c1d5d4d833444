"""GET /cluster shows which parameter-server Redis each node cannot reach, and a job with
server shards that only such nodes could hold says so, from its submission on."""

from __future__ import annotations

from typing import Any

from scheduler.store.models import Node
from scheduler.store.states import NodeState
from tests.api.conftest import example

MLP = example("digits_mlp.yaml")
DOWN = "10.0.0.3:6379: connection refused"


def add_node(api: Any, name: str, slots: int, unreachable: list[str] | None = None) -> None:
    with api.db.session() as session:
        session.add(
            Node(
                name=name,
                queue=f"q.{name}",
                slots=slots,
                state=NodeState.ALIVE,
                ps_unreachable=unreachable,
            )
        )


def test_cluster_shows_the_unreachable_ps_redis_per_node_and_the_reason(api: Any) -> None:
    add_node(api, "node-1", slots=2)
    add_node(api, "node-2", slots=8, unreachable=[DOWN])
    response = api.client.post(
        "/api/v1/jobs",
        json={"spec": MLP, "overrides": {"cluster.framework": "sandblaster"}},
        headers=api.auth(),
    )
    assert response.status_code == 201, response.text
    submitted = response.json()
    note = f"node-2 cannot reach parameter-server Redis {DOWN}"
    # Not "never": the node may reach it later.
    assert submitted["pending_reason"] == (
        "cannot run on this cluster now: needs 2 worker(s) + 1 server shard(s): 3 slot(s); "
        f"it has 1 node(s), 2 slot(s), 0 GPU(s); {note}"
    )
    allreduce = api.client.post(
        "/api/v1/jobs",
        json={"spec": MLP, "overrides": {"cluster.framework": "allreduce"}},
        headers=api.auth(),
    ).json()
    assert allreduce["pending_reason"] is None  # it fits now, on either node

    view = api.client.get("/api/v1/cluster", headers=api.auth()).json()
    assert {n["name"]: n["ps_unreachable"] for n in view["nodes"]} == {
        "node-1": [],
        "node-2": [DOWN],
    }
    reasons = {entry["job_id"]: entry["reason"] for entry in view["queue"]}
    assert reasons[submitted["id"]].endswith(f"(1 node(s), 2 slot(s), 0 GPU(s)); {note}")
    assert reasons[allreduce["id"]] == "fits now; placed at the next scheduling pass"
