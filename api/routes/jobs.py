"""/jobs: submit, validate, list, inspect, cancel and delete jobs, and read their records."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Response
from fastapi.responses import FileResponse

from api.deps import (
    MAX_INT,
    CurrentUser,
    JobId,
    Services,
    ServicesDep,
    SessionDep,
    VisibleJob,
)
from api.exports import EXPORT_FILE, ExportFormat, Probabilities, export_response
from api.schemas import (
    CheckpointOut,
    EventOut,
    GraphOut,
    JobDetail,
    JobPage,
    LayerOut,
    LogLineOut,
    LogsOut,
    MemoryOut,
    MetricNames,
    MetricsOut,
    PipelinePlanOut,
    PlacementOut,
    SeriesOut,
    ValidationOut,
    errors,
    finite,
)
from api.submission import SUBMIT_BODY, SubmissionDep
from dsl.compiler import CompiledJob
from dsl.objective import job_warnings
from dsl.overrides import override_lines
from dsl.schema import JobSpec
from scheduler.admission import submit
from scheduler.admission.checks import check_job
from scheduler.store import jobs as job_store
from scheduler.store import predictions as prediction_store
from scheduler.store import reports as report_store
from scheduler.store.models import JOB_FIELD_KINDS, FieldKind, Job, User, aware, utcnow
from scheduler.store.states import JobState

router = APIRouter(prefix="/jobs", tags=["jobs"])


def job_fields(job: Job, owner: str, position: int | None, end: int) -> dict[str, Any]:
    """The JobOut fields of a job (the spec_yaml of the detail view aside), its progress
    ending at `end` (scheduler/store/predictions.py progress_ends); a listed page has the same
    fields, computed by the database (scheduler/store/job_page.py)."""
    started = aware(job.started_at) if job.started_at else None
    ended = aware(job.ended_at) if job.ended_at else None
    computed = {
        "owner": owner,
        "progress": min(job.step / end, 1.0) if end > 0 else 0.0,
        "duration_seconds": ((ended or utcnow()) - started).total_seconds() if started else None,
        "queue_position": position,
    }
    return {
        name: computed[name] if name in computed else _as_field(kind, getattr(job, name))
        for name, kind in JOB_FIELD_KINDS.items()
    }


def _as_field(kind: FieldKind, value: Any) -> Any:
    """A Job column's value as its JobOut field, by the field's type."""
    if kind == "time":
        return aware(value) if value else None
    if kind == "document":
        return finite(value or {})
    if kind == "float":
        return finite(value)
    return value


def detail_of(session: SessionDep, job: Job) -> JobDetail:
    owner = job_store.owner_names(session, {job.owner_id})[job.owner_id]
    position = (
        job_store.queue_positions(session).get(job.id) if job.state == JobState.QUEUED else None
    )
    end = prediction_store.progress_ends(session, [job])[job.id]
    return JobDetail(
        **job_fields(job, owner, position, end),
        spec_yaml=job.spec_yaml,
        effective_yaml=job.effective_yaml,
        override_lines=override_lines(job.effective_yaml, job.overrides)
        if job.effective_yaml is not None
        else {},
        warnings=job_warnings(JobSpec.model_validate(job.spec)),
    )


def compiled_job(job: Job, user: User, session: SessionDep, services: Services) -> CompiledJob:
    """The job's stored spec compiled (shapes only, on the meta device); cached by id, as a
    job's spec never changes."""
    compiled = services.graphs.get(job.id)
    if compiled is None:
        compiled = check_job(
            JobSpec.model_validate(job.spec),
            session=session,
            owner=user,
            cache_dir=services.settings.cache_dir(),
            base_dir=services.settings.resolved_data_dir(),
            artifacts=services.settings.artifacts(),
        ).compiled
        services.graphs.put(job.id, compiled)
    return compiled


@router.post(
    "",
    status_code=201,
    response_model=JobDetail,
    summary="Submit a job",
    description="The body is the job's YAML (application/yaml, application/x-yaml, text/yaml "
    "or text/plain) or JSON `{spec, overrides, priority}`. The job is validated and compiled "
    "first (422 with located errors if it is not valid), then queued. A document with a "
    "`search` section is a sweep: 422 here, POST /sweeps takes it. 403 for a priority above "
    "the default (admins only) or a job past the user's quotas, 429 past the submission rate.",
    openapi_extra=SUBMIT_BODY,
    responses=errors(401, 403, 413, 415, 422, 429),
)
def submit_job(
    user: CurrentUser, submission: SubmissionDep, session: SessionDep, services: ServicesDep
) -> JobDetail:
    job = submit.submit_job(session, user, submission, services.backends)
    return detail_of(session, job)


