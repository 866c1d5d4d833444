"""/jobs/{id}/environment: what a job's worker processes trained with, and their packages."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Response
from fastapi.responses import PlainTextResponse

from api.deps import MAX_INT, SessionDep, VisibleJob
from api.schemas import errors
from api.schemas_integrations import EnvironmentOut, JobEnvironmentOut
from scheduler.store import environments
from scheduler.store.diff import differences
from scheduler.store.errors import NotFound

router = APIRouter(prefix="/jobs", tags=["jobs"])


@router.get(
    "/{job_id}/environment",
    response_model=JobEnvironmentOut,
    summary="What a job trained with",
    description="Each worker process's Python, torch, CUDA, cuDNN and NCCL versions, devices, "
    "CPU, host, Trainyard version and commit, and a hash of its installed packages, as it "
    "reported when it started; and the facts that differ between them.",
    responses=errors(401, 404, 422),
)
def job_environment(job: VisibleJob, session: SessionDep) -> JobEnvironmentOut:
    rows = environments.environments(session, job.id)
    found, _ = differences([row.facts for row in rows])
    return JobEnvironmentOut(
        processes=[EnvironmentOut.of(row) for row in rows],
        differing=[difference.key for difference in found],
    )


@router.get(
    "/{job_id}/environment/packages",
    response_class=Response,
    summary="A job's installed packages",
    description="The packages installed where one worker process ran (default the first: "
    "group 0, rank 0), a `name==version` line each, sorted: what `pip install -r` takes.",
    responses={
        200: {"content": {"text/plain": {}}, "description": "name==version lines"},
        **errors(401, 404, 422),
    },
)
def job_packages(
    job: VisibleJob,
    session: SessionDep,
    group: Annotated[int, Query(ge=0, le=MAX_INT, description="worker group")] = 0,
    rank: Annotated[int, Query(ge=0, le=MAX_INT, description="rank in the group")] = 0,
) -> PlainTextResponse:
    row = next(
        (
            row
            for row in environments.environments(session, job.id)
            if (row.group, row.rank) == (group, rank)
        ),
        None,
    )
    if row is None:
        raise NotFound(f"worker {group}/{rank} of job {job.id} has not reported its environment")
    return PlainTextResponse(
        "".join(f"{line}\n" for line in row.packages),
        headers={"Content-Disposition": f'attachment; filename="job{job.id}-packages.txt"'},
    )
