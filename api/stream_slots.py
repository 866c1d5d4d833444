"""Who may hold a live stream open, and for how long it may take a place.

Two bounds: per user, over every API process, `streams_per_user` (a sorted set in Redis of the
user's open streams, each scored by the end of a lease its stream renews, so the streams of a
process that died lapse within `LEASE_SECONDS`), 429 past it; and per process,
`stream_connections`, the streams its one shared Redis pool serves, 503 past it.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import anyio
import redis.asyncio
from fastapi import HTTPException

from api.deps import Services

LEASE_SECONDS = 30.0
RENEW_SECONDS = 10.0
RETRY_SECONDS = 5

# Drop lapsed leases; refuse when the user holds `limit`; else hold one more until the lease ends.
_TAKE = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[2]) then
  return 0
end
redis.call('ZADD', KEYS[1], ARGV[1] + ARGV[3], ARGV[4])
redis.call('EXPIRE', KEYS[1], math.ceil(tonumber(ARGV[3])))
return 1
"""


def stream_client(services: Services) -> redis.asyncio.Redis:
    """This process's (this event loop's) one Redis pool for streams."""
    client = services.stream_redis.get(asyncio.get_running_loop())
    if client is None:
        raise RuntimeError("the app's lifespan has not started: no Redis pool for streams")
    return client


@dataclass
class StreamSlot:
    """One open stream's place: renewed while it runs, released once when it ends."""

    services: Services
    key: str
    member: str
    renewed: float = field(default_factory=time.monotonic)
    released: bool = False

    async def renew(self) -> None:
        if time.monotonic() - self.renewed < RENEW_SECONDS:
            return
        self.renewed = time.monotonic()
        lease = {self.member: time.time() + LEASE_SECONDS}
        await stream_client(self.services).zadd(self.key, lease, xx=True)

    async def release(self) -> None:
        if self.released:
            return
        self.released = True
        self.services.streams_open -= 1
        # Shielded: a stream ends by its client leaving, which cancels the stream's task, and
        # any await in a cancelled scope would be cancelled again (the lease would then lapse).
        with anyio.CancelScope(shield=True):
            await stream_client(self.services).zrem(self.key, self.member)


async def take_slot(services: Services, user_id: int) -> StreamSlot:
    """A place for one more stream of `user_id`, or an HTTPException (503, 429) saying why not."""
    settings = services.settings
    retry = {"Retry-After": str(RETRY_SECONDS)}
    if services.streams_open >= settings.stream_connections:
        raise HTTPException(
            503,
            f"this API process serves {settings.stream_connections} live streams, its most "
            "(stream_connections); try again shortly",
            headers=retry,
        )
    key = services.keys.open_streams(user_id)
    member = uuid.uuid4().hex
    taken: Any = await stream_client(services).eval(
        _TAKE,
        1,
        key,
        repr(time.time()),
        str(settings.streams_per_user),
        repr(LEASE_SECONDS),
        member,
    )
    if not taken:
        raise HTTPException(
            429,
            f"you have {settings.streams_per_user} live streams open, the most a user may "
            "(streams_per_user): close one, or follow fewer jobs at once",
            headers=retry,
        )
    services.streams_open += 1
    return StreamSlot(services, key, member)
