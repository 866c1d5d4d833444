"""The /jobs endpoints in-process, against real SQL (both backends) and the session's Redis."""

from __future__ import annotations

import io
import json
import math
import tarfile
import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from contract.allocation import AllocationState
from dsl import compiler
from scheduler.admission import checks as admission_checks
from scheduler.store.lifecycle import transition
from scheduler.store.models import Allocation, CheckpointRecord, Job, LogLine, Metric, Node
from scheduler.store.states import JobState, NodeState

ROOT = Path(__file__).resolve().parents[2]
MLP = (ROOT / "examples" / "digits_mlp.yaml").read_text()
CNN = (ROOT / "examples" / "mnist1d_cnn.yaml").read_text()


def set_state(api: Any, job_id: int, *states: JobState, **fields: Any) -> None:
    """Move a job as the scheduler and ingester would (they are not running here)."""
    with api.db.session() as session:
        job = session.get(Job, job_id)
        for state in states:
            transition(session, job, state, f"test: {state}")
        for key, value in fields.items():
            setattr(job, key, value)


def add_node(api: Any, name: str = "node-a", slots: int = 4, gpus: int = 0) -> int:
    with api.db.session() as session:
        node = Node(name=name, queue=f"q.{name}", slots=slots, gpus=gpus, state=NodeState.ALIVE)
        session.add(node)
        session.flush()
        return node.id


def test_submit_yaml_returns_the_queued_job(api: Any) -> None:
    job = api.submit(MLP, priority=-4)
    assert job["state"] == "QUEUED" and job["name"] == "digits-mlp"
    assert job["owner"] == "alice" and job["priority"] == -4 and job["queue_position"] == 1
    assert job["train_steps"] == 2000 and job["progress"] == 0.0 and job["step"] == 0
    assert job["topology"]["workers"] == 1 and job["framework"] == "local"
    assert job["spec_yaml"] == MLP and job["duration_seconds"] is None
    with api.db.session() as session:
        stored = session.get(Job, job["id"])
        assert stored.spec["data"] == {"source": "digits", "batch_size": 64, "test_fraction": 0.2}
        assert stored.spec_yaml == MLP


def test_submit_json_with_overrides_and_a_mapping_spec(api: Any) -> None:
    response = api.client.post(
        "/api/v1/jobs",
        json={"spec": MLP, "overrides": {"train_steps": 30, "neuralnet.layers.fc1.units": 32}},
        headers=api.auth(),
    )
    assert response.status_code == 201, response.text
    job = response.json()
    assert job["train_steps"] == 30 and job["overrides"]["train_steps"] == 30
    graph = api.client.get(f"/api/v1/jobs/{job['id']}/graph", headers=api.auth()).json()
    fc1 = next(node for node in graph["nodes"] if node["name"] == "fc1")
    assert fc1["out_shape"] == [32] and fc1["params"] == 64 * 32 + 32

    mapping = {
        "name": "from-json",
        "data": {"source": "synthetic", "task": "images", "image_size": 8},
        "neuralnet": {
            "layers": [
                {"name": "x", "type": "input"},
                {"name": "flat", "type": "flatten", "srclayers": ["x"]},
                {"name": "fc", "type": "innerproduct", "srclayers": ["flat"], "units": 4},
                {"name": "loss", "type": "softmax_loss", "srclayers": ["fc"]},
            ]
        },
        "updater": {"type": "sgd", "lr": {"base": 0.1}},
        "train_steps": 10,
    }
    response = api.client.post(
        "/api/v1/jobs", json={"spec": mapping, "priority": -2}, headers=api.auth()
    )
    assert response.status_code == 201, response.text
    body = response.json()
    assert body["priority"] == -2 and "name: from-json" in body["spec_yaml"]
    with api.db.session() as session:
        # only the keys written: the synthetic source's task checks stay satisfied on reload
        assert session.get(Job, body["id"]).spec["data"] == mapping["data"]