@router.post(
    "/validate",
    response_model=ValidationOut,
    summary="Validate a job without submitting it",
    description="A dry run of POST /jobs: the layer table with output shapes and parameter "
    "counts, the resolved topology, each worker's estimated peak memory, where the scheduler "
    "would place the job right now and, "
    "for a pipelined job, its stages as the planner cuts them (estimated costs). "
    "For a sweep, its base job's, with every value of its search space checked too. 403 for a "
    "`base_dir` from a user who is not an admin; 429 past the user's validations_per_minute.",
    openapi_extra=SUBMIT_BODY,
    responses=errors(401, 403, 413, 415, 422, 429),
)
def validate_job(
    user: CurrentUser, submission: SubmissionDep, session: SessionDep, services: ServicesDep
) -> ValidationOut:
    validated = submit.validate(session, user, submission, services.backends)
    checked, compiled = validated.job, validated.job.compiled
    return ValidationOut(
        name=compiled.spec.name,
        layers=[LayerOut(**row.__dict__) for row in compiled.table],
        total_params=compiled.total_params,
        topology=checked.topology.to_dict(),
        memory=MemoryOut(
            total_mb=checked.memory.total_mb,
            **{f"{part}_mb": mb for part, mb in checked.memory.parts().items()},
        ),
        placement=PlacementOut.model_validate(asdict(validated.preview)),
        pipeline=PipelinePlanOut.model_validate(checked.plan.to_dict()) if checked.plan else None,
    )


@router.get(
    "",
    response_model=JobPage,
    summary="List jobs",
    description="Newest first. A user sees their own jobs, an admin every job. Filter by "
    "state (repeatable) and by a part of the name; page with the returned next_cursor.",
    responses=errors(401, 422),
)
def list_jobs(
    session: SessionDep,
    user: CurrentUser,
    state: Annotated[list[JobState] | None, Query(description="only jobs in these states")] = None,
    name: Annotated[
        str | None, Query(max_length=100, description="only names containing this")
    ] = None,
    limit: Annotated[int, Query(ge=1, le=1000, description="page size")] = 50,
    cursor: Annotated[
        str | None, Query(max_length=200, description="next_cursor of the previous page")
    ] = None,
) -> Response:
    items, next_cursor = job_store.list_jobs(
        session, user, states=state, name=name, limit=limit, cursor=cursor
    )
    # The database wrote the items (JobOut objects; tests hold them to the model and to the
    # detail view): the API's busiest read neither converts nor validates them again here.
    body = f'{{"items":{items},"next_cursor":{json.dumps(next_cursor)}}}'
    return Response(body, media_type="application/json")


@router.get(
    "/{job_id}",
    response_model=JobDetail,
    summary="Get a job",
    responses=errors(401, 404, 422),
)
def get_job(job: VisibleJob, session: SessionDep) -> JobDetail:
    return detail_of(session, job)


@router.post(
    "/{job_id}/cancel",
    response_model=JobDetail,
    summary="Cancel a job",
    description="A queued job is cancelled at once; a scheduled or running one when its node "
    "agents have stopped its processes (within seconds; `cancel_requested` is true meanwhile). "
    "409 if the job has already ended.",
    responses=errors(401, 404, 409, 422),
)
def cancel_job(
    job_id: JobId,
    session: SessionDep,
    user: CurrentUser,
    services: ServicesDep,
) -> JobDetail:
    job = job_store.cancel_job(session, user, job_id, services.redis, services.keys)
    return detail_of(session, job)


@router.delete(
    "/{job_id}",
    status_code=204,
    response_class=Response,
    summary="Delete a finished job",
    description="Removes the job, its records and its files. 409 unless the job has ended; "
    "403 (and nothing removed) if a recorded file lies outside the artifact directory.",
    responses=errors(401, 403, 404, 409, 422),
)
def delete_job(job: VisibleJob, session: SessionDep, services: ServicesDep) -> Response:
    job_store.delete_job(
        session,
        job,
        artifacts=services.settings.artifacts(),
        client=services.redis,
        keys=services.keys,
    )
    services.graphs.drop(job.id)
    return Response(status_code=204)


@router.get(
    "/{job_id}/metrics",
    response_model=MetricsOut,
    summary="Metric series of a job",
    description="One series per (name, worker group, rank). A series longer than max_points "
    "is cut into max_points equal step ranges, keeping the last point of each. A name the job "
    "never reported is a 404 with a did-you-mean once the job has SUCCEEDED (or was PRUNED); "
    "before that it reads as no series (the job may report it later).",
    responses=errors(401, 404, 422),
)
def job_metrics(
    job: VisibleJob,
    session: SessionDep,
    name: Annotated[
        list[str] | None, Query(description="metric names (repeatable); default all")
    ] = None,
    start_step: Annotated[int | None, Query(ge=0, le=MAX_INT)] = None,
    end_step: Annotated[int | None, Query(ge=0, le=MAX_INT)] = None,
    group: Annotated[int | None, Query(ge=0, le=MAX_INT, description="worker group")] = None,
    max_points: Annotated[int, Query(ge=1, le=100_000, description="per series")] = 1000,
) -> MetricsOut:
    report_store.check_metric_names(session, job, name or [])
    series = report_store.metric_series(
        session,
        job.id,
        names=name,
        start_step=start_step,
        end_step=end_step,
        group=group,
        max_points=max_points,
    )
    return MetricsOut(
        series=[
            SeriesOut(name=s.name, group=s.group, rank=s.rank, points=finite(s.points))
            for s in series
        ]
    )


