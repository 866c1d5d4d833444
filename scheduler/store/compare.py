"""Several jobs side by side (the dashboard's Compare page, GET /compare): their curves, the
settings they differ in, their final and extreme metrics and their environments, worked out
here from what the store holds. A job the caller may not see is NotFound, as if absent."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from dsl.flatten import flatten_document
from scheduler.store import environments as environment_store
from scheduler.store import reports
from scheduler.store.diff import Difference, differences
from scheduler.store.errors import InvalidRequest
from scheduler.store.jobs import get_job
from scheduler.store.models import Job, Metric, User

MAX_JOBS = 10


@dataclass(frozen=True)
class Curve:
    """One metric of one job's first worker (group 0, rank 0), downsampled."""

    job_id: int
    name: str
    steps: list[int]
    times: list[float]  # unix seconds, the worker's clock
    values: list[float]


@dataclass(frozen=True)
class MetricRow:
    """One metric across the jobs (None: a job that did not report it)."""

    name: str
    final: list[float | None]
    min: list[float | None]
    max: list[float | None]


@dataclass
class Comparison:
    jobs: list[Job]
    curves: list[Curve] = field(default_factory=list)
    metrics: list[MetricRow] = field(default_factory=list)
    settings: list[Difference] = field(default_factory=list)
    same_settings: int = 0  # how many settings are the same in every job
    environments: list[dict[str, Any] | None] = field(default_factory=list)
    environment: list[Difference] = field(default_factory=list)
    packages: list[Difference] = field(default_factory=list)


def parse_ids(text: str) -> list[int]:
    """`1,2,3` as job ids, each once, in order; InvalidRequest for anything else."""
    ids: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part.isdigit() or not 0 < int(part) < 2**31:
            raise InvalidRequest(f"jobs: {part!r} is not a job id (give ids like 1,2,3)")
        if int(part) not in ids:
            ids.append(int(part))
    if not 2 <= len(ids) <= MAX_JOBS:
        raise InvalidRequest(f"compare between 2 and {MAX_JOBS} jobs, not {len(ids)}")
    return ids


def compare_jobs(
    session: Session, user: User, job_ids: list[int], *, max_points: int = 500
) -> Comparison:
    jobs = [get_job(session, user, job_id) for job_id in job_ids]
    out = Comparison(jobs=jobs)
    out.settings, out.same_settings = differences([flatten_document(job.spec) for job in jobs])
    finals: dict[str, dict[int, float]] = {}
    for job in jobs:
        for series in reports.metric_series(session, job.id, group=0, max_points=max_points):
            if series.rank != 0 or not series.points:
                continue
            steps, values = zip(*series.points, strict=True)
            out.curves.append(Curve(job.id, series.name, list(steps), series.times, list(values)))
            finals.setdefault(series.name, {})[job.id] = values[-1]
    extremes = _extremes(session, job_ids)
    out.metrics = [
        MetricRow(
            name=name,
            final=[finals[name].get(job_id) for job_id in job_ids],
            min=[extremes.get((job_id, name), (None, None))[0] for job_id in job_ids],
            max=[extremes.get((job_id, name), (None, None))[1] for job_id in job_ids],
        )
        for name in sorted(finals)
    ]
    firsts = [environment_store.first_environment(session, job.id) for job in jobs]
    out.environments = [env.facts if env else None for env in firsts]
    out.environment, _ = differences(out.environments)
    out.packages, _ = differences([_versions(env.packages) if env else None for env in firsts])
    return out


def _extremes(session: Session, job_ids: list[int]) -> dict[tuple[int, str], tuple[float, float]]:
    """Each job's first worker's lowest and highest value of each metric, over every step."""
    rows = session.execute(
        select(Metric.job_id, Metric.name, func.min(Metric.value), func.max(Metric.value))
        .where(Metric.job_id.in_(job_ids), Metric.group == 0, Metric.rank == 0)
        .group_by(Metric.job_id, Metric.name)
    )
    return {(job_id, name): (low, high) for job_id, name, low, high in rows}


def _versions(packages: list[str]) -> dict[str, str]:
    """ "name==version" lines as name -> version."""
    return dict(line.partition("==")[::2] for line in packages)