def test_a_job_shows_its_overrides_and_the_document_they_made(api: Any) -> None:
    overrides = {"train_steps": 400, "neuralnet.layers.fc1.units": 32}
    response = api.client.post(
        "/api/v1/jobs", json={"spec": MLP, "overrides": overrides}, headers=api.auth()
    )
    assert response.status_code == 201, response.text
    job = api.client.get(f"/api/v1/jobs/{response.json()['id']}", headers=api.auth()).json()
    assert job["spec_yaml"] == MLP and "train_steps: 2000" in MLP
    assert job["overrides"] == overrides and job["train_steps"] == 400
    effective = job["effective_yaml"].splitlines()
    lines = job["override_lines"]
    assert set(lines) == set(overrides)
    assert effective[lines["train_steps"] - 1] == "train_steps: 400"
    assert effective[lines["neuralnet.layers.fc1.units"] - 1].strip() == "units: 32"
    # the line marked is fc1's own, not another layer's units
    above = effective[: lines["neuralnet.layers.fc1.units"]]
    assert [line.strip() for line in above if "name:" in line][-1] == "- name: fc1"

    plain = api.submit(MLP)  # no overrides: the document itself, its comments kept
    shown = api.client.get(f"/api/v1/jobs/{plain['id']}", headers=api.auth()).json()
    assert (shown["effective_yaml"], shown["override_lines"]) == (MLP, {})


def test_a_job_is_stored_with_its_objective_and_warned_of_test_selection(api: Any) -> None:
    job = api.submit(MLP)
    assert (job["objective"], job["objective_mode"], job["best_metric"], job["best_step"]) == (
        "test/accuracy",
        "max",
        None,
        None,
    )
    assert job["warnings"] == []
    held_out = api.submit(MLP.replace("source: digits", "validation_fraction: 0.1, source: digits"))
    assert held_out["objective"] == "val/accuracy"
    with api.db.session() as session:
        stored = session.get(Job, held_out["id"])
        assert stored.spec["objective"] == {"metric": "val/accuracy", "mode": "max"}
    response = api.client.post(
        "/api/v1/jobs",
        json={"spec": MLP, "overrides": {"checkpoint.keep_best": True}},
        headers=api.auth(),
    )
    assert response.status_code == 201, response.text
    kept = response.json()
    assert kept["warnings"] == [
        "checkpoint.keep_best keeps the best test/accuracy: selecting a checkpoint on the test "
        "split biases its score; add data.validation_fraction and use val/..."
    ]
    detail = api.client.get(f"/api/v1/jobs/{kept['id']}", headers=api.auth()).json()
    assert detail["warnings"] == kept["warnings"]


def test_validate_shows_layers_topology_and_placement(api: Any) -> None:
    url = "/api/v1/jobs/validate"
    response = api.client.post(url, content=CNN, headers=api.yaml_headers())
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["name"] == "mnist1d-cnn" and body["total_params"] == sum(
        layer["params"] for layer in body["layers"]
    )
    assert body["layers"][0]["out_shape"] == [1, 40]
    assert body["pipeline"] is None
    assert body["placement"] == {
        "feasible": False,
        "reason": body["placement"]["reason"],
        "assignments": [],
    }
    assert "no node agent" in body["placement"]["reason"]

    add_node(api, "node-a", slots=2)
    placed = api.client.post(url, content=CNN, headers=api.yaml_headers()).json()["placement"]
    assert placed["feasible"] is True
    assert placed["assignments"] == [
        {"role": "worker", "group": 0, "rank": 0, "node": "node-a", "slots": 1, "gpus": 0}
    ]
    big = api.client.post(
        url,
        json={
            "spec": CNN,
            "overrides": {"cluster.framework": "downpour", "cluster.nworker_groups": 4},
        },
        headers=api.auth(),
    ).json()
    assert big["topology"]["workers"] == 4 and big["topology"]["servers"] == 1
    assert big["placement"]["feasible"] is False
    assert "can never run" in big["placement"]["reason"]
    assert api.counts()[0] == 0  # validation stores nothing


