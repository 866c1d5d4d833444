"""/models: the model registry. Register a job's checkpoint as a version of a named model,
list, show, tag, download, export and delete them. Users see their own models alone."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Response
from fastapi.responses import FileResponse

from api.deps import CurrentUser, ServicesDep, SessionDep
from api.exports import EXPORT_FILE, ExportFormat, Probabilities, export_response
from api.schemas import ModelRegister, ModelTag, ModelVersionOut, errors, finite
from dsl.data_config import DATASET_NAME_PATTERN
from scheduler.store import registry
from scheduler.store.models import ModelVersion, aware

router = APIRouter(prefix="/models", tags=["models"])

Name = Annotated[str, Path(pattern=DATASET_NAME_PATTERN, description="the model's name")]
Which = Annotated[
    str,
    Path(
        pattern=r"^([0-9]{1,10}|[A-Za-z][A-Za-z0-9_.\-]{0,49})$",
        description="a version number, or a tag (the version it is on)",
    ),
]
Version = Annotated[int, Path(ge=1, le=2**31 - 1, description="the version")]


def version_out(row: ModelVersion) -> ModelVersionOut:
    return ModelVersionOut(
        name=row.name,
        version=row.version,
        ref=f"{row.name}@{row.version}",
        tags=list(row.tags or []),
        job_id=row.job_id,
        job_name=row.job_name,
        step=row.step,
        size=row.size,
        objective=row.objective,
        objective_mode=row.objective_mode,
        objective_value=finite(row.objective_value),
        metrics=finite(row.metrics or {}),
        input=dict(row.data),
        spec=row.spec,
        created_at=aware(row.created_at),
    )


def _which(text: str) -> int | str:
    return int(text) if text.isdigit() else text


@router.post(
    "",
    status_code=201,
    response_model=ModelVersionOut,
    summary="Register a job's checkpoint as a model version",
    description="A new version (name@1, @2, ...) of your model `name`: the checkpoint of one of "
    "your jobs (`checkpoint`: best, latest or a step; default the best where it kept one), "
    "kept apart from the job, with the job's objective value, spec, data facts and summary.",
    responses=errors(400, 401, 404, 409, 422),
)
def register_model(
    body: ModelRegister, session: SessionDep, user: CurrentUser, services: ServicesDep
) -> ModelVersionOut:
    checkpoint = body.checkpoint
    choice = int(checkpoint) if checkpoint and checkpoint.isdigit() else checkpoint
    row = registry.register_model(
        session,
        user,
        name=body.name,
        job_id=body.job_id,
        checkpoint=choice,
        artifacts=services.settings.artifacts(),
    )
    return version_out(row)


@router.get(
    "",
    response_model=list[ModelVersionOut],
    summary="Your models",
    description="Every version of your models, by name, then version.",
    responses=errors(401),
)
def list_models(session: SessionDep, user: CurrentUser) -> list[ModelVersionOut]:
    return [version_out(row) for row in registry.list_models(session, user)]


@router.get(
    "/{name}/{which}",
    response_model=ModelVersionOut,
    summary="One version of a model",
    description="`which`: a version number, or a tag (the version it is on).",
    responses=errors(401, 404, 422),
)
def show_model(name: Name, which: Which, session: SessionDep, user: CurrentUser) -> ModelVersionOut:
    return version_out(registry.get_model(session, user, name, _which(which)))


@router.get(
    "/{name}/{which}/checkpoint",
    response_class=FileResponse,
    summary="Download a model version's checkpoint",
    description="The safetensors file, its model card in its metadata (trainyard.load_model).",
    responses={
        200: {"content": {"application/octet-stream": {}}, "description": "safetensors file"},
        **errors(401, 404, 422),
    },
)
def download_model(
    name: Name, which: Which, session: SessionDep, user: CurrentUser
) -> FileResponse:
    row = registry.get_model(session, user, name, _which(which))
    return FileResponse(
        registry.model_file(row),
        media_type="application/octet-stream",
        filename=f"{row.name}-v{row.version}.safetensors",
        headers={"X-Trainyard-Version": str(row.version)},
    )


@router.get(
    "/{name}/{which}/export",
    response_class=FileResponse,
    summary="Export a model version (ONNX or torch.export)",
    description="As GET /jobs/{id}/export, for a registered version.",
    responses={**EXPORT_FILE, **errors(401, 404, 413, 422, 429, 503)},
)
def export_model(
    name: Name,
    which: Which,
    session: SessionDep,
    user: CurrentUser,
    services: ServicesDep,
    format: ExportFormat,
    probabilities: Probabilities = False,
) -> FileResponse:
    row = registry.get_model(session, user, name, _which(which))
    done = services.exporter.export_file(
        registry.model_file(row),
        fmt=format,
        probabilities=probabilities,
        label=f"{row.name}-v{row.version}",
    )
    return export_response(done)


@router.post(
    "/{name}/{version}/tags",
    response_model=ModelVersionOut,
    summary="Tag a model version",
    description="Puts the tag (e.g. production) on this version, taking it off the version of "
    "the same name that had it.",
    responses=errors(400, 401, 404, 409, 422),
)
def tag_model(
    name: Name, version: Version, body: ModelTag, session: SessionDep, user: CurrentUser
) -> ModelVersionOut:
    return version_out(registry.tag_model(session, user, name, version, body.tag))


@router.delete(
    "/{name}/{version}/tags/{tag}",
    response_model=ModelVersionOut,
    summary="Take a tag off a model version",
    responses=errors(401, 404, 422),
)
def untag_model(
    name: Name,
    version: Version,
    tag: Annotated[str, Path(pattern=r"^[A-Za-z][A-Za-z0-9_.\-]{0,49}$")],
    session: SessionDep,
    user: CurrentUser,
) -> ModelVersionOut:
    return version_out(registry.untag_model(session, user, name, version, tag))


@router.delete(
    "/{name}/{version}",
    status_code=204,
    summary="Delete a model version",
    description="The version and its file; its job and the job's checkpoints stay.",
    responses=errors(401, 404, 422),
)
def delete_model(name: Name, version: Version, session: SessionDep, user: CurrentUser) -> Response:
    registry.delete_model(session, user, name, version)
    return Response(status_code=204)
