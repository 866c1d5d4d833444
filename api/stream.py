"""GET /jobs/{id}/stream: a job's live records as server-sent events.

The job's Redis stream is the source: the records workers append (metrics, log lines,
checkpoints, pipeline stages' timelines, the job's events) go out as they arrive, each with its
stream id as the event id, so a client that reconnects with Last-Event-ID continues where it
stopped. Job state
changes come from SQL (where the ingester puts them), polled every second and at once when a
process reports a state; when the job has ended the stream drains what is left, sends `end` and
closes.

A stream is bounded: each user holds at most `streams_per_user` open, each API process serves
at most `stream_connections` from one shared Redis pool (api/stream_slots.py), and a stream
closes (event `closed`) within a second or so of the token it was opened with being revoked or
expiring.
"""

from __future__ import annotations

import json
import re
import secrets
import time
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Annotated, Any

import redis.asyncio
from fastapi import APIRouter, Depends, Header, HTTPException, Query
from fastapi.responses import StreamingResponse
from starlette.background import BackgroundTask
from starlette.concurrency import run_in_threadpool

from api.deps import (
    Caller,
    CallerDep,
    Credentials,
    JobId,
    Services,
    ServicesDep,
    authenticate,
    caller_of,
)
from api.schemas import StageTimelineOut, errors, finite
from api.schemas_access import StreamTicket
from api.stream_slots import StreamSlot, stream_client, take_slot
from contract.stream import (
    CheckpointRecord,
    EventRecord,
    LogRecord,
    MetricRecord,
    Record,
    RecordError,
    StateRecord,
    TimelineRecord,
    decode_record,
)
from scheduler.store.jobs import get_job
from scheduler.store.models import Job, aware, utcnow
from scheduler.store.states import JobState

router = APIRouter(tags=["jobs"])

STATE_POLL_SECONDS = 1.0
BLOCK_MS = 1000
KEEPALIVE_SECONDS = 15.0
BATCH = 500
STREAM_ID = re.compile(r"^(\d{1,20})(?:-(\d{1,20}))?$")
MAX_ID_PART = 2**64 - 1


@dataclass(frozen=True)
class Snapshot:
    """What clients see of a job's state."""

    state: JobState
    step: int
    error: str | None

    def data(self) -> dict[str, Any]:
        return {"state": self.state, "step": self.step, "error": self.error}


def sse(event: str, data: Any, event_id: str | None = None) -> str:
    head = f"id: {event_id}\n" if event_id else ""
    return f"{head}event: {event}\ndata: {json.dumps(finite(data), separators=(',', ':'))}\n\n"


def record_event(record: Record) -> tuple[str, dict[str, Any]] | None:
    """The SSE event of one stream record; None for records clients do not see."""
    match record:
        case MetricRecord() | LogRecord():
            return record.kind, asdict(record)
        case CheckpointRecord():
            # The server path stays on the server; clients download by step.
            return "checkpoint", {
                "step": record.step,
                "size": record.size,
                "time": record.time,
                "best": record.best,
            }
        case EventRecord():
            return "event", {"step": record.step, "message": record.message, "time": record.time}
        case TimelineRecord():
            # As GET /jobs/{id}/pipeline lists it, so a page replaces its stage's row.
            timeline = StageTimelineOut.of(record.group, record.rank, record.step, record.events)
            return "timeline", timeline.model_dump()
    return None


def _load_state(services: Services, job_id: int) -> Snapshot:
    with services.db.sessions() as session:
        job = session.get(Job, job_id)
        if job is None:  # deleted while streaming: it ended
            return Snapshot(JobState.CANCELLED, 0, "the job was deleted")
        return Snapshot(JobState(job.state), job.step, job.error)


@dataclass(frozen=True)
class Opened:
    """A stream allowed to open: the job's state, and who opened it with which token."""

    snapshot: Snapshot
    user_id: int
    token_hash: str
    expires_at: datetime | None


def _opened(session: Any, caller: Caller, job_id: int) -> Opened:
    job = get_job(session, caller.user, job_id)
    snapshot = Snapshot(JobState(job.state), job.step, job.error)
    return Opened(snapshot, caller.user.id, caller.token_hash, caller.expires_at)


def _authorise(services: Services, credentials: Any, job_id: int) -> Opened:
    # A short session of its own: a stream can stay open for hours.
    with services.db.sessions() as session:
        return _opened(session, authenticate(session, credentials, services.tokens), job_id)


