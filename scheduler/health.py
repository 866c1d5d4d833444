"""How the service is doing, as the API's /healthz and /metrics read it: whether SQL and Redis
answer, when the scheduler's loops last completed a pass (contract/liveness.py), and the counts
Prometheus scrapes."""

from __future__ import annotations

import time
from dataclasses import dataclass

import redis
from sqlalchemy import text
from sqlalchemy.orm import Session

from contract.keys import Keys
from contract.liveness import last_passes
from scheduler.placement.cluster import node_capacities
from scheduler.placement.plan import NodeCapacity
from scheduler.store.database import Database
from scheduler.store.jobs import job_counts

LOOPS = ("schedule", "ingest")


@dataclass(frozen=True)
class LoopAge:
    seconds_ago: float | None  # since the loop last completed a pass; None: never seen
    alive: bool  # it passed within the liveness timeout (or was never seen)


@dataclass(frozen=True)
class Health:
    db: bool
    redis: bool
    loops: dict[str, LoopAge]  # empty when Redis does not answer

    @property
    def ok(self) -> bool:
        return self.db and self.redis and all(loop.alive for loop in self.loops.values())


def health(database: Database, client: redis.Redis, keys: Keys, timeout: float) -> Health:
    """Whether the database and Redis answer, and the loops' ages (`timeout`: the liveness
    timeout, past which a silent loop is not alive). Never raises for an unreachable store."""
    try:
        with database.engine.connect() as connection:
            connection.execute(text("SELECT 1"))
        db_ok = True
    except Exception:  # any failure to reach the database is what this reports
        db_ok = False
    loops: dict[str, LoopAge] = {}
    try:
        redis_ok = bool(client.ping())
        loops = loop_ages(client, keys, timeout)
    except Exception:  # likewise for Redis
        redis_ok = False
    return Health(db=db_ok, redis=redis_ok, loops=loops)


def loop_ages(client: redis.Redis, keys: Keys, timeout: float) -> dict[str, LoopAge]:
    """How long ago each of the scheduler's loops completed a pass."""
    passes = last_passes(client, keys)
    out = {}
    for loop in LOOPS:
        ago = max(time.time() - passes[loop], 0.0) if loop in passes else None
        out[loop] = LoopAge(
            seconds_ago=None if ago is None else round(ago, 3),
            alive=ago is None or ago <= timeout,
        )
    return out


@dataclass(frozen=True)
class Stats:
    """One scrape's values (the API keeps no counters of its own)."""

    jobs: dict[str, int]  # per state, every state present
    nodes: list[NodeCapacity]
    ingested_points: int  # metric points the ingester has written to SQL
    loops: dict[str, LoopAge]


def stats(session: Session, client: redis.Redis, keys: Keys, timeout: float) -> Stats:
    return Stats(
        jobs=job_counts(session),
        nodes=node_capacities(session),
        ingested_points=int(client.get(keys.ingested_points) or 0),
        loops=loop_ages(client, keys, timeout),
    )
