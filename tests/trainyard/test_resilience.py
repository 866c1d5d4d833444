"""The SDK against real local HTTP servers that misbehave: 503/429 with Retry-After (retried,
waiting what the server said; a submission never sent twice), a live stream that drops its
connection (resumed with Last-Event-ID), and the named server profiles it connects through."""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from contract.settings import Settings
from scheduler.cli.redis_server import free_port
from trainyard import Client, Job
from trainyard.connection import resolve_connection, save_login
from trainyard.errors import ServerError, TrainyardError, Unreachable
from trainyard.models import JobOut
from trainyard.streaming import stream_events

Answer = tuple[int, dict[str, str], bytes]


@contextmanager
def serving(
    answer: Callable[[BaseHTTPRequestHandler, int], Answer],
) -> Iterator[tuple[int, list[float]]]:
    """A real HTTP server on a free port whose n-th request (from 0) gets answer(handler, n);
    yields its port and the times the requests arrived."""
    seen: list[float] = []

    class Handler(BaseHTTPRequestHandler):
        def _reply(self) -> None:
            # A stream's body ends when the connection closes (HTTP/1.0, no length).
            seen.append(time.monotonic())
            status, headers, body = answer(self, len(seen) - 1)
            self.send_response(status)
            for key, value in headers.items():
                self.send_header(key, value)
            if headers.get("Content-Type") != "text/event-stream":
                self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = do_DELETE = _reply

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1], seen
    finally:
        server.shutdown()
        server.server_close()


OK: Answer = (200, {"Content-Type": "application/json"}, b'{"names": ["train/loss"]}')
BUSY = json.dumps({"detail": "busy", "errors": []}).encode()


def _client(port: int, retries: int = 5) -> Client:
    return Client(f"http://127.0.0.1:{port}", "t", retries=retries)


@pytest.mark.parametrize("status", [503, 429])
def test_idempotent_requests_wait_what_retry_after_says(status: int) -> None:
    with serving(_busy_twice(status)) as (port, seen), _client(port) as client:
        assert client.get_json("/jobs/1/metrics/names") == {"names": ["train/loss"]}
    assert len(seen) == 3
    gaps = [later - earlier for earlier, later in itertools.pairwise(seen)]
    assert all(gap >= 0.9 for gap in gaps), gaps  # Retry-After: 1


def test_a_submission_is_never_sent_twice() -> None:
    with (
        serving(_busy_twice(503)) as (port, seen),
        _client(port) as client,
        pytest.raises(ServerError, match="503 busy"),
    ):
        client.request("POST", "/jobs", json={"spec": "name: x"})
    assert len(seen) == 1


def test_retries_run_out_and_say_so() -> None:
    with (
        serving(_busy_twice(503)) as (port, seen),
        _client(port, retries=1) as client,
        pytest.raises(ServerError, match="503"),
    ):
        client.get_json("/cluster")
    assert len(seen) == 2


def test_a_server_that_is_not_there_is_retried_then_unreachable() -> None:
    with _client(free_port(), retries=2) as client, pytest.raises(Unreachable):
        client.get_json("/cluster")


def _busy_twice(status: int) -> Callable[[BaseHTTPRequestHandler, int], Answer]:
    def answer(_: BaseHTTPRequestHandler, n: int) -> Answer:
        if n < 2:
            return status, {"Retry-After": "1", "Content-Type": "application/json"}, BUSY
        return OK

    return answer


# -- the live stream --------------------------------------------------------------------------
def _event(name: str, data: dict[str, object], event_id: str | None = None) -> str:
    head = f"id: {event_id}\n" if event_id else ""
    return f"{head}event: {name}\ndata: {json.dumps(data)}\n\n"


def _log(line: str, at: float) -> dict[str, object]:
    return {"line": line, "group": 0, "rank": 0, "time": at}


def test_a_dropped_stream_resumes_after_the_last_event() -> None:
    resumed_after: list[str | None] = []

    def answer(handler: BaseHTTPRequestHandler, n: int) -> Answer:
        running = {"state": "RUNNING", "step": 3, "error": None}
        if n == 0:  # a state and a line, then the connection drops (no `end`)
            body = _event("state", running) + _event("log", _log("one", 1.0), "5-0")
        else:
            resumed_after.append(handler.headers.get("Last-Event-ID"))
            body = (
                _event("state", running)
                + _event("log", _log("two", 2.0), "6-0")
                + _event("end", {"state": "SUCCEEDED", "step": 4, "error": None})
            )
        return 200, {"Content-Type": "text/event-stream"}, body.encode()

    with serving(answer) as (port, seen), _client(port) as client:
        events = list(client_job(client, 7).stream())
    assert len(seen) == 2 and resumed_after == ["5-0"]
    assert [e.event for e in events] == ["state", "log", "state", "log", "end"]
    assert [json.loads(e.data)["line"] for e in events if e.event == "log"] == ["one", "two"]


def test_a_stream_that_never_comes_back_gives_up() -> None:
    def answer(_: BaseHTTPRequestHandler, n: int) -> Answer:
        return 200, {"Content-Type": "text/event-stream"}, b": nothing\n\n"

    with (
        serving(answer) as (port, seen),
        _client(port) as client,
        pytest.raises(TrainyardError, match="kept closing"),
    ):
        list(stream_events(client, 7, max_reconnects=2))
    assert len(seen) == 3


def client_job(client: Client, job_id: int) -> Job:
    """A Job handle without asking the server for it."""
    info = JobOut.model_construct(id=job_id, name="j", state="RUNNING", step=0)
    return Job(client, info)


# -- profiles ---------------------------------------------------------------------------------
def test_profiles_name_their_servers(tmp_path: Path) -> None:
    base = Settings(data_dir=tmp_path)
    save_login(base, "http://default", "d", None)
    save_login(base, "http://lab", "l", "lab")
    save_login(base, "http://prod", "p", "prod")
    assert resolve_connection(base).model_dump() == {"url": "http://default", "token": "d"}
    lab = Settings(data_dir=tmp_path, profile="lab", url="http://env", token="e")
    assert resolve_connection(lab).model_dump() == {"url": "http://lab", "token": "l"}
    with pytest.raises(TrainyardError, match=r"no profile 'prd'; did you mean 'prod'\?"):
        resolve_connection(Settings(data_dir=tmp_path, profile="prd"))
    with pytest.raises(TrainyardError, match="profile name"):
        save_login(base, "http://x", "x", "../etc")
    assert (tmp_path / "client.json").stat().st_mode & 0o777 == 0o600