@router.get(
    "/{job_id}/metrics/names",
    response_model=MetricNames,
    summary="Names of a job's metrics",
    responses=errors(401, 404, 422),
)
def job_metric_names(job: VisibleJob, session: SessionDep) -> MetricNames:
    return MetricNames(names=report_store.metric_names(session, job.id))


@router.get(
    "/{job_id}/logs",
    response_model=LogsOut,
    summary="Log lines of a job",
    description="Oldest first; follow a job by passing the returned `next` as `after`.",
    responses=errors(401, 404, 422),
)
def job_logs(
    job: VisibleJob,
    session: SessionDep,
    after: Annotated[int, Query(ge=0, le=2**63 - 1, description="a line id")] = 0,
    limit: Annotated[int, Query(ge=1, le=5000)] = 500,
) -> LogsOut:
    lines, next_id = report_store.log_lines(session, job.id, after=after, limit=limit)
    return LogsOut(
        lines=[
            LogLineOut(id=ln.id, at=ln.at, group=ln.group, rank=ln.rank, line=ln.line)
            for ln in lines
        ],
        next=next_id,
    )


@router.get(
    "/{job_id}/events",
    response_model=list[EventOut],
    summary="State transitions of a job",
    responses=errors(401, 404, 422),
)
def job_events(job: VisibleJob, session: SessionDep) -> list[EventOut]:
    return [
        EventOut(at=aware(event.at), state=JobState(event.state), reason=event.reason)
        for event in job_store.job_events(session, job.id)
    ]


@router.get(
    "/{job_id}/graph",
    response_model=GraphOut,
    summary="The compiled net of a job",
    description="Layers with output shapes and parameter counts, and the edges between them.",
    responses=errors(401, 404, 422),
)
def job_graph(
    job: VisibleJob, user: CurrentUser, session: SessionDep, services: ServicesDep
) -> GraphOut:
    # Stored when the job was admitted; a job stored before is compiled (and cached) here.
    graph = job.graph or compiled_job(job, user, session, services).graph()
    return GraphOut.model_validate(graph)


@router.get(
    "/{job_id}/checkpoints",
    response_model=list[CheckpointOut],
    summary="Checkpoints of a job",
    description="The checkpoints still on disk, oldest first; `best` marks the objective's "
    "best of them: the one checkpoint.keep_best kept, else the one whose step has the best "
    "value of the objective.",
    responses=errors(401, 404, 422),
)
def job_checkpoints(
    job: VisibleJob, session: SessionDep, services: ServicesDep
) -> list[CheckpointOut]:
    kept = report_store.checkpoints(session, job.id, artifacts=services.settings.artifacts())
    best = report_store.best_checkpoint(session, job.id, kept)
    return [
        CheckpointOut(step=c.step, size=c.size, created_at=aware(c.created_at), best=c.step == best)
        for c in kept
    ]


@router.get(
    "/{job_id}/checkpoints/{step}",
    response_class=FileResponse,
    summary="Download a checkpoint",
    description="The safetensors file of the checkpoint at `step`.",
    responses={
        200: {"content": {"application/octet-stream": {}}, "description": "safetensors file"},
        **errors(401, 403, 404, 422),
    },
)
def download_checkpoint(
    job: VisibleJob,
    session: SessionDep,
    services: ServicesDep,
    step: Annotated[int, Path(ge=0, le=MAX_INT, description="the checkpoint's training step")],
) -> FileResponse:
    artifacts = services.settings.artifacts()
    _, path = report_store.checkpoint_file(session, job.id, step, artifacts=artifacts)
    return FileResponse(
        path,
        media_type="application/octet-stream",
        filename=f"{job.name}-job{job.id}-step{step}.safetensors",
    )


CheckpointChoice = Annotated[
    str | None,
    Query(
        pattern=r"^(best|latest|[0-9]{1,10})$",
        description="best, latest or a step; default the best where one was kept, else the latest",
    ),
]


@router.get(
    "/{job_id}/export",
    response_class=FileResponse,
    summary="Export a trained model (ONNX or torch.export)",
    description="The job's net for prediction, as an ONNX file with a dynamic batch axis or a "
    "torch.export program (.pt2); its metadata (input name, shape and dtype, output, a text "
    "job's vocabulary) in the `X-Trainyard-Model` header (JSON) and inside the file. Your own "
    "jobs only. Bounded: one export at a time per API process (429), max_export_bytes (413), "
    "export_timeout_seconds (503).",
    responses={**EXPORT_FILE, **errors(401, 404, 413, 422, 429, 503)},
)
def export_model(
    job: VisibleJob,
    user: CurrentUser,
    session: SessionDep,
    services: ServicesDep,
    format: ExportFormat,
    checkpoint: CheckpointChoice = None,
    probabilities: Probabilities = False,
) -> FileResponse:
    choice = int(checkpoint) if checkpoint and checkpoint.isdigit() else checkpoint
    done = services.exporter.export_job(
        session, user, job, fmt=format, choice=choice, probabilities=probabilities
    )
    return export_response(done)
