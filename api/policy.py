"""What a user may submit: priority above the default (admins only), the per-user rate limit
(429 with Retry-After) and the quotas checked at submission (scheduler/admission/quotas.py).

Placement enforces the rest of the quotas (running jobs, slots and GPUs held): jobs past them
wait in the queue.
"""

from __future__ import annotations

import math
import time
import uuid
from typing import Annotated, Any

import redis
from fastapi import Depends, HTTPException
from fastapi.concurrency import run_in_threadpool
from sqlalchemy.orm import Session

from api.deps import CurrentUser, Services, ServicesDep, SessionDep
from api.submit import Submission, read_submission
from contract.keys import Keys
from scheduler.admission.checks import CheckedJob
from scheduler.admission.quotas import Limits, check_new_job, limits_for
from scheduler.placement.plan import PlacementRequest
from scheduler.store.models import User

DEFAULT_PRIORITY = 0
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


def admins_only(user: User, what: str) -> None:
    if not user.is_admin:
        raise HTTPException(403, f"{what}: only admins may do this")


def check_priority(user: User, priority: int) -> None:
    if priority > DEFAULT_PRIORITY and not user.is_admin:
        raise HTTPException(
            403,
            f"priority {priority}: only admins may set a priority above the default "
            f"({DEFAULT_PRIORITY}); lower ones are yours to set",
        )


def take_submission_slot(
    client: redis.Redis, keys: Keys, user_id: int, per_minute: int, now: float | None = None
) -> float | None:
    """Count one submission of the user; None if allowed, else the seconds until one is."""
    now = time.time() if now is None else now
    oldest: Any = client.eval(
        _RATE_SCRIPT,
        1,
        keys.submissions(user_id),
        repr(now),
        repr(RATE_WINDOW_SECONDS),
        str(per_minute),
        f"{now!r}:{uuid.uuid4().hex}",
    )
    if oldest is None:
        return None
    return max(float(oldest) + RATE_WINDOW_SECONDS - now, 0.0)


def check_rate(services: Services, user: User, limits: Limits) -> None:
    if limits.submissions_per_minute is None:
        return
    wait = take_submission_slot(
        services.redis, services.keys, user.id, limits.submissions_per_minute
    )
    if wait is not None:
        seconds = max(1, math.ceil(wait))
        raise HTTPException(
            429,
            f"too many submissions: your quota submissions_per_minute is "
            f"{limits.submissions_per_minute}; retry in {seconds} s",
            headers={"Retry-After": str(seconds)},
        )


def _admit(user: User, submission: Submission, session: Session, services: Services) -> Limits:
    check_priority(user, submission.priority)
    limits = limits_for(session, user, services.settings)
    check_rate(services, user, limits)
    return limits


async def admit_submission(
    user: CurrentUser,
    submission: Annotated[Submission, Depends(read_submission)],
    session: SessionDep,
    services: ServicesDep,
) -> Limits:
    """Before a submission is compiled: its priority and the user's rate; the user's quotas
    for `check_job_quotas`."""
    return await run_in_threadpool(_admit, user, submission, session, services)


AdmittedLimits = Annotated[Limits, Depends(admit_submission)]


def check_job_quotas(session: Session, user: User, limits: Limits, checked: CheckedJob) -> None:
    """After compiling: train_steps, what the job would hold, and the user's storage."""
    request = PlacementRequest.from_topology(0, checked.topology)
    check_new_job(
        session,
        user,
        limits,
        train_steps=checked.spec.train_steps,
        slots=request.slots,
        gpus=request.gpus,
    )
