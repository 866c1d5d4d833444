"""What route handlers get injected: the app's services, a SQL session, the calling user."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import OrderedDict
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Annotated

import redis
import redis.asyncio
from fastapi import Depends, HTTPException, Path, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from redis.asyncio import Redis as AsyncRedis
from sqlalchemy.orm import Session

from api.exports import Exporter
from contract.keys import Keys
from contract.settings import Settings
from dsl.compiler import CompiledJob
from scheduler.admission.submit import Backends
from scheduler.store import jobs as job_store
from scheduler.store.database import Database
from scheduler.store.errors import Expired
from scheduler.store.models import Job, User, aware, utcnow
from scheduler.store.users import find_token_hash, hash_token

# Ids and steps are 32-bit integer columns; larger numbers cannot name anything.
MAX_INT = 2**31 - 1


class GraphCache:
    """Compiled nets of stored jobs by id (a job's spec never changes), least recent out."""

    def __init__(self, size: int = 128) -> None:
        self.size = size
        self._items: OrderedDict[int, CompiledJob] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, job_id: int) -> CompiledJob | None:
        with self._lock:
            item = self._items.get(job_id)
            if item is not None:
                self._items.move_to_end(job_id)
            return item

    def put(self, job_id: int, compiled: CompiledJob) -> None:
        with self._lock:
            self._items[job_id] = compiled
            self._items.move_to_end(job_id)
            while len(self._items) > self.size:
                self._items.popitem(last=False)

    def drop(self, job_id: int) -> None:
        with self._lock:
            self._items.pop(job_id, None)


@dataclass(frozen=True)
class Caller:
    """Who a request's token says it is: the user, and the token itself (what it may mint,
    when a stream opened with it must close)."""

    user: User
    token_id: int
    token_hash: str
    expires_at: datetime | None


class TokenCache:
    """Callers of recently seen tokens, for a few seconds: every request authenticates, and
    this saves the busiest endpoints a query each. Keyed by the token's hash, like the table. A
    revoked token is dropped at once: by this process when it revokes it, by every other API
    process when the revocation is announced on Redis (`listen_for_revocations`).

    Refused tokens are remembered too, for `refused_seconds`, so a client repeating a bad or
    expired token costs no query per request. Both maps are bounded: past `size` entries one
    starts over (a burst of distinct bad tokens cannot evict the good ones)."""

    def __init__(self, seconds: float = 10.0, size: int = 1024, refused_seconds: float = 5.0):
        self.seconds, self.size, self.refused_seconds = seconds, size, refused_seconds
        self._items: dict[str, tuple[float, Caller]] = {}
        self._refused: dict[str, tuple[float, str]] = {}
        self._lock = threading.Lock()

    def get(self, token_hash: str) -> Caller | None:
        with self._lock:
            found = self._items.get(token_hash)
        if found is None or found[0] < time.monotonic():
            return None
        return found[1]

    def put(self, caller: Caller) -> None:
        until = time.monotonic() + self.seconds
        if caller.expires_at is not None:  # never past the token's own expiry
            left = (aware(caller.expires_at) - utcnow()).total_seconds()
            until = min(until, time.monotonic() + left)
        with self._lock:
            if len(self._items) >= self.size:
                self._items.clear()  # a burst of distinct tokens: start over, stay bounded
            self._items[caller.token_hash] = (until, caller)

    def refusal(self, token_hash: str) -> str | None:
        """Why the token was refused a moment ago, or None."""
        with self._lock:
            found = self._refused.get(token_hash)
        if found is None or found[0] < time.monotonic():
            return None
        return found[1]

    def refuse(self, token_hash: str, reason: str) -> None:
        with self._lock:
            if len(self._refused) >= self.size:
                self._refused.clear()
            self._refused[token_hash] = (time.monotonic() + self.refused_seconds, reason)

    def drop(self, token_hash: str) -> None:
        with self._lock:
            self._items.pop(token_hash, None)

    def clear(self) -> None:
        with self._lock:
            self._items.clear()


async def listen_for_revocations(url: str, channel: str, cache: TokenCache) -> None:
    """Drop tokens other processes revoke (`trainyard admin tokens revoke`, another API
    worker) from `cache`, as they are announced; runs until cancelled. While the connection is
    down, announcements could be missed: the cache is cleared on every (re)subscription."""
    while True:
        client = redis.asyncio.Redis.from_url(url)
        try:
            async with client.pubsub() as pubsub:
                await pubsub.subscribe(channel)
                cache.clear()
                async for message in pubsub.listen():
                    if message.get("type") == "message":
                        data = message["data"]
                        cache.drop(data.decode() if isinstance(data, bytes) else str(data))
        except (redis.RedisError, OSError):  # down, restarted, refused: retry
            cache.clear()
            await asyncio.sleep(1.0)
        finally:
            await client.aclose()


