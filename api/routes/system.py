"""/healthz (no token) and /metrics (Prometheus text format)."""

from __future__ import annotations

import time
from collections.abc import Iterable

from fastapi import APIRouter, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy import func, select, text

from api.deps import CurrentUser, Services, ServicesDep, SessionDep
from api.schemas import Health, LoopHealth, errors
from contract.codec import decode
from scheduler.placement.cluster import node_capacities
from scheduler.store.jobs import job_counts
from scheduler.store.models import Job, JobState, NodeState

router = APIRouter(tags=["system"])
LOOPS = ("schedule", "ingest")


@router.get(
    "/healthz",
    response_model=Health,
    summary="Liveness and dependencies",
    description="No token needed. 200 when the database and Redis answer, 503 (status "
    "degraded) when one does not. `scheduler` and `ingest` say when the scheduler's loops last "
    "completed a pass; one silent past the liveness timeout makes the status degraded.",
    responses={503: {"model": Health, "description": "the database or Redis is unavailable"}},
)
def healthz(services: ServicesDep, response: Response) -> Health:
    try:
        with services.db.engine.connect() as connection:
            connection.execute(text("SELECT 1"))
        db_ok = True
    except Exception:  # any failure to reach the database is what this endpoint reports
        db_ok = False
    loops: dict[str, LoopHealth] = {}
    try:
        redis_ok = bool(services.redis.ping())
        loops = loop_health(services)
    except Exception:  # likewise for Redis
        redis_ok = False
    if not (db_ok and redis_ok):
        response.status_code = 503
    ok = db_ok and redis_ok and all(loop.alive for loop in loops.values())
    return Health(
        status="ok" if ok else "degraded",
        db=db_ok,
        redis=redis_ok,
        scheduler=loops.get("schedule"),
        ingest=loops.get("ingest"),
    )


def loop_health(services: Services) -> dict[str, LoopHealth]:
    """When the scheduler's loops last completed a pass (scheduler/daemon/lease.py records it)."""
    raw = decode(services.redis.hgetall(services.keys.liveness))
    limit = services.settings.liveness_timeout_seconds
    out = {}
    for loop in LOOPS:
        ago = max(time.time() - float(raw[loop]), 0.0) if loop in raw else None
        out[loop] = LoopHealth(
            last_pass_seconds_ago=None if ago is None else round(ago, 3),
            alive=ago is None or ago <= limit,
        )
    return out


@router.get(
    "/metrics",
    response_class=Response,
    summary="Prometheus metrics",
    description="Jobs by state, nodes by state, slots and GPUs (total and in use), the queue "
    "length and the metric points ingested so far, in the Prometheus text format.",
    responses={
        200: {"content": {CONTENT_TYPE_LATEST: {}}, "description": "Prometheus text format"},
        **errors(401),
    },
)
def prometheus(session: SessionDep, services: ServicesDep, _: CurrentUser) -> Response:
    jobs = GaugeMetricFamily("trainyard_jobs", "Jobs by state", labels=["state"])
    for state, count in job_counts(session).items():
        jobs.add_metric([state], count)
    queued = session.scalar(select(func.count()).where(Job.state == JobState.QUEUED)) or 0
    queue = GaugeMetricFamily("trainyard_queue_length", "Jobs waiting to be placed", value=queued)
    capacity = node_capacities(session)
    alive = [n for n in capacity if n.alive]
    nodes = GaugeMetricFamily("trainyard_nodes", "Node agents by state", labels=["state"])
    nodes.add_metric([NodeState.ALIVE], len(alive))
    nodes.add_metric([NodeState.LOST], len(capacity) - len(alive))
    slots = GaugeMetricFamily("trainyard_slots", "CPU slots of alive nodes", labels=["use"])
    slots.add_metric(["total"], sum(n.slots for n in alive))
    slots.add_metric(["used"], sum(min(n.slots_used, n.slots) for n in alive))
    gpus = GaugeMetricFamily("trainyard_gpus", "GPUs of alive nodes", labels=["use"])
    gpus.add_metric(["total"], sum(n.gpus for n in alive))
    gpus.add_metric(["used"], sum(min(n.gpus_used, n.gpus) for n in alive))
    points = CounterMetricFamily(
        "trainyard_ingested_points",
        "Metric points the ingester has written to SQL",
        value=int(services.redis.get(services.keys.ingested_points) or 0),
    )
    ages = GaugeMetricFamily(
        "trainyard_loop_last_pass_seconds",
        "Seconds since the scheduler's loop last completed a pass",
        labels=["loop"],
    )
    for loop, health in loop_health(services).items():
        if health.last_pass_seconds_ago is not None:
            ages.add_metric([loop], health.last_pass_seconds_ago)
    registry = CollectorRegistry()
    registry.register(Snapshot([jobs, queue, nodes, slots, gpus, points, ages]))
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)


class Snapshot(Collector):
    """Values read for one scrape (the API keeps no counters of its own)."""

    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterable[Metric]:
        return self.families
