"""/healthz (no token) and /metrics (Prometheus text format)."""

from __future__ import annotations

from collections.abc import Iterable

from fastapi import APIRouter, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy import func, select, text

from api.deps import CurrentUser, ServicesDep, SessionDep
from api.schemas import Health, errors
from scheduler.cluster import node_capacities
from scheduler.models import Job, JobState, NodeState
from scheduler.store import job_counts

router = APIRouter(tags=["system"])


@router.get(
    "/healthz",
    response_model=Health,
    summary="Liveness and dependencies",
    description="No token needed. 200 with status ok when the database and Redis answer; "
    "503 with the same body (status degraded) when one does not.",
    responses={503: {"model": Health, "description": "the database or Redis is unavailable"}},
)
def healthz(services: ServicesDep, response: Response) -> Health:
    try:
        with services.db.engine.connect() as connection:
            connection.execute(text("SELECT 1"))
        db_ok = True
    except Exception:  # any failure to reach the database is what this endpoint reports
        db_ok = False
    try:
        redis_ok = bool(services.redis.ping())
    except Exception:  # likewise for Redis
        redis_ok = False
    if not (db_ok and redis_ok):
        response.status_code = 503
    return Health(status="ok" if db_ok and redis_ok else "degraded", db=db_ok, redis=redis_ok)


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
    registry = CollectorRegistry()
    registry.register(Snapshot([jobs, queue, nodes, slots, gpus, points]))
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)


class Snapshot(Collector):
    """Values read for one scrape (the API keeps no counters of its own)."""

    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterable[Metric]:
        return self.families
