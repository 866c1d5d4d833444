"""Memory a job would take, bounded before it runs: the data's size, each worker's estimated
peak against its limit and against the largest share a node could give it (POST /jobs/validate
and POST /jobs, as a non-admin user)."""

from __future__ import annotations

from typing import Any

from scheduler.store.models import Job, Node
from scheduler.store.states import NodeState
from tests.api.conftest import example

MLP = example("digits_mlp.yaml")
# The issue's document: 10^12 generated samples of 100,000 features and a 900M-parameter layer.
HUGE = """
name: hog
data: {source: synthetic, num_samples: 1000000000000, num_features: 100000, num_classes: 2}
neuralnet:
  layers:
    - {name: data, type: input}
    - {name: fc, type: innerproduct, srclayers: [data], units: 9000}
    - {name: loss, type: softmax_loss, srclayers: [fc]}
updater: {type: sgd, lr: {base: 0.1}}
train_steps: 10
"""


def add_node(api: Any, *, slots: int, memory_mb: int) -> None:
    with api.db.session() as session:
        session.add(
            Node(
                name="node-a",
                queue="q.node-a",
                slots=slots,
                memory_mb=memory_mb,
                state=NodeState.ALIVE,
            )
        )


def validate(api: Any, document: str, overrides: dict[str, object] | None = None) -> Any:
    return api.client.post(
        "/api/v1/jobs/validate",
        json={"spec": document, "overrides": overrides or {}},
        headers=api.auth(),
    )


def issue_at(response: Any, path: str) -> dict[str, Any]:
    assert response.status_code == 422, response.text
    found = [issue for issue in response.json()["errors"] if issue["path"] == path]
    assert found, response.json()["errors"]
    assert found[0]["line"] > 0
    return found[0]


def test_the_generated_data_of_the_issue_is_refused_where_it_is_written(api: Any) -> None:
    issue_at(validate(api, HUGE), "data.num_samples")
    # Within each key's bound, the product is bounded too: 50M samples x 100,000 features.
    response = validate(api, HUGE.replace("1000000000000", "50000000"))
    assert "numbers a generated dataset may hold" in issue_at(response, "data")["message"]


def test_validate_shows_each_workers_estimated_peak_memory(api: Any) -> None:
    response = validate(api, MLP, {"data.batch_size": 64})
    assert response.status_code == 200, response.text
    memory = response.json()["memory"]
    # digits: 1797 samples of 64 floats and an int64 label; fc1..fc3 hold 50,698 parameters.
    assert memory["data_mb"] == 1 and memory["parameters_mb"] == 1
    assert memory["total_mb"] >= 400
    bigger = validate(api, MLP, {"data.batch_size": 64, "neuralnet.layers.1.units": 400_000})
    # 77.2M parameters (64 x 400,000 + 400,000 x 128 and the rest): themselves, their
    # gradients and SGD's momentum, 295 MB each.
    big = bigger.json()["memory"]
    assert big["parameters_mb"] == big["gradients_mb"] == big["updater_state_mb"] == 295
    assert big["total_mb"] > memory["total_mb"] + 3 * 294


def test_a_worker_no_node_could_hold_is_refused_with_its_estimate(api: Any) -> None:
    add_node(api, slots=2, memory_mb=1024)  # 512 MB a slot
    wide = {"neuralnet.layers.1.units": 100_000}  # about 680 MB
    issue = issue_at(validate(api, MLP, wide), "cluster.resources")
    assert "each worker needs about" in issue["message"] and "at most 512 MB" in issue["message"]
    assert "slots_per_worker" in issue["hint"]
    # Two slots bring 1024 MB: it fits.
    assert validate(api, MLP, {**wide, "cluster.resources.slots_per_worker": 2}).status_code == 200
    before = api.counts()
    response = api.client.post(
        "/api/v1/jobs", json={"spec": MLP, "overrides": wide}, headers=api.auth()
    )
    issue_at(response, "cluster.resources")
    assert api.counts() == before


def test_memory_mb_is_held_to_the_estimate_and_to_the_nodes_share(api: Any) -> None:
    add_node(api, slots=2, memory_mb=1024)
    too_much = validate(api, MLP, {"cluster.resources.memory_mb": 4096})
    assert (
        "at most 512 MB, on node-a" in issue_at(too_much, "cluster.resources.memory_mb")["message"]
    )
    too_little = validate(api, MLP, {"cluster.resources.memory_mb": 128})
    assert (
        "more than its memory_mb 128"
        in issue_at(too_little, "cluster.resources.memory_mb")["message"]
    )
    response = api.client.post(
        "/api/v1/jobs",
        json={"spec": MLP, "overrides": {"cluster.resources.memory_mb": 500}},
        headers=api.auth(),
    )
    assert response.status_code == 201, response.text
    job = response.json()
    with api.db.session() as session:
        stored = session.get(Job, job["id"])
        assert stored is not None and stored.topology["memory_mb"] == 500
