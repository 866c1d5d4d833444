"""A sweep's trials checked in a process of their own, off the scheduler's placement thread.

Checking a trial compiles its job (the whole pipeline of scheduler/admission/checks.py), which
takes a core for as long as the document asks (up to its compile budget). In the scheduler's
own process that would hold the interpreter from the thread that places every user's jobs, so
one user's sweep could slow everyone's placement. The sweep thread hands each trial to one
worker process instead (started on first use, with its own database connection), which checks
it as a submission's dry run would and hands back the row to queue (a `NewJob`, plain data) or
the located error; the sweep thread only waits for it.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
from collections.abc import Mapping
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any

from contract.settings import Settings
from scheduler.store.database import Database
from scheduler.store.jobs import NewJob

_lock = threading.Lock()
_pool: ProcessPoolExecutor | None = None
_databases: dict[str, Database] = {}  # the checking process's, by URL


@dataclass(frozen=True)
class TrialCheck:
    """What checking one trial gave: the row to queue, or why it is not a valid job."""

    new: NewJob | None
    error: str
    pid: int  # the process that checked it


def check_trial(
    settings: Settings,
    sweep_id: int,
    number: int,
    params: Mapping[str, Any],
    extra: Mapping[str, Any],
) -> TrialCheck:
    """Trial `number` of sweep `sweep_id` with the study's `params` (and `extra` overrides),
    checked in the checking process; waits for it."""
    future = _executor().submit(_check, settings, sweep_id, number, dict(params), dict(extra))
    try:
        return future.result()
    except BrokenProcessPool:
        _reset()  # the checking process died (killed, out of memory): a new one next time
        raise


def _executor() -> ProcessPoolExecutor:
    global _pool
    with _lock:
        if _pool is None:
            # A fresh interpreter: forking a process with threads (the scheduler's) is unsafe.
            _pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))
        return _pool


def _reset() -> None:
    global _pool
    with _lock:
        pool, _pool = _pool, None
    if pool is not None:
        pool.shutdown(wait=False, cancel_futures=True)


def _check(
    settings: Settings,
    sweep_id: int,
    number: int,
    params: dict[str, Any],
    extra: dict[str, Any],
) -> TrialCheck:
    """In the checking process."""
    import redis

    from contract.keys import Keys
    from dsl.errors import JobSpecError
    from scheduler.admission.checks import Kind
    from scheduler.admission.submit import Backends, check, new_job, trial_submission
    from scheduler.store.models import Sweep, User

    url = settings.sql_url()
    db = _databases.get(url) or _databases.setdefault(url, Database(url))
    with db.session() as session:
        sweep = session.get_one(Sweep, sweep_id)
        owner = session.get_one(User, sweep.owner_id)
        submission = trial_submission(sweep, number, params, extra=extra, settings=settings)
        # A trial is held to no rate and announces nothing: Redis is never reached.
        client = redis.Redis.from_url(settings.redis_url or "redis://localhost")
        backends = Backends(settings, client, Keys(settings.redis_prefix))
        try:
            checked = check(session, owner, submission, backends, expect=Kind.JOB, admit=False)
        except JobSpecError as exc:
            return TrialCheck(None, str(exc), os.getpid())
        finally:
            client.close()
        return TrialCheck(new_job(checked), "", os.getpid())