def test_list_filters_pages_and_hides_other_users_jobs(api: Any) -> None:
    ids = [api.submit(MLP.replace("digits-mlp", f"mlp-{i}"))["id"] for i in range(5)]
    api.submit(MLP, user="bob")
    set_state(api, ids[0], JobState.CANCELLED)
    seen: list[int] = []
    cursor = None
    while True:
        params: dict[str, Any] = {"limit": 2}
        if cursor:
            params["cursor"] = cursor
        page = api.client.get("/api/v1/jobs", params=params, headers=api.auth()).json()
        seen += [item["id"] for item in page["items"]]
        assert all("spec_yaml" not in item for item in page["items"])
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == ids[::-1]
    queued = api.client.get(
        "/api/v1/jobs", params={"state": ["QUEUED", "RUNNING"]}, headers=api.auth()
    ).json()["items"]
    # fair share: bob's job takes its turn after alice's first one
    assert [item["queue_position"] for item in queued] == [5, 4, 3, 1]
    named = api.client.get("/api/v1/jobs", params={"name": "mlp-3"}, headers=api.auth()).json()
    assert [item["id"] for item in named["items"]] == [ids[3]]
    everyone = api.client.get("/api/v1/jobs", headers=api.auth("admin")).json()["items"]
    assert len(everyone) == 6 and {item["owner"] for item in everyone} == {"alice", "bob"}


def test_listed_jobs_are_their_detail_views(api: Any) -> None:
    """The database writes the list's items (scheduler/store/job_page.py) and Python the detail view
    (job_fields): on both backends they agree field by field, for jobs in every kind of state."""
    from datetime import UTC, datetime

    from api.schemas import JobOut

    started = datetime(2026, 11, 23, 10, 0, 0, tzinfo=UTC)  # no microseconds
    ids = [api.submit(MLP.replace("digits-mlp", name))["id"] for name in ("a", "b_1.x", "c", "d")]
    low = api.submit(MLP.replace("digits-mlp", "queued-later"), priority=-2)["id"]
    high = api.submit(MLP.replace("digits-mlp", "queued-first"), priority=-1)["id"]
    set_state(
        api,
        ids[0],
        JobState.SCHEDULED,
        JobState.RUNNING,
        JobState.SUCCEEDED,
        step=2000,
        summary={"test/accuracy": 0.9583333333333334, "train/loss": 0.1234567890123},
        best_metric=0.9583333333333334,
        started_at=started,
        ended_at=datetime(2026, 11, 23, 10, 1, 2, 345678, tzinfo=UTC),
    )
    set_state(
        api,
        ids[1],
        JobState.SCHEDULED,
        JobState.RUNNING,
        JobState.FAILED,
        error='worker 1 exited: "CUDA" \\ \n ünïcode',
        started_at=started,
        ended_at=started,
    )
    set_state(api, ids[2], JobState.SCHEDULED, JobState.RUNNING, step=2500, cancel_requested=True)
    set_state(api, ids[3], JobState.SCHEDULED, overrides={"updater": {"lr": [0.1, 1e-05]}})

    page = api.client.get("/api/v1/jobs", headers=api.auth())
    assert page.status_code == 200 and page.headers["content-type"] == "application/json"
    listed = {item["id"]: JobOut.model_validate(item) for item in page.json()["items"]}
    assert list(listed) == sorted(listed, reverse=True) and len(listed) == 6
    for job_id, item in listed.items():
        detail = api.client.get(f"/api/v1/jobs/{job_id}", headers=api.auth()).json()
        expected = JobOut.model_validate(detail)
        assert item.model_dump(exclude={"duration_seconds"}) == expected.model_dump(
            exclude={"duration_seconds"}
        ), job_id
        if expected.duration_seconds is None:
            assert item.duration_seconds is None
        else:  # a running job's duration runs on between the two requests
            assert item.duration_seconds == pytest.approx(expected.duration_seconds, abs=2.0)
    assert listed[ids[0]].duration_seconds == pytest.approx(62.345678, abs=1e-3)
    assert listed[ids[1]].duration_seconds == 0.0 and listed[ids[1]].error is not None
    assert listed[ids[2]].progress == 1.0 and listed[ids[2]].cancel_requested
    assert [listed[high].queue_position, listed[low].queue_position] == [1, 2]


