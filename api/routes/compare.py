"""/compare: several jobs side by side, for the dashboard's Compare page."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from api.deps import CurrentUser, SessionDep
from api.routes.jobs import job_fields
from api.schemas import errors, finite
from api.schemas_integrations import ComparisonOut, CurveOut, DifferenceOut, MetricRowOut
from scheduler.store import compare
from scheduler.store import jobs as job_store
from scheduler.store import predictions as prediction_store
from scheduler.store.models import JobOut

router = APIRouter(prefix="/compare", tags=["jobs"])


@router.get(
    "",
    response_model=ComparisonOut,
    summary="Compare jobs",
    description=f"2 to {compare.MAX_JOBS} jobs (`jobs=1,2,3`): each one's metric curves (its "
    "first worker's, by step with the time of each point, at most max_points a curve), the "
    "settings they differ in (the job documents flattened to dotted keys), each metric's "
    "final, lowest and highest value, and their environments with the facts and packages "
    "that differ. 404 if any job is not one you may see.",
    responses=errors(401, 404, 422),
)
def compare_jobs(
    session: SessionDep,
    user: CurrentUser,
    jobs: Annotated[str, Query(max_length=200, description="job ids, comma-separated")],
    max_points: Annotated[int, Query(ge=2, le=2000, description="per curve")] = 500,
) -> ComparisonOut:
    found = compare.compare_jobs(session, user, compare.parse_ids(jobs), max_points=max_points)
    owners = job_store.owner_names(session, {job.owner_id for job in found.jobs})
    ends = prediction_store.progress_ends(session, found.jobs)
    return ComparisonOut(
        jobs=[
            JobOut(**job_fields(job, owners[job.owner_id], None, ends[job.id]))
            for job in found.jobs
        ],
        curves=[
            CurveOut(
                job_id=c.job_id, name=c.name, steps=c.steps, times=c.times, values=finite(c.values)
            )
            for c in found.curves
        ],
        metrics=[
            MetricRowOut(name=m.name, final=finite(m.final), min=finite(m.min), max=finite(m.max))
            for m in found.metrics
        ],
        settings=[DifferenceOut.of(d) for d in found.settings],
        same_settings=found.same_settings,
        environments=found.environments,
        environment=[DifferenceOut.of(d) for d in found.environment],
        packages=[DifferenceOut.of(d) for d in found.packages],
    )
