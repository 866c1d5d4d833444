"""Live streams are bounded (issue 28): a user holds at most `streams_per_user` open (429 past
it, a place freed when one closes), an API process serves at most `stream_connections` from
one Redis pool (503 past it), and a stream closes when the token it was opened with is revoked
or expires. Against a real uvicorn server, on both SQL backends."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import httpx
import pytest

from contract.settings import Settings
from scheduler.store.models import ApiToken, utcnow
from tests.api.test_stream import MLP, events


@pytest.fixture
def api_settings(api_settings: Settings) -> Settings:
    return api_settings.model_copy(update={"streams_per_user": 2, "stream_connections": 3})


def bearer(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


@contextlib.contextmanager
def opened(
    client: httpx.Client, job_id: int, headers: dict[str, str], params: Any = None
) -> Iterator[tuple[httpx.Response, Iterator[dict[str, Any]]]]:
    """An open stream and its events, its first (`state`) already read when it opened."""
    url = f"/api/v1/jobs/{job_id}/stream"
    with client.stream("GET", url, headers=headers, params=params) as response:
        received = events(response) if response.status_code == 200 else iter(())
        if response.status_code == 200:
            assert next(received)["event"] == "state"
        else:
            response.read()
        yield response, received


def test_a_user_holds_a_bounded_number_of_streams(api: Any, live_server: Any) -> None:
    job_id = int(api.submit(MLP)["id"])
    bobs = int(api.submit(MLP, user="bob")["id"])
    with contextlib.ExitStack() as stack:
        client = stack.enter_context(httpx.Client(base_url=live_server.url, timeout=20))
        first, _ = stack.enter_context(opened(client, job_id, api.auth()))
        second, _ = stack.enter_context(opened(client, job_id, api.auth()))
        assert first.status_code == second.status_code == 200
        with opened(client, job_id, api.auth()) as (third, _):
            assert third.status_code == 429, third.text
            assert "streams_per_user" in third.json()["detail"]
            assert third.headers["retry-after"] == "5"
        # bob's allowance is his own; the process serves 3 streams at most.
        bob, _ = stack.enter_context(opened(client, bobs, api.auth("bob")))
        assert bob.status_code == 200
        with opened(client, bobs, api.auth("bob")) as (over, _):
            assert over.status_code == 503 and "stream_connections" in over.json()["detail"]
        # One pool per event loop serving the app (the TestClient's and uvicorn's), not
        # one connection per stream.
        pools = api.app.state.services.stream_redis
        assert len(pools) == 2
        assert {p.connection_pool.max_connections for p in pools.values()} == {3 + 8}
        assert api.app.state.services.streams_open == 3
    # Closed by their clients: the places are free again.
    key = api.keys.open_streams(api.user_ids["alice"])
    deadline = time.monotonic() + 10
    while (api.app.state.services.streams_open or api.redis.zcard(key)) and (
        time.monotonic() < deadline
    ):
        time.sleep(0.05)
    assert api.app.state.services.streams_open == 0
    assert api.redis.zcard(key) == 0
    with (
        httpx.Client(base_url=live_server.url, timeout=20) as client,
        opened(client, job_id, api.auth()) as (again, _),
    ):
        assert again.status_code == 200


def closing_event(received: Iterator[dict[str, Any]], within: float) -> dict[str, Any]:
    deadline = time.monotonic() + within
    for event in received:
        if event["event"] == "closed":
            return event
        assert time.monotonic() < deadline, "the stream stayed open"
    raise AssertionError("the stream ended without a closed event")


def test_a_stream_closes_when_its_token_is_revoked(api: Any, live_server: Any) -> None:
    job_id = int(api.submit(MLP)["id"])
    made = api.client.post("/api/v1/tokens", json={"name": "watcher"}, headers=api.auth()).json()
    with (
        httpx.Client(base_url=live_server.url, timeout=20) as client,
        opened(client, job_id, bearer(made["token"])) as (response, received),
    ):
        assert response.status_code == 200
        revoked = api.client.delete(f"/api/v1/tokens/{made['id']}", headers=api.auth())
        assert revoked.status_code == 204
        event = closing_event(received, within=5)
        assert event["data"]["reason"].endswith("was revoked")
        assert list(received) == []  # and then it closed


def test_a_stream_closes_when_its_token_expires(api: Any, live_server: Any) -> None:
    job_id = int(api.submit(MLP)["id"])
    made = api.client.post("/api/v1/tokens", json={"name": "brief"}, headers=api.auth()).json()
    with api.db.session() as session:
        session.get(ApiToken, made["id"]).expires_at = utcnow() + timedelta(seconds=2)
    with (
        httpx.Client(base_url=live_server.url, timeout=20) as client,
        opened(client, job_id, bearer(made["token"])) as (response, received),
    ):
        assert response.status_code == 200
        assert closing_event(received, within=6)["data"]["reason"].endswith("expired")


def test_a_ticket_of_a_revoked_token_opens_nothing_and_its_stream_closes(
    api: Any, live_server: Any
) -> None:
    job_id = int(api.submit(MLP)["id"])
    made = api.client.post("/api/v1/tokens", json={"name": "browser"}, headers=api.auth()).json()

    def ticket() -> str:
        answer = api.client.post(
            f"/api/v1/jobs/{job_id}/stream-ticket", headers=bearer(made["token"])
        )
        assert answer.status_code == 200, answer.text
        return str(answer.json()["ticket"])

    unused = ticket()
    with (
        httpx.Client(base_url=live_server.url, timeout=20) as client,
        opened(client, job_id, {}, params={"ticket": ticket()}) as (response, received),
    ):
        assert response.status_code == 200
        api.client.delete(f"/api/v1/tokens/{made['id']}", headers=api.auth())
        assert closing_event(received, within=5)["data"]["reason"].endswith("was revoked")
        with opened(client, job_id, {}, params={"ticket": unused}) as (refused, _):
            assert refused.status_code == 401