def test_get_cancel_and_delete(api: Any, tmp_path: Path) -> None:
    queued = api.submit(MLP)["id"]
    running = api.submit(MLP)["id"]
    set_state(api, running, JobState.SCHEDULED, JobState.RUNNING, step=500)
    detail = api.client.get(f"/api/v1/jobs/{running}", headers=api.auth()).json()
    assert detail["state"] == "RUNNING" and detail["progress"] == 0.25
    assert detail["queue_position"] is None and detail["duration_seconds"] >= 0

    response = api.client.post(f"/api/v1/jobs/{queued}/cancel", headers=api.auth())
    assert response.status_code == 200 and response.json()["state"] == "CANCELLED"
    response = api.client.post(f"/api/v1/jobs/{running}/cancel", headers=api.auth())
    assert response.json()["state"] == "RUNNING" and response.json()["cancel_requested"]
    assert api.redis.get(api.keys.cancel(running)) == b"1"
    again = api.client.post(f"/api/v1/jobs/{queued}/cancel", headers=api.auth())
    assert again.status_code == 409 and "already CANCELLED" in again.json()["detail"]

    refused = api.client.delete(f"/api/v1/jobs/{running}", headers=api.auth())
    assert refused.status_code == 409
    deleted = api.client.delete(f"/api/v1/jobs/{queued}", headers=api.auth())
    assert deleted.status_code == 204 and deleted.content == b""
    assert api.client.get(f"/api/v1/jobs/{queued}", headers=api.auth()).status_code == 404
    events = api.client.get(f"/api/v1/jobs/{running}/events", headers=api.auth()).json()
    assert [e["state"] for e in events] == ["QUEUED", "SCHEDULED", "RUNNING"]
    assert events[0]["reason"] == "submitted"


def test_metrics_logs_and_names(api: Any) -> None:
    job_id = api.submit(MLP)["id"]
    with api.db.session() as session:
        session.add_all(
            Metric(job_id=job_id, name="train/loss", step=s, value=1 / (s + 1), at=time.time())
            for s in range(0, 3000, 10)
        )
        session.add(Metric(job_id=job_id, name="test/accuracy", step=500, value=0.5, at=0.0))
        session.add(Metric(job_id=job_id, name="test/accuracy", step=1000, value=math.inf, at=0.0))
        session.add_all(LogLine(job_id=job_id, at=float(i), line=f"line {i}") for i in range(7))
    base = f"/api/v1/jobs/{job_id}"
    names = api.client.get(f"{base}/metrics/names", headers=api.auth()).json()
    assert names == {"names": ["test/accuracy", "train/loss"]}
    series = api.client.get(
        f"{base}/metrics", params={"name": "train/loss", "max_points": 50}, headers=api.auth()
    ).json()["series"]
    assert len(series) == 1 and len(series[0]["points"]) == 50
    assert series[0]["points"][-1] == [2990, pytest.approx(1 / 2991)]
    ranged = api.client.get(
        f"{base}/metrics",
        params={"name": ["test/accuracy"], "start_step": 600, "end_step": 1000},
        headers=api.auth(),
    ).json()["series"]
    assert ranged == [{"name": "test/accuracy", "group": 0, "rank": 0, "points": [[1000, None]]}]
    first = api.client.get(f"{base}/logs", params={"limit": 4}, headers=api.auth()).json()
    assert [ln["line"] for ln in first["lines"]] == [f"line {i}" for i in range(4)]
    rest = api.client.get(f"{base}/logs", params={"after": first["next"]}, headers=api.auth())
    assert [ln["line"] for ln in rest.json()["lines"]] == [f"line {i}" for i in range(4, 7)]
    # The same records as files, the owner's only.
    points = api.client.get(f"{base}/metrics.csv", headers=api.auth())
    assert points.status_code == 200 and points.headers["content-type"].startswith("text/csv")
    rows = points.text.splitlines()
    assert rows[0] == "step,time,name,group,rank,value" and len(rows) == 1 + 302
    assert "1000,0.0,test/accuracy,0,0,inf" in rows
    log = api.client.get(f"{base}/logs.txt", headers=api.auth())
    assert log.text == "".join(f"line {i}\n" for i in range(7))
    events = api.client.get(f"{base}/tensorboard", headers=api.auth())  # not started: none yet
    with tarfile.open(fileobj=io.BytesIO(events.content)) as tar:
        assert tar.getnames() == []
    for name in ("metrics.csv", "logs.txt", "tensorboard"):
        assert api.client.get(f"{base}/{name}", headers=api.auth("bob")).status_code == 404


