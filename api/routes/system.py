"""/healthz (no token) and /metrics (Prometheus text format)."""

from __future__ import annotations

from collections.abc import Iterable

from fastapi import APIRouter, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from api.deps import CurrentUser, ServicesDep, SessionDep
from api.schemas import Health, LoopHealth, errors
from scheduler.health import LoopAge, health, stats
from scheduler.store.states import JobState, NodeState

router = APIRouter(tags=["system"])


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
    found = health(
        services.db, services.redis, services.keys, services.settings.liveness_timeout_seconds
    )
    if not (found.db and found.redis):
        response.status_code = 503
    loops = {name: loop_health(age) for name, age in found.loops.items()}
    return Health(
        status="ok" if found.ok else "degraded",
        db=found.db,
        redis=found.redis,
        scheduler=loops.get("schedule"),
        ingest=loops.get("ingest"),
    )


def loop_health(age: LoopAge) -> LoopHealth:
    return LoopHealth(last_pass_seconds_ago=age.seconds_ago, alive=age.alive)


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
    found = stats(
        session, services.redis, services.keys, services.settings.liveness_timeout_seconds
    )
    jobs = GaugeMetricFamily("trainyard_jobs", "Jobs by state", labels=["state"])
    for state, count in found.jobs.items():
        jobs.add_metric([state], count)
    queued = found.jobs[JobState.QUEUED]
    queue = GaugeMetricFamily("trainyard_queue_length", "Jobs waiting to be placed", value=queued)
    alive = [n for n in found.nodes if n.alive]
    nodes = GaugeMetricFamily("trainyard_nodes", "Node agents by state", labels=["state"])
    nodes.add_metric([NodeState.ALIVE], len(alive))
    nodes.add_metric([NodeState.LOST], len(found.nodes) - len(alive))
    slots = GaugeMetricFamily("trainyard_slots", "CPU slots of alive nodes", labels=["use"])
    slots.add_metric(["total"], sum(n.slots for n in alive))
    slots.add_metric(["used"], sum(min(n.slots_used, n.slots) for n in alive))
    gpus = GaugeMetricFamily("trainyard_gpus", "GPUs of alive nodes", labels=["use"])
    gpus.add_metric(["total"], sum(n.gpus for n in alive))
    gpus.add_metric(["used"], sum(min(n.gpus_used, n.gpus) for n in alive))
    points = CounterMetricFamily(
        "trainyard_ingested_points",
        "Metric points the ingester has written to SQL",
        value=found.ingested_points,
    )
    ages = GaugeMetricFamily(
        "trainyard_loop_last_pass_seconds",
        "Seconds since the scheduler's loop last completed a pass",
        labels=["loop"],
    )
    for loop, age in found.loops.items():
        if age.seconds_ago is not None:
            ages.add_metric([loop], age.seconds_ago)
    registry = CollectorRegistry()
    registry.register(Snapshot([jobs, queue, nodes, slots, gpus, points, ages]))
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)


class Snapshot(Collector):
    """Values read for one scrape (the API keeps no counters of its own)."""

    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterable[Metric]:
        return self.families