def issue_ticket(services: Services, caller: Caller, job_id: int) -> StreamTicket:
    """A random ticket to open `job_id`'s stream once, within the settings' seconds; the
    stream it opens lives as long as the caller's token."""
    ticket = secrets.token_urlsafe(24)
    seconds = services.settings.stream_ticket_seconds
    value = f"{job_id}:{caller.user.id}:{caller.token_hash}"
    services.redis.set(services.keys.stream_ticket(ticket), value, ex=seconds)
    return StreamTicket(ticket=ticket, job_id=job_id, expires_in=seconds)


def _redeem(services: Services, ticket: str, job_id: int) -> Opened:
    """The job's state if `ticket` is a live ticket to its stream, used up here, and its
    token still valid."""
    raw = services.redis.getdel(services.keys.stream_ticket(ticket))
    refused = HTTPException(
        401,
        "invalid, used or expired stream ticket: get a new one from "
        f"POST /api/v1/jobs/{job_id}/stream-ticket (each opens the stream once)",
        headers={"WWW-Authenticate": 'Bearer error="invalid_token"'},
    )
    if raw is None:
        raise refused
    text = raw.decode() if isinstance(raw, bytes) else str(raw)
    ticket_job, _, rest = text.partition(":")
    user_id, _, token_hash = rest.partition(":")
    if int(ticket_job) != job_id:
        raise HTTPException(
            401,
            f"this stream ticket is for job {ticket_job}, not job {job_id}",
            headers={"WWW-Authenticate": 'Bearer error="invalid_token"'},
        )
    with services.db.sessions() as session:
        caller = caller_of(session, token_hash, services.tokens)  # revoked since: 401
        if caller.user.id != int(user_id):
            raise refused
        return _opened(session, caller, job_id)


async def start_state(
    job_id: JobId,
    services: ServicesDep,
    credentials: Credentials,
    ticket: Annotated[
        str | None,
        Query(
            max_length=200,
            description="a stream ticket (POST /jobs/{job_id}/stream-ticket), for clients "
            "that cannot send an Authorization header (a browser's EventSource); the header "
            "wins when both are given",
        ),
    ] = None,
) -> Opened:
    if credentials is None and ticket:
        return await run_in_threadpool(_redeem, services, ticket, job_id)
    return await run_in_threadpool(_authorise, services, credentials, job_id)


async def _token_ended(services: Services, opened: Opened) -> str | None:
    """Why the stream's token no longer holds (revoked, expired), or None. From the cache
    when it knows the token (a revocation drops it there at once), else from SQL."""
    if opened.expires_at is not None and aware(opened.expires_at) <= utcnow():
        return "the API token this stream was opened with expired"
    if services.tokens.get(opened.token_hash) is not None:
        return None
    return await run_in_threadpool(_token_revoked, services, opened.token_hash)


def _token_revoked(services: Services, token_hash: str) -> str | None:
    try:
        with services.db.sessions() as session:
            caller_of(session, token_hash, services.tokens)
    except HTTPException:
        return "the API token this stream was opened with was revoked"
    return None


async def follow(
    services: Services, job_id: int, opened: Opened, after: str | None, slot: StreamSlot
) -> AsyncIterator[str]:
    try:
        async for event in _follow(stream_client(services), services, job_id, opened, after, slot):
            yield event
    finally:
        await slot.release()


