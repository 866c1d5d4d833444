"""The per-user submission rate (quota `submissions_per_minute`) and dry-run rate (quota
`validations_per_minute`, an allowance of its own), counted in Redis so that every API process
shares one count: a sliding window of the user's request times."""

from __future__ import annotations

import math
import time
import uuid
from typing import Any

import redis

from contract.keys import Keys
from scheduler.store.errors import StoreError
from scheduler.store.models import User
from scheduler.store.quotas import Limits

RATE_WINDOW_SECONDS = 60.0

# A sliding window of the user's submission times (a sorted set): drop the old ones, and add
# this one unless the window is full; when full, answer the oldest time (it leaves first).
_RATE_SCRIPT = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[1] - ARGV[2])
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[3]) then
  return redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')[2]
end
redis.call('ZADD', KEYS[1], ARGV[1], ARGV[4])
redis.call('EXPIRE', KEYS[1], math.ceil(tonumber(ARGV[2])))
return false
"""


class RateLimited(StoreError):
    """Past the user's submission rate; `retry_after` whole seconds until one is allowed."""

    def __init__(self, message: str, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after


def take_submission_slot(
    client: redis.Redis,
    keys: Keys,
    user_id: int,
    per_minute: int,
    now: float | None = None,
) -> float | None:
    """Count one submission of the user; None if allowed, else the seconds until one is."""
    return take_slot(client, keys.submissions(user_id), per_minute, now)


def take_slot(
    client: redis.Redis, key: str, per_minute: int, now: float | None = None
) -> float | None:
    """Count one use in the window at `key`; None if allowed, else the seconds until one is."""
    now = time.time() if now is None else now
    oldest: Any = client.eval(
        _RATE_SCRIPT,
        1,
        key,
        repr(now),
        repr(RATE_WINDOW_SECONDS),
        str(per_minute),
        f"{now!r}:{uuid.uuid4().hex}",
    )
    if oldest is None:
        return None
    return max(float(oldest) + RATE_WINDOW_SECONDS - now, 0.0)


def check_rate(client: redis.Redis, keys: Keys, user: User, limits: Limits) -> None:
    """Count a submission of `user`, or refuse it with RateLimited past their rate."""
    if limits.submissions_per_minute is None:
        return
    wait = take_submission_slot(client, keys, user.id, limits.submissions_per_minute)
    if wait is not None:
        seconds = max(1, math.ceil(wait))
        raise RateLimited(
            f"too many submissions: your quota submissions_per_minute is "
            f"{limits.submissions_per_minute}; retry in {seconds} s",
            retry_after=seconds,
        )


def check_validation_rate(client: redis.Redis, keys: Keys, user: User, limits: Limits) -> None:
    """Count a dry run (POST /jobs/validate) of `user`, or refuse it with RateLimited past
    their allowance: each compiles a document, as a submission does."""
    if limits.validations_per_minute is None:
        return
    wait = take_slot(client, keys.validations(user.id), limits.validations_per_minute)
    if wait is not None:
        seconds = max(1, math.ceil(wait))
        raise RateLimited(
            f"too many checks: your quota validations_per_minute is "
            f"{limits.validations_per_minute}; retry in {seconds} s",
            retry_after=seconds,
        )
