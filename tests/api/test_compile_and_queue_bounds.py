"""What one user can make the service spend on compiling and queueing, bounded (as a non-admin
through the real app, on both databases): a document's layers and compile time, the dry runs'
own allowance, the jobs waiting at once, a sweep's trials; and GET /cluster showing the
scheduler's last plan instead of planning the queue again."""

from __future__ import annotations

from typing import Any

from scheduler.placement.cluster import NOT_PLANNED, last_plan, save_plan
from scheduler.placement.plan import QueueDecision
from scheduler.store.quotas import set_quotas
from scheduler.store.users import get_user
from tests.api.conftest import example

MLP = example("digits_mlp.yaml")


def deep(layers: int) -> str:
    """A net of `layers` relu layers in a row (the issue's 8,000 took 16.5 s to compile)."""
    rows = ["    - {name: data, type: input}", "    - {name: r0, type: innerproduct, "
            "srclayers: [data], units: 10}"]  # fmt: skip
    rows += [f"    - {{name: r{i}, type: relu, srclayers: [r{i - 1}]}}" for i in range(1, layers)]
    rows.append(f"    - {{name: loss, type: softmax_loss, srclayers: [r{layers - 1}]}}")
    return (
        "name: deep\ndata: {source: digits}\nneuralnet:\n  layers:\n"
        + "\n".join(rows)
        + "\nupdater: {type: sgd, lr: {base: 0.1}}\ntrain_steps: 10\n"
    )


def post(api: Any, route: str, document: str, **body: Any) -> Any:
    return api.client.post(f"/api/v1/{route}", json={"spec": document, **body}, headers=api.auth())


def set_quota(api: Any, **changes: int) -> None:
    with api.db.session() as session:
        alice = get_user(session, "alice")
        assert alice is not None
        set_quotas(session, alice, changes)
        session.commit()


def test_a_net_past_the_layer_budget_is_refused_before_its_graph_is_resolved(api: Any) -> None:
    response = post(api, "jobs/validate", deep(1500))  # 76 KB, under the body cap
    assert response.status_code == 422, response.text
    [issue] = response.json()["errors"]
    assert issue["path"] == "neuralnet.layers" and issue["line"] == 4
    assert "1,502 layers" in issue["message"] and "1,000 a job may have" in issue["message"]


def test_a_document_past_its_time_budget_gets_a_located_error(api: Any) -> None:
    api.settings.compile_seconds = 0.01
    try:
        response = post(api, "jobs/validate", deep(300))
    finally:
        api.settings.compile_seconds = 10.0
    assert response.status_code == 422, response.text
    [issue] = response.json()["errors"]
    assert "took more than its budget of 0.01 s" in issue["message"]
    assert issue["path"].startswith("neuralnet.layers") and issue["line"] >= 4


def test_dry_runs_have_an_allowance_of_their_own(api: Any) -> None:
    set_quota(api, validations_per_minute=2, submissions_per_minute=100)
    assert [post(api, "jobs/validate", MLP).status_code for _ in range(2)] == [200, 200]
    refused = post(api, "jobs/validate", MLP)
    assert refused.status_code == 429 and "validations_per_minute is 2" in refused.text
    assert int(refused.headers["retry-after"]) >= 1
    assert post(api, "jobs", MLP).status_code == 201  # submissions count apart


def test_a_user_may_keep_only_so_many_jobs_waiting(api: Any) -> None:
    set_quota(api, queued_jobs=2)
    assert [post(api, "jobs", MLP).status_code for _ in range(2)] == [201, 201]
    before = api.counts()
    refused = post(api, "jobs", MLP)
    assert refused.status_code == 403 and "quota queued_jobs of 2" in refused.text
    assert api.counts() == before
    # Another user's queue is theirs.
    response = api.client.post("/api/v1/jobs", json={"spec": MLP}, headers=api.auth("bob"))
    assert response.status_code == 201


def test_a_sweep_may_run_only_so_many_trials(api: Any) -> None:
    set_quota(api, sweep_trials=5)
    search = (
        "search:\n  metric: test/accuracy\n  mode: max\n  algorithm: random\n"
        "  max_trials: 6\n  max_parallel: 2\n  space:\n"
        "    updater.lr.base: {loguniform: [0.01, 0.3]}\n"
    )
    refused = post(api, "sweeps", MLP + search)
    assert refused.status_code == 403 and "over your quota sweep_trials of 5" in refused.text
    accepted = post(api, "sweeps", MLP + search.replace("max_trials: 6", "max_trials: 5"))
    assert accepted.status_code == 201, accepted.text


def test_get_cluster_shows_the_schedulers_last_plan_without_planning_again(api: Any) -> None:
    first = post(api, "jobs", MLP).json()["id"]
    assert last_plan(api.redis, api.keys) is None
    # A plan that could not come from planning here (no node: every job would say so).
    save_plan(api.redis, api.keys, QueueDecision([], {first: "as the scheduler said"}, [first]))
    second = post(api, "jobs", MLP).json()["id"]
    queue = api.client.get("/api/v1/cluster", headers=api.auth()).json()["queue"]
    assert [(e["job_id"], e["position"], e["reason"]) for e in queue] == [
        (first, 1, "as the scheduler said"),
        (second, 2, NOT_PLANNED),
    ]
