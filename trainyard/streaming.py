"""Following a job live: its server-sent event stream (GET /jobs/{id}/stream), read with
httpx-sse, reconnecting after a dropped connection with Last-Event-ID so nothing is lost or
repeated.

    for event in job.stream():                 # ServerSentEvent: event, data, id
        if event.event == "metric": ...
    for line in job.follow_logs():             # the stored lines, then new ones as they come
        print(line.line)
"""

from __future__ import annotations

import json
import re
import time
from collections import deque
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import httpx
from httpx_sse import ServerSentEvent, SSEError, connect_sse

from trainyard.errors import AuthError, TrainyardError, Unreachable, raise_for_response
from trainyard.models import LogLineOut

if TYPE_CHECKING:
    from trainyard.client import Client

# The server sends a keep-alive comment every 15 s: a read that waits longer lost the connection.
READ_TIMEOUT = 60.0
# Reconnections in a row without an event in between before giving up, and the waits between.
MAX_RECONNECTS = 8
RECONNECT_WAIT = 0.5
MAX_RECONNECT_WAIT = 10.0
# Events after which the server closes the stream on purpose.
FINAL_EVENTS = frozenset({"end", "closed"})
# How far a worker's clock may be ahead of this machine's (the lines' times are the worker's).
CLOCK_SKEW = 120.0


def stream_events(
    client: Client,
    job_id: int,
    *,
    last_event_id: str | None = None,
    max_reconnects: int = MAX_RECONNECTS,
) -> Iterator[ServerSentEvent]:
    """The job's events until `end` (or `closed`), across dropped connections: each
    reconnection resumes after the last event id seen. Raises Unreachable after
    `max_reconnects` failed connections in a row."""
    failures = 0
    while True:
        headers = {"Last-Event-ID": last_event_id} if last_event_id else {}
        timeout = httpx.Timeout(client.http.timeout.connect, read=READ_TIMEOUT)
        try:
            with connect_sse(
                client.http, "GET", f"/jobs/{job_id}/stream", headers=headers, timeout=timeout
            ) as source:
                if not source.response.is_success:
                    source.response.read()
                    raise_for_response(source.response)
                for event in source.iter_sse():
                    failures = 0
                    if event.id:
                        last_event_id = event.id
                    yield event
                    if event.event in FINAL_EVENTS:
                        return
        except (httpx.TransportError, SSEError) as exc:
            failures += 1
            if failures > max_reconnects:
                raise Unreachable(
                    f"lost job {job_id}'s stream and could not reconnect after {max_reconnects} "
                    f"tries ({exc.__class__.__name__}: {exc})"
                ) from None
        else:
            failures += 1  # closed without `end`: a server restarting, say
            if failures > max_reconnects:
                raise TrainyardError(f"job {job_id}'s stream kept closing before the job ended")
        time.sleep(min(RECONNECT_WAIT * 2 ** (failures - 1), MAX_RECONNECT_WAIT))


def _key(group: int, rank: int, at: float, line: str) -> tuple[int, int, float, str]:
    return group, rank, round(at, 6), line


def follow_log_lines(
    client: Client,
    job_id: int,
    *,
    tail: int | None = None,
    grep: re.Pattern[str] | str | None = None,
) -> Iterator[LogLineOut]:
    """Every stored log line of the job (the last `tail` of them, when given), then each new
    one from its live stream, until the job ends; with `grep`, only lines it matches (the tail
    counts those). The stream opens first, so no line falls between the two; a line both read
    back and streamed is given once."""
    pattern = re.compile(grep) if isinstance(grep, str) else grep
    for line in _stored_then_live(client, job_id, tail):
        if pattern is None or pattern.search(line.line):
            yield line


def _stored_then_live(client: Client, job_id: int, tail: int | None) -> Iterator[LogLineOut]:
    events = stream_events(client, job_id)
    first = next(events)  # the job's state: the stream is open and knows where it starts
    opened = time.time()
    seen: set[tuple[int, int, float, str]] = set()
    stored: deque[LogLineOut] = deque(maxlen=tail)
    after: int | None = None
    while True:
        data = client.get_json(f"/jobs/{job_id}/logs", after=after, limit=500)
        lines = [LogLineOut.model_validate(line) for line in data["lines"]]
        if not lines:
            break
        after = int(data["next"])
        for line in lines:
            if line.at >= opened - CLOCK_SKEW:  # written before the stream opened: not in it
                seen.add(_key(line.group, line.rank, line.at, line.line))
        stored.extend(lines)
        if tail is None:
            yield from stored
            stored.clear()
    yield from stored
    if first.event in FINAL_EVENTS:
        return
    for event in events:
        if event.event == "closed":  # the token it was opened with was revoked or expired
            raise AuthError(f"job {job_id}'s stream closed: {json.loads(event.data)['reason']}")
        if event.event != "log":
            continue
        record: dict[str, Any] = json.loads(event.data)
        key = _key(record["group"], record["rank"], float(record["time"]), record["line"])
        if key in seen:
            seen.discard(key)
            continue
        yield LogLineOut.model_validate(
            {
                "id": 0,
                "at": record["time"],
                "group": record["group"],
                "rank": record["rank"],
                "line": record["line"],
            }
        )
