"""GET /jobs/{id}/stream: records written to Redis with the workers' own encoders arrive as
server-sent events while the request is open (a real uvicorn server), job states from SQL."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from contract.keys import Keys
from contract.stream import (
    CheckpointRecord,
    EventRecord,
    JobStream,
    LogRecord,
    MetricRecord,
    StateRecord,
    TimelineRecord,
)
from scheduler.store.lifecycle import transition
from scheduler.store.models import Job
from scheduler.store.states import JobState
from scheduler.store.users import create_token, create_user

ROOT = Path(__file__).resolve().parents[2]
MLP = (ROOT / "examples" / "digits_mlp.yaml").read_text()


def events(response: httpx.Response) -> Iterator[dict[str, Any]]:
    """Parse an event stream: {event, data, id} per event; comments are skipped."""
    event: dict[str, Any] = {}
    for line in response.iter_lines():
        if not line:
            if event:
                yield event
            event = {}
        elif not line.startswith(":"):
            field, _, value = line.partition(": ")
            event[field] = json.loads(value) if field == "data" else value


def move(api: Any, job_id: int, *states: JobState, **fields: Any) -> None:
    with api.db.session() as session:
        job = session.get(Job, job_id)
        for state in states:
            transition(session, job, state, f"test: {state}")
        for key, value in fields.items():
            setattr(job, key, value)


def test_live_records_and_state_changes_arrive_while_the_job_runs(
    api: Any, live_server: Any, tmp_path: Path
) -> None:
    job_id = api.submit(MLP)["id"]
    stream = JobStream(api.redis, api.keys, job_id)
    stream.publish(LogRecord("written before the client came: not replayed"))
    checkpoint = tmp_path / "step-10.safetensors"
    checkpoint.write_bytes(b"0123456789")
    received: list[dict[str, Any]] = []
    with (
        httpx.Client(base_url=live_server.url, timeout=20) as client,
        client.stream("GET", f"/api/v1/jobs/{job_id}/stream", headers=api.auth()) as response,
    ):
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        for event in events(response):
            received.append(event)
            kind = event["event"]
            if kind == "state" and event["data"]["state"] == "QUEUED":
                stream.publish(MetricRecord(10, {"train/loss": 0.5}, time=1.0))
                stream.publish(LogRecord("step 10: loss 0.5", group=0, rank=0))
                stream.publish(MetricRecord(20, {"train/loss": float("nan")}))
                stream.publish(CheckpointRecord.of_file(10, checkpoint))
            elif kind == "checkpoint":
                move(api, job_id, JobState.SCHEDULED, JobState.RUNNING, step=20)
                stream.publish(StateRecord(1, "RUNNING"))
            elif kind == "state" and event["data"]["state"] == "RUNNING":
                stream.publish(StateRecord(1, "DONE", exit_code=0))
                move(api, job_id, JobState.SUCCEEDED, step=2000)
    kinds = [event["event"] for event in received]
    assert kinds == ["state", "metric", "log", "metric", "checkpoint", "state", "state", "end"]
    assert received[0]["data"] == {"state": "QUEUED", "step": 0, "error": None}
    assert received[1]["data"] == {
        "step": 10,
        "group": 0,
        "rank": 0,
        "time": 1.0,
        "values": {"train/loss": 0.5},
    }
    assert received[2]["data"]["line"] == "step 10: loss 0.5"
    assert received[3]["data"]["values"] == {"train/loss": None}  # NaN is not JSON
    assert received[4]["data"]["step"] == 10 and received[4]["data"]["size"] == 10
    assert "path" not in received[4]["data"]
    assert received[5]["data"]["state"] == "RUNNING" and received[5]["data"]["step"] == 20
    assert received[-1]["data"]["state"] == "SUCCEEDED"
    ids = [event.get("id") for event in received]
    stream_ids = [entry[0].decode() for entry in api.redis.xrange(api.keys.job_stream(job_id))]
    assert ids[1:5] == [i for i in stream_ids[1:] if i in ids]  # record events carry their ids
    assert ids[0] is None and ids[-1] is None


def test_resume_after_last_event_id_then_end(api: Any) -> None:
    job_id = api.submit(MLP)["id"]
    stream = JobStream(api.redis, api.keys, job_id)
    for step in (1, 2, 3):
        stream.publish(MetricRecord(step, {"loss": step / 10}))
    move(api, job_id, JobState.CANCELLED)
    first_id = api.redis.xrange(api.keys.job_stream(job_id))[0][0].decode()
    url = f"/api/v1/jobs/{job_id}/stream"
    for how in ({"headers": {"Last-Event-ID": first_id}}, {"params": {"last_event_id": first_id}}):
        headers = {**api.auth(), **how.get("headers", {})}
        with api.client.stream("GET", url, headers=headers, params=how.get("params")) as response:
            received = list(events(response))
        assert [e["event"] for e in received] == ["state", "metric", "metric", "end"]
        assert [e["data"]["step"] for e in received[1:3]] == [2, 3]
    with api.client.stream("GET", url, headers=api.auth()) as response:
        received = list(events(response))
    assert [(e["event"], e["data"]["state"]) for e in received] == [
        ("state", "CANCELLED"),
        ("end", "CANCELLED"),
    ]


def test_a_stages_timeline_goes_out_as_the_pipeline_endpoint_lists_it(api: Any) -> None:
    job_id = api.submit(MLP)["id"]
    record = TimelineRecord(10, (("F", 1, 0.0, 0.5, 2), ("B", 1, 0.75, 1.5, 2)), group=1, rank=2)
    JobStream(api.redis, api.keys, job_id).publish(record)
    move(api, job_id, JobState.CANCELLED)
    url = f"/api/v1/jobs/{job_id}/stream"
    params = {"last_event_id": "0-0"}
    with api.client.stream("GET", url, headers=api.auth(), params=params) as response:
        received = list(events(response))
    assert [e["event"] for e in received] == ["state", "timeline", "end"]
    assert received[1]["data"] == {
        "group": 1,
        "rank": 2,
        "step": 10,
        "events": [
            {"kind": "F", "microbatch": 1, "start": 0.0, "end": 0.5, "piece": 2},
            {"kind": "B", "microbatch": 1, "start": 0.75, "end": 1.5, "piece": 2},
        ],
    }


def test_a_jobs_event_and_its_best_checkpoint_go_out(api: Any, tmp_path: Path) -> None:
    job_id = api.submit(MLP)["id"]
    checkpoint = tmp_path / "step-40.safetensors"
    checkpoint.write_bytes(b"0123")
    stream = JobStream(api.redis, api.keys, job_id)
    stream.publish(CheckpointRecord.of_file(40, checkpoint, best=True))
    stream.publish(EventRecord(60, "stopped early at step 60", time=2.0))
    move(api, job_id, JobState.CANCELLED)
    url = f"/api/v1/jobs/{job_id}/stream"
    with api.client.stream(
        "GET", url, headers=api.auth(), params={"last_event_id": "0-0"}
    ) as response:
        received = list(events(response))
    assert [e["event"] for e in received] == ["state", "checkpoint", "event", "end"]
    assert received[1]["data"]["best"] is True and received[1]["data"]["step"] == 40
    assert received[2]["data"] == {"step": 60, "message": "stopped early at step 60", "time": 2.0}


@pytest.mark.parametrize("bad", ["abc", "1-2-3", "-1", "99999999999999999999-0", "1-" + "9" * 20])
def test_bad_last_event_ids_are_refused(api: Any, bad: str) -> None:
    job_id = api.submit(MLP)["id"]
    response = api.client.get(
        f"/api/v1/jobs/{job_id}/stream", params={"last_event_id": bad}, headers=api.auth()
    )
    assert response.status_code == 422 and "not an event id" in response.json()["detail"]


def test_stream_needs_a_token_and_the_job_to_be_yours(api: Any) -> None:
    job_id = api.submit(MLP)["id"]
    url = f"/api/v1/jobs/{job_id}/stream"
    assert api.client.get(url).status_code == 401
    assert api.client.get(url, headers=api.auth("bob")).status_code == 404
    assert api.client.get("/api/v1/jobs/424242/stream", headers=api.auth()).status_code == 404


@pytest.fixture
def machine_redis() -> Iterator[str]:
    url = "redis://127.0.0.1:6379/0"
    client = redis.Redis.from_url(url, socket_connect_timeout=1)
    try:
        client.ping()
    except redis.ConnectionError:
        pytest.skip("no Redis at 127.0.0.1:6379 on this machine")
    finally:
        client.close()
    yield url


def test_stream_against_the_machines_redis(
    machine_redis: str, tmp_path: Path, migrated_sql_url: str
) -> None:
    from fastapi.testclient import TestClient

    from api.app import create_app
    from contract.settings import Settings
    from scheduler.store.database import Database

    sql_url = migrated_sql_url
    prefix = f"trainyard-test-{uuid.uuid4().hex}"
    settings = Settings(
        data_dir=tmp_path, database_url=sql_url, redis_url=machine_redis, redis_prefix=prefix
    )
    db = Database(sql_url)
    with db.session() as session:
        user = create_user(session, "carol")
        token = create_token(session, user)
    client = redis.Redis.from_url(machine_redis)
    try:
        with TestClient(create_app(settings, web_dist=None)) as api_client:
            auth = {"Authorization": f"Bearer {token}"}
            created = api_client.post(
                "/api/v1/jobs", content=MLP, headers={**auth, "content-type": "text/plain"}
            )
            job_id = created.json()["id"]
            JobStream(client, Keys(prefix), job_id).publish(LogRecord("hello", rank=1))
            cancel = api_client.post(f"/api/v1/jobs/{job_id}/cancel", headers=auth)
            assert cancel.json()["state"] == "CANCELLED"
            assert client.get(Keys(prefix).cancel(job_id)) == b"1"
            with api_client.stream(
                "GET", f"/api/v1/jobs/{job_id}/stream", headers=auth, params={"last_event_id": "0"}
            ) as response:
                received = list(events(response))
            assert [e["event"] for e in received] == ["state", "log", "end"]
            assert received[1]["data"]["rank"] == 1 and received[1]["data"]["line"] == "hello"
    finally:
        for key in client.scan_iter(f"{prefix}:*"):
            client.delete(key)
        client.close()
        db.dispose()