@dataclass
class Services:
    """One per app: built by `create_app`, closed when it stops."""

    settings: Settings
    db: Database
    redis: redis.Redis
    keys: Keys
    graphs: GraphCache = field(default_factory=GraphCache)
    tokens: TokenCache = field(default_factory=TokenCache)
    # Live streams: one Redis pool for all of this process's, made by the app's lifespan on
    # its event loop (uvicorn runs one; tests may serve the app from two), and how many are
    # open here (api/stream_slots.py).
    stream_redis: dict[asyncio.AbstractEventLoop, AsyncRedis] = field(default_factory=dict)
    streams_open: int = 0
    sessions_open: asyncio.Semaphore = field(init=False)
    backends: Backends = field(init=False)  # what the submission pipeline reaches
    exporter: Exporter = field(init=False)  # the bounded exports of trained models

    def __post_init__(self) -> None:
        self.backends = Backends(self.settings, self.redis, self.keys)
        self.exporter = Exporter(self.settings)
        # A request's session keeps its connection between the threads that its dependencies
        # and handler run in, and waits for each thread. Were every pooled connection held by
        # requests waiting for a thread while the threads wait for a connection, nothing would
        # move (16 requests at once did it). So requests hold at most this many sessions, and
        # the threads always find a connection: one each, for the sessions they open themselves.
        spare = self.db.max_connections - self.settings.api_threads
        if spare < 1:
            raise ValueError(
                f"api_threads ({self.settings.api_threads}) must be below the "
                f"{self.db.max_connections} connections of the database pool"
            )
        self.sessions_open = asyncio.Semaphore(spare)


async def get_services(request: Request) -> Services:
    # async: no I/O here, and a sync dependency would cost a trip to the thread pool
    services: Services = request.app.state.services
    return services


ServicesDep = Annotated[Services, Depends(get_services)]


async def get_session(services: ServicesDep) -> AsyncIterator[Session]:
    """A session per request; handlers commit what they change, the rest is rolled back.

    async, as opening a session does no I/O: only closing one that holds a connection (which
    rolls back on it) goes to the thread pool. Every trip there costs a request about as much
    as a small query, and this dependency is on nearly every route. Past `sessions_open`
    requests at once, the next waits here for one to end, holding neither thread nor
    connection."""
    async with services.sessions_open:
        session = services.db.sessions()
        try:
            yield session
        finally:
            if session.in_transaction():
                await run_in_threadpool(session.close)
            else:
                session.close()


SessionDep = Annotated[Session, Depends(get_session)]

bearer = HTTPBearer(
    auto_error=False,
    scheme_name="token",
    description="An API token: `Authorization: Bearer <token>`. `trainyard up` writes an admin "
    "token to the data directory; `trainyard admin create-user NAME` makes more.",
)
Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]


def authenticate(
    session: Session, credentials: HTTPAuthorizationCredentials | None, tokens: TokenCache
) -> Caller:
    if credentials is None:
        raise HTTPException(
            401,
            "missing API token: send the header 'Authorization: Bearer <token>'",
            headers={"WWW-Authenticate": "Bearer"},
        )
    return caller_of(session, hash_token(credentials.credentials), tokens)


def caller_of(session: Session, token_hash: str, tokens: TokenCache) -> Caller:
    """The caller whose token has this hash, from the cache or SQL; 401 if none is valid."""
    caller = tokens.get(token_hash)
    if caller is not None:
        return caller
    refused = tokens.refusal(token_hash)
    if refused is not None:
        raise _invalid_token(refused)
    try:
        found = find_token_hash(session, token_hash)
    except Expired as error:
        tokens.refuse(token_hash, str(error))
        raise _invalid_token(str(error)) from None
    if found is None:
        tokens.refuse(token_hash, "invalid API token")
        raise _invalid_token("invalid API token")
    user, row = found
    if session.dirty:  # the token's last_used_at moved (at most once a minute)
        session.commit()
    # The cached user is shared by requests: out of this session, a rollback here (a failed
    # insert) cannot expire it under the others.
    session.expunge(user)
    caller = Caller(user, row.id, token_hash, row.expires_at)
    tokens.put(caller)
    return caller


def _invalid_token(message: str) -> HTTPException:
    return HTTPException(401, message, headers={"WWW-Authenticate": 'Bearer error="invalid_token"'})


async def get_caller(
    session: SessionDep, credentials: Credentials, services: ServicesDep
) -> Caller:
    """A token seen in the last seconds is answered from the cache, here on the event loop;
    only a new one is looked up in SQL, in the thread pool."""
    if credentials is not None:
        token_hash = hash_token(credentials.credentials)
        caller = services.tokens.get(token_hash)
        if caller is not None:
            return caller
        refused = services.tokens.refusal(token_hash)
        if refused is not None:
            raise _invalid_token(refused)
    return await run_in_threadpool(authenticate, session, credentials, services.tokens)


CallerDep = Annotated[Caller, Depends(get_caller)]


async def get_current_user(caller: CallerDep) -> User:
    return caller.user


CurrentUser = Annotated[User, Depends(get_current_user)]

JobId = Annotated[int, Path(ge=1, le=MAX_INT, description="the job's id")]


def get_job(job_id: JobId, session: SessionDep, user: CurrentUser) -> Job:
    """The job if the caller may see it (their own, or any for an admin); else 404."""
    return job_store.get_job(session, user, job_id)


VisibleJob = Annotated[Job, Depends(get_job)]
