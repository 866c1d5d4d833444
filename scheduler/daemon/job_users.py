"""A job's own Redis user: each of its allocations let in as it, with a password of its own,
when the allocation is dispatched (scheduler/daemon/dispatch.py), on the main Redis and, for a job
with server shards, on every parameter-server Redis; deleted once the job has ended and its
processes stopped (scheduler/daemon/key_sweep.py). Its rules are contract/keys.py's."""

from __future__ import annotations

import logging
import secrets
from collections.abc import Sequence

import redis

from contract.allocation import AllocationInfo
from contract.keys import Keys

log = logging.getLogger("trainyard.scheduler")


def grant_job_user(
    client: redis.Redis,
    keys: Keys,
    info: AllocationInfo,
    ps_clients: Sequence[redis.Redis] = (),
) -> str:
    """Let one more allocation in as its job's Redis user (created with the first), on the
    main Redis and, for a job with server shards, on every parameter-server Redis; the
    password of its own login, the same on each."""
    password = secrets.token_urlsafe(24)
    rules = keys.job_user_rules(info.job_id, info.allocation_id, password)
    client.execute_command("ACL", "SETUSER", keys.job_user(info.job_id), *rules)
    if int(info.topology.get("nserver_groups", 0)) > 0:
        for ps_client in ps_clients:
            try:
                ps_client.execute_command("ACL", "SETUSER", keys.job_user(info.job_id), *rules)
            except redis.RedisError as exc:  # its shards there fail to log in, as if it were down
                log.warning("job %s: no user on a parameter-server Redis: %s", info.job_id, exc)
    return password


def drop_job_user(client: redis.Redis, keys: Keys, job_id: int) -> None:
    """The job's Redis user is deleted, and the connections logged in as it closed."""
    client.execute_command("ACL", "DELUSER", keys.job_user(job_id))