async def _follow(
    client: redis.asyncio.Redis,
    services: Services,
    job_id: int,
    opened: Opened,
    after: str | None,
    slot: StreamSlot,
) -> AsyncIterator[str]:
    key = services.keys.job_stream(job_id)
    if after is None:
        # "Only what is new": the stream's current end, taken before anything is sent (a
        # client may react to the first event by producing records) and remembered, so that
        # nothing appended between two reads is missed (which repeating "$" would do).
        newest: Any = await client.xrevrange(key, count=1)
        after = decode_id(newest[0][0]) if newest else "0-0"
    first = opened.snapshot
    yield sse("state", first.data())
    state = first
    polled = time.monotonic()
    quiet_since = time.monotonic()
    while True:
        ended = state.state.terminal
        # Once the job has ended, drain what is left without waiting.
        reply: Any = await client.xread(
            {key: after}, count=BATCH, block=None if ended else BLOCK_MS
        )
        entries = reply[0][1] if reply else []
        poll_now = False
        for entry_id, raw in entries:
            after = decode_id(entry_id)
            try:
                record = decode_record(raw)
            except RecordError:
                continue  # a malformed record is the ingester's to report
            if isinstance(record, StateRecord):
                poll_now = True  # a process started or ended: the job's state may follow
                continue
            event = record_event(record)
            if event is not None:
                yield sse(event[0], event[1], after)
                quiet_since = time.monotonic()
        if ended and not entries:
            yield sse("end", state.data())
            return
        now = time.monotonic()
        if poll_now or now - polled >= STATE_POLL_SECONDS:
            polled = now
            why = await _token_ended(services, opened)
            if why is not None:
                yield sse("closed", {"reason": why})
                return
            await slot.renew()
            current = await run_in_threadpool(_load_state, services, job_id)
            if current != state:
                state = current
                yield sse("state", state.data())
                quiet_since = now
        if now - quiet_since >= KEEPALIVE_SECONDS:
            yield ": keep-alive\n\n"  # a comment: proxies keep idle connections open
            quiet_since = now


def valid_stream_id(text: str) -> bool:
    """Redis stream ids are <ms>-<seq> with both parts unsigned 64-bit."""
    match = STREAM_ID.match(text)
    return match is not None and all(
        int(part) <= MAX_ID_PART for part in match.groups() if part is not None
    )


def decode_id(entry_id: bytes | str) -> str:
    return entry_id.decode() if isinstance(entry_id, bytes) else entry_id


@router.get(
    "/jobs/{job_id}/stream",
    summary="Follow a job live (server-sent events)",
    description="Events: `state` (now, then on every change: {state, step, error}), `metric` "
    "({step, group, rank, time, values}), `log` ({group, rank, time, line}), `checkpoint` "
    "({step, size, time, best}), `event` (the job's: {step, message, time}, e.g. it stopped "
    "early), `timeline` (a pipeline stage's timeline of a step: {group, rank, step, events}, "
    "as GET /jobs/{job_id}/pipeline lists it), `end` (the job has ended; the "
    "stream closes) and `closed` ({reason}: the token it was opened with was revoked or "
    "expired; the stream closes). A user holds at most the server's streams_per_user streams "
    "open (429 past it). Record events carry their Redis stream id; reconnect with Last-Event-ID "
    "(or ?last_event_id=) to resume after it. Without one, only records newer than the request "
    "are sent.",
    response_class=StreamingResponse,
    responses={
        200: {"content": {"text/event-stream": {}}, "description": "an event stream"},
        **errors(401, 404, 422, 429),
    },
)
async def stream_job(
    job_id: JobId,
    services: ServicesDep,
    opened: Annotated[Opened, Depends(start_state)],
    last_event_id: Annotated[
        str | None, Query(max_length=41, description="resume after this event id")
    ] = None,
    last_event_header: Annotated[
        str | None, Header(alias="Last-Event-ID", max_length=41, include_in_schema=False)
    ] = None,
) -> StreamingResponse:
    after = last_event_header or last_event_id
    if after is not None and not valid_stream_id(after):
        raise HTTPException(422, f"'{after}' is not an event id of this stream")
    slot = await take_slot(services, opened.user_id)
    return StreamingResponse(
        follow(services, job_id, opened, after, slot),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        # Also when the body never started (the client left at once): released once.
        background=BackgroundTask(slot.release),
    )


@router.post(
    "/jobs/{job_id}/stream-ticket",
    response_model=StreamTicket,
    summary="A ticket to open a job's live stream",
    description="For clients that cannot send the Authorization header to GET "
    "/jobs/{job_id}/stream (a browser's EventSource): pass `ticket` as ?ticket=. It opens this "
    "job's stream once, within `expires_in` seconds (the server's stream_ticket_seconds), so a "
    "URL that ends up in a log or a history is worth nothing; the long-lived token never goes "
    "in a URL.",
    responses=errors(401, 404, 422),
)
def stream_ticket(job_id: JobId, caller: CallerDep, services: ServicesDep) -> StreamTicket:
    with services.db.sessions() as session:
        get_job(session, caller.user, job_id)  # 404 unless the caller may see it
    return issue_ticket(services, caller, job_id)
