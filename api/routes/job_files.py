"""A job's records as files: GET /jobs/{id}/metrics.csv, /logs.txt and /tensorboard (a tar of
its TensorBoard event files). Each is streamed as it is read, and bounded
(scheduler/store/downloads.py)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import StreamingResponse

from api.deps import ServicesDep, SessionDep, VisibleJob
from api.schemas import errors
from scheduler.store import downloads
from scheduler.store.models import Job

router = APIRouter(prefix="/jobs", tags=["jobs"])


def _download(
    job: Job, found: downloads.Download, media_type: str, suffix: str
) -> StreamingResponse:
    """The file streamed as it is read, named after the job."""
    # A job's name is [A-Za-z0-9_.-] (the job language's rule), safe in a header.
    name = f"{job.name}-job{job.id}{suffix}"
    headers = {"Content-Disposition": f'attachment; filename="{name}"'}
    return StreamingResponse(found.chunks, media_type=media_type, headers=headers)


@router.get(
    "/{job_id}/metrics.csv",
    response_class=StreamingResponse,
    summary="A job's metrics as CSV",
    description="Every metric point, oldest first: `step,time,name,group,rank,value` (time in "
    "unix seconds as the worker took it; one row per point, a long table that pandas pivots "
    "with `trainyard`'s `Job.history()`). 413 past max_download_rows points.",
    responses={
        200: {"content": {"text/csv": {}}, "description": "the CSV file"},
        **errors(401, 404, 413, 422),
    },
)
def metrics_csv(job: VisibleJob, session: SessionDep, services: ServicesDep) -> StreamingResponse:
    found = downloads.metrics_csv(
        services.db.sessions, session, job.id, max_rows=services.settings.max_download_rows
    )
    return _download(job, found, "text/csv; charset=utf-8", ".csv")


@router.get(
    "/{job_id}/logs.txt",
    response_class=StreamingResponse,
    summary="A job's log as text",
    description="Every log line, oldest first, as `trainyard logs` prints them; a line of a "
    "worker other than the first starts with `[group/rank] `. 413 past max_download_rows lines.",
    responses={
        200: {"content": {"text/plain": {}}, "description": "the log"},
        **errors(401, 404, 413, 422),
    },
)
def logs_txt(job: VisibleJob, session: SessionDep, services: ServicesDep) -> StreamingResponse:
    found = downloads.logs_text(
        services.db.sessions, session, job.id, max_rows=services.settings.max_download_rows
    )
    return _download(job, found, "text/plain; charset=utf-8", ".log")


@router.get(
    "/{job_id}/tensorboard",
    response_class=StreamingResponse,
    summary="A job's TensorBoard event files (tar)",
    description="An uncompressed tar of the job's event files under `job-<id>/`: its scalars "
    "and its hyperparameters (HParams), the first worker's in `tensorboard/`, each other "
    "worker's in `workers/g<G>r<R>/tensorboard/`. Extract it and run `tensorboard --logdir`. "
    "A running job's are at most seconds behind. 413 past max_tensorboard_bytes.",
    responses={
        200: {
            "content": {"application/octet-stream": {}},
            "description": "the tar (an octet stream, as client generators read it)",
        },
        **errors(401, 404, 413, 422),
    },
)
def tensorboard_tar(job: VisibleJob, services: ServicesDep) -> StreamingResponse:
    found = downloads.tensorboard_tar(
        services.settings.artifacts(), job.id, max_bytes=services.settings.max_tensorboard_bytes
    )
    return _download(job, found, "application/octet-stream", "-tensorboard.tar")
