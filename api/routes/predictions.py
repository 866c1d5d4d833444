"""Batch prediction on the cluster: start a run of a job's (or a registered model's) checkpoint
over one of your datasets, follow it, download its scores. Your own runs only: another user's
answer 404."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path
from fastapi.responses import FileResponse

from api.deps import MAX_INT, CurrentUser, ServicesDep, SessionDep, VisibleJob
from api.routes.models import Name, Which
from api.schemas import PredictionCreate, PredictionOut, errors
from scheduler.admission.predict import PredictionRequest, start_prediction
from scheduler.store import predictions as prediction_store
from scheduler.store import registry
from scheduler.store.models import aware
from scheduler.store.states import JobState

router = APIRouter(tags=["predictions"])

PredictionId = Annotated[int, Path(ge=1, le=MAX_INT, description="the prediction run's id")]
CREATED = "The run is queued as a job of its own (`run_job_id`: its live stream, its place on "
"the cluster page), placed on worker slots like any job, under your quotas (running_jobs, "
"slots, queued_jobs). Its `workers` score disjoint shards of the dataset with the model's "
"inference net; a worker that fails is restarted and scores its shard again. At most "
"max_prediction_workers workers."


def prediction_out(found: prediction_store.PredictionView) -> PredictionOut:
    row, run = found.prediction, found.run
    return PredictionOut(
        id=row.id,
        job_id=row.job_id,
        model=row.model,
        run_job_id=row.run_job_id,
        dataset=row.dataset,
        rows=row.rows,
        step=row.step,
        workers=row.workers,
        probabilities=row.probabilities,
        state=JobState(run.state),
        progress=found.progress,
        rows_done=found.rows_done,
        error=run.error,
        created_at=aware(row.created_at),
        ended_at=aware(run.ended_at) if run.ended_at else None,
    )


def _request(body: PredictionCreate) -> PredictionRequest:
    checkpoint = body.checkpoint
    return PredictionRequest(
        dataset=body.dataset,
        checkpoint=int(checkpoint) if checkpoint and checkpoint.isdigit() else checkpoint,
        workers=body.workers,
        probabilities=body.probabilities,
        batch_size=body.batch_size,
    )


@router.post(
    "/jobs/{job_id}/predictions",
    status_code=201,
    response_model=PredictionOut,
    summary="Score a dataset with a job's model on the cluster",
    description=CREATED,
    responses=errors(400, 401, 403, 404, 409, 422, 429),
)
def create_job_prediction(
    job: VisibleJob,
    body: PredictionCreate,
    session: SessionDep,
    user: CurrentUser,
    services: ServicesDep,
) -> PredictionOut:
    row = start_prediction(session, user, job, _request(body), services.backends)
    return prediction_out(prediction_store.view(session, row))


@router.post(
    "/models/{name}/{which}/predictions",
    status_code=201,
    response_model=PredictionOut,
    summary="Score a dataset with a registered model on the cluster",
    description=CREATED,
    responses=errors(400, 401, 403, 404, 409, 422, 429),
)
def create_model_prediction(
    name: Name,
    which: Which,
    body: PredictionCreate,
    session: SessionDep,
    user: CurrentUser,
    services: ServicesDep,
) -> PredictionOut:
    request = _request(body)
    row = start_prediction(session, user, f"model:{name}@{which}", request, services.backends)
    return prediction_out(prediction_store.view(session, row))


@router.get(
    "/jobs/{job_id}/predictions",
    response_model=list[PredictionOut],
    summary="A job's prediction runs",
    description="Your prediction runs of the job's checkpoints, newest first.",
    responses=errors(401, 404, 422),
)
def job_predictions(job: VisibleJob, session: SessionDep, user: CurrentUser) -> list[PredictionOut]:
    return [prediction_out(v) for v in prediction_store.job_predictions(session, user, job.id)]


@router.get(
    "/models/{name}/{which}/predictions",
    response_model=list[PredictionOut],
    summary="A registered model's prediction runs",
    description="Your prediction runs of the model version (a number or a tag), newest first.",
    responses=errors(401, 404, 422),
)
def model_predictions(
    name: Name, which: Which, session: SessionDep, user: CurrentUser
) -> list[PredictionOut]:
    version = registry.get_model(session, user, name, int(which) if which.isdigit() else which)
    ref = f"{version.name}@{version.version}"
    return [prediction_out(v) for v in prediction_store.model_predictions(session, user, ref)]


@router.get(
    "/jobs/{job_id}/prediction",
    response_model=PredictionOut,
    summary="The prediction run a job places",
    description="For a job of kind `prediction`: the prediction run whose workers it places "
    "(rows scored, the model, the dataset); 404 for any other job.",
    responses=errors(401, 404, 422),
)
def run_of_job(job: VisibleJob, session: SessionDep, user: CurrentUser) -> PredictionOut:
    row = prediction_store.run_prediction(session, user, job.id)
    return prediction_out(prediction_store.view(session, row))


@router.get(
    "/predictions/{prediction_id}",
    response_model=PredictionOut,
    summary="A prediction run: its state and progress",
    responses=errors(401, 404, 422),
)
def show_prediction(
    prediction_id: PredictionId, session: SessionDep, user: CurrentUser
) -> PredictionOut:
    row = prediction_store.get_prediction(session, user, prediction_id)
    return prediction_out(prediction_store.view(session, row))


@router.get(
    "/predictions/{prediction_id}/output",
    response_class=FileResponse,
    summary="Download a prediction run's scores",
    description="One .npy of float32 scores (or probabilities), a row per sample of the "
    "dataset, in its order; ready once the run has SUCCEEDED (409 before).",
    responses={
        200: {"content": {"application/octet-stream": {}}, "description": "the scores (.npy)"},
        **errors(401, 404, 409, 422),
    },
)
def prediction_output(
    prediction_id: PredictionId, session: SessionDep, user: CurrentUser, services: ServicesDep
) -> FileResponse:
    row = prediction_store.get_prediction(session, user, prediction_id)
    found = prediction_store.view(session, row)
    path = prediction_store.output(row, found.run, services.settings.artifacts())
    return FileResponse(
        path,
        media_type="application/octet-stream",
        filename=f"predictions-{row.id}-{row.dataset}.npy",
    )