def test_graph_nodes_and_edges(api: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The graph admission stored is served: the job is not compiled again (calls of the
    language's compiler counted while it is read), and it is what validation shows."""
    job_id = api.submit(CNN)["id"]
    compiled: list[object] = []
    original = compiler.compile_job

    def counted(*args: Any, **kwargs: Any) -> Any:
        compiled.append(args[0])
        return original(*args, **kwargs)

    monkeypatch.setattr(compiler, "compile_job", counted)
    monkeypatch.setattr(admission_checks, "compile_job", counted)
    graph = api.client.get(f"/api/v1/jobs/{job_id}/graph", headers=api.auth()).json()
    assert compiled == []
    with api.db.session() as session:  # a job stored before graphs were: compiled once, here
        old = session.get(Job, job_id)
        assert old is not None and old.graph == graph
        old.graph = None
    assert api.client.get(f"/api/v1/jobs/{job_id}/graph", headers=api.auth()).json() == graph
    assert len(compiled) == 1
    names = [node["name"] for node in graph["nodes"]]
    assert names[0] == "data" and len(names) == len(set(names))
    edges = {(e["source"], e["target"]) for e in graph["edges"]}
    assert all(source in names and target in names for source, target in edges)
    validated = api.client.post(
        "/api/v1/jobs/validate", content=CNN, headers=api.yaml_headers()
    ).json()
    assert [n["out_shape"] for n in graph["nodes"]] == [
        layer["out_shape"] for layer in validated["layers"]
    ]
    assert sum(n["params"] for n in graph["nodes"]) == validated["total_params"]
    # cached: a second call answers the same
    assert api.client.get(f"/api/v1/jobs/{job_id}/graph", headers=api.auth()).json() == graph


def test_checkpoints_list_and_download(api: Any, tmp_path: Path) -> None:
    job_id = api.submit(MLP)["id"]
    path = api.settings.artifacts() / "jobs" / str(job_id) / "step-100.safetensors"
    path.parent.mkdir(parents=True)  # checkpoints are served from the artifact directory only
    path.write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ")
    best = path.with_name("step-60.safetensors")
    best.write_bytes(path.read_bytes())
    with api.db.session() as session:
        session.add(CheckpointRecord(job_id=job_id, step=100, path=str(path), size=16))
        session.add(CheckpointRecord(job_id=job_id, step=60, path=str(best), size=16, best=True))
    base = f"/api/v1/jobs/{job_id}/checkpoints"
    listed = api.client.get(base, headers=api.auth()).json()
    assert [(c["step"], c["size"], c["best"]) for c in listed] == [(60, 16, True), (100, 16, False)]
    download = api.client.get(f"{base}/100", headers=api.auth())
    assert download.status_code == 200 and download.content == path.read_bytes()
    assert "step100.safetensors" in download.headers["content-disposition"]
    missing = api.client.get(f"{base}/200", headers=api.auth())
    assert missing.status_code == 404 and "step 200" in missing.json()["detail"]


def test_cluster_shows_nodes_running_processes_and_the_queue(api: Any) -> None:
    node_id = add_node(api, "node-a", slots=2)
    running = api.submit(MLP)["id"]
    set_state(api, running, JobState.SCHEDULED, JobState.RUNNING)
    with api.db.session() as session:
        session.add(
            Allocation(
                job_id=running, node_id=node_id, role="worker", state=AllocationState.RUNNING
            )
        )
    big = api.client.post(
        "/api/v1/jobs",
        json={
            "spec": MLP,
            "overrides": {"cluster.framework": "allreduce", "cluster.nworkers_per_group": 2},
        },
        headers=api.auth("bob"),
    ).json()["id"]
    small = api.submit(MLP)["id"]
    view = api.client.get("/api/v1/cluster", headers=api.auth()).json()
    (node,) = view["nodes"]
    assert (node["name"], node["slots"], node["slots_used"], node["state"]) == (
        "node-a",
        2,
        1,
        "ALIVE",
    )
    assert view["running"] == [
        {
            "job_id": running,
            "name": "digits-mlp",
            "state": "RUNNING",
            "allocations": [
                {"node": "node-a", "role": "worker", "group": 0, "rank": 0, "state": "RUNNING"}
            ],
        }
    ]
    queue = view["queue"]
    assert [entry["position"] for entry in queue] == [1, 2]
    assert queue[0]["job_id"] is None and queue[0]["name"] is None  # bob's, seen by alice
    assert queue[0]["slots"] == 2 and "free resources" in queue[0]["reason"]
    # alice's job waits behind bob's, whose id she is not shown.
    assert queue[1]["job_id"] == small and queue[1]["reason"] == "waiting behind another user's job"
    admin = api.client.get("/api/v1/cluster", headers=api.auth("admin")).json()
    assert admin["queue"][0]["job_id"] == big
    assert admin["queue"][1]["reason"] == f"waiting behind job {big}"
    bobs = api.client.get("/api/v1/cluster", headers=api.auth("bob")).json()
    assert bobs["queue"][0]["job_id"] == big and bobs["queue"][1]["job_id"] is None


def test_others_waiting_reasons_show_no_ids_or_quota_use() -> None:
    from api.routes.cluster import visible_reason

    def mine(job_id: int) -> bool:
        return job_id == 7

    quota = "waiting for its owner's quota slots: 6 of 8 held, needs 4"
    assert visible_reason(quota, False, mine) == "waiting for its owner's quota"
    assert visible_reason(quota, True, mine) == quota
    assert visible_reason("waiting behind job 7", False, mine) == "waiting behind another job"
    assert visible_reason("waiting behind job 9", True, mine) == (
        "waiting behind another user's job"
    )
    assert visible_reason("waiting behind job 7", True, mine) == "waiting behind job 7"
    free = "waiting for free resources: needs 2 worker(s): 2 slot(s)"
    assert visible_reason(free, False, mine) == free


def test_health_and_prometheus_metrics(api: Any) -> None:
    for path in ("/healthz", "/api/v1/healthz"):
        response = api.client.get(path)
        assert response.status_code == 200
        never = {"last_pass_seconds_ago": None, "alive": True}  # no scheduler in this test
        assert response.json() == {
            "status": "ok",
            "db": True,
            "redis": True,
            "scheduler": never,
            "ingest": never,
        }
    # A scheduler whose loop passed a minute ago is past the liveness timeout: degraded.
    api.redis.hset(api.keys.liveness, "schedule", repr(time.time() - 60))
    api.redis.hset(api.keys.liveness, "ingest", repr(time.time()))
    health = api.client.get("/healthz").json()
    assert health["status"] == "degraded" and health["scheduler"]["alive"] is False
    assert health["ingest"]["alive"] is True and health["ingest"]["last_pass_seconds_ago"] < 5
    api.redis.delete(api.keys.liveness)
    api.submit(MLP)
    add_node(api, "node-a", slots=3)
    api.redis.set(f"{api.keys.prefix}:stats:ingested_points", 1234)
    text = api.client.get("/api/v1/metrics", headers=api.auth()).text
    assert 'trainyard_jobs{state="QUEUED"} 1.0' in text
    assert 'trainyard_nodes{state="ALIVE"} 1.0' in text
    assert 'trainyard_slots{use="total"} 3.0' in text
    assert "trainyard_ingested_points_total 1234.0" in text
    assert "trainyard_queue_length 1.0" in text
    assert api.client.get("/metrics", headers=api.auth()).text.startswith("# HELP")


def test_openapi_document_is_complete(api: Any) -> None:
    doc = api.client.get("/api/v1/openapi.json").json()
    expected = {
        ("post", "/api/v1/jobs"),
        ("post", "/api/v1/jobs/validate"),
        ("get", "/api/v1/jobs"),
        ("get", "/api/v1/jobs/{job_id}"),
        ("post", "/api/v1/jobs/{job_id}/cancel"),
        ("delete", "/api/v1/jobs/{job_id}"),
        ("get", "/api/v1/jobs/{job_id}/metrics"),
        ("get", "/api/v1/jobs/{job_id}/metrics/names"),
        ("get", "/api/v1/jobs/{job_id}/logs"),
        ("get", "/api/v1/jobs/{job_id}/events"),
        ("get", "/api/v1/jobs/{job_id}/graph"),
        ("get", "/api/v1/jobs/{job_id}/pipeline"),
        ("get", "/api/v1/jobs/{job_id}/checkpoints"),
        ("get", "/api/v1/jobs/{job_id}/checkpoints/{step}"),
        ("get", "/api/v1/jobs/{job_id}/stream"),
        ("get", "/api/v1/jobs/{job_id}/export"),
        ("post", "/api/v1/models"),
        ("get", "/api/v1/models"),
        ("get", "/api/v1/models/{name}/{which}"),
        ("get", "/api/v1/models/{name}/{which}/checkpoint"),
        ("get", "/api/v1/models/{name}/{which}/export"),
        ("post", "/api/v1/models/{name}/{version}/tags"),
        ("delete", "/api/v1/models/{name}/{version}/tags/{tag}"),
        ("delete", "/api/v1/models/{name}/{version}"),
        ("get", "/api/v1/cluster"),
        ("post", "/api/v1/datasets"),
        ("get", "/api/v1/datasets"),
        ("get", "/api/v1/healthz"),
        ("get", "/api/v1/metrics"),
    }
    found = {(method, path) for path, item in doc["paths"].items() for method in item}
    assert expected <= found
    for method, path in found:
        operation = doc["paths"][path][method]
        assert operation.get("summary"), (method, path)
        success = [code for code in operation["responses"] if code.startswith("2")]
        assert len(success) == 1, (method, path)
        if path != "/api/v1/healthz":
            assert "401" in operation["responses"], (method, path)
            assert operation.get("security") == [{"token": []}], (method, path)
        for code, response in operation["responses"].items():
            if code.startswith("4"):
                schema = response["content"]["application/json"]["schema"]
                assert schema == {"$ref": "#/components/schemas/ErrorBody"}, (method, path)
    submit = doc["paths"]["/api/v1/jobs"]["post"]["requestBody"]["content"]
    # The YAML as the file's bytes (a type generators know), the JSON form as a named schema.
    assert set(submit) == {"application/octet-stream", "application/json"}
    assert submit["application/json"]["schema"] == {"$ref": "#/components/schemas/SubmitRequest"}
    assert json.dumps(doc)  # serialisable as a whole
    # the state enum is documented on the job model
    assert doc["components"]["schemas"]["JobState"]["enum"][0] == "QUEUED"


def test_job_rows_are_not_touched_by_reads(api: Any) -> None:
    job_id = api.submit(MLP)["id"]
    before = api.counts()
    for path in ("", "/metrics", "/logs", "/events", "/graph", "/checkpoints"):
        assert api.client.get(f"/api/v1/jobs/{job_id}{path}", headers=api.auth()).is_success
    assert api.counts() == before
    with api.db.session() as session:
        assert session.scalar(select(Job.state).where(Job.id == job_id)) == "QUEUED"
