"""/datasets: upload files that jobs then name (`data: {source: dataset}`, `{source: text,
dataset: NAME}`), in one request or in parts that resume; delete them."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, File, Form, Path, Request, Response, UploadFile
from fastapi.concurrency import run_in_threadpool

from api.deps import CurrentUser, ServicesDep, SessionDep
from api.schemas import DatasetOut, PartOut, UploadOut, UploadStart, errors
from dsl.data_config import DATASET_NAME_PATTERN
from scheduler.admission import uploads
from scheduler.store.datasets import list_datasets
from scheduler.store.models import DatasetRecord, aware
from scheduler.store.uploads import UploadState

router = APIRouter(prefix="/datasets", tags=["datasets"])


@router.post(
    "",
    status_code=201,
    response_model=DatasetOut,
    summary="Upload a dataset",
    description="A numpy .npz archive (arrays x, y and optionally x_test, y_test), a numeric "
    ".csv table or a .tar of shards (unpacked into a folder), told apart by the file name's "
    "extension and checked by content. Jobs use it as `data: {source: dataset, name: NAME}` "
    "(a .tar of shards: `data: {source: shards, dataset: NAME}`). Names are unique per user "
    "(409 if taken); the size limit is the server's max_dataset_bytes (413); 403 if the "
    "user's datasets would pass their quota dataset_bytes.",
    responses=errors(400, 401, 403, 409, 413, 415, 422),
)
def upload_dataset(
    file: Annotated[UploadFile, File(description="the .npz or .csv file")],
    name: Annotated[
        str,
        Form(
            pattern=DATASET_NAME_PATTERN,
            description="the name jobs refer to: letters, digits, '_', '.', '-'",
        ),
    ],
    session: SessionDep,
    user: CurrentUser,
    services: ServicesDep,
) -> DatasetOut:
    record = uploads.upload_dataset(
        session,
        user,
        name=name,
        filename=file.filename or "",
        content=file.file,
        settings=services.settings,
    )
    return _dataset_out(record, user.name)


@router.get(
    "",
    response_model=list[DatasetOut],
    summary="List datasets",
    description="Your datasets; an admin sees every user's.",
    responses=errors(401),
)
def get_datasets(session: SessionDep, user: CurrentUser) -> list[DatasetOut]:
    return [_dataset_out(record, owner) for record, owner in list_datasets(session, user)]


@router.delete(
    "/{name}",
    status_code=204,
    summary="Delete a dataset",
    description="Deletes your dataset and frees its bytes of your quota. Refused (409, the "
    "jobs' and sweeps' ids in the message) while a queued or running job, or a running sweep, "
    "reads it.",
    responses=errors(401, 404, 409, 422),
)
def delete_dataset(
    name: Annotated[str, Path(pattern=DATASET_NAME_PATTERN)],
    session: SessionDep,
    user: CurrentUser,
    services: ServicesDep,
) -> Response:
    uploads.delete_dataset(session, user, name, services.settings)
    return Response(status_code=204)


OCTETS = "application/octet-stream"
BINARY = {"type": "string", "format": "binary"}
UploadId = Annotated[str, Path(pattern=r"^[0-9a-f]{32}$", description="the upload's id")]


@router.post(
    "/uploads",
    status_code=201,
    response_model=UploadOut,
    summary="Start a chunked upload",
    description="Declares the file (name, size, SHA-256, part size); its size counts against "
    "your quota dataset_bytes until it completes, is aborted or expires (after "
    "upload_expiry_seconds without a part). Then PUT each part and POST .../complete. "
    "403 past your quota; 409 if the name is taken or an upload of it is open, or you have "
    "max_open_uploads open; 415 for a kind not taken.",
    responses=errors(400, 401, 403, 409, 415, 422),
)
def start_upload(
    body: UploadStart, session: SessionDep, user: CurrentUser, services: ServicesDep
) -> UploadOut:
    start = uploads.StartUpload(**body.model_dump())
    return _upload_out(uploads.start_upload(session, user, start, services.settings))


@router.get(
    "/uploads",
    response_model=list[UploadOut],
    summary="List your open uploads",
    description="Your chunked uploads not completed, aborted or expired: what to resume.",
    responses=errors(401),
)
def list_uploads(session: SessionDep, user: CurrentUser, services: ServicesDep) -> list[UploadOut]:
    return [_upload_out(state) for state in uploads.list_uploads(session, user, services.settings)]


@router.get(
    "/uploads/{upload_id}",
    response_model=UploadOut,
    summary="An upload's state",
    description="Which parts arrived: a client resumes by sending the others.",
    responses=errors(401, 404, 422),
)
def get_upload(
    upload_id: UploadId, session: SessionDep, user: CurrentUser, services: ServicesDep
) -> UploadOut:
    return _upload_out(uploads.upload_state(session, user, upload_id, services.settings))


@router.put(
    "/uploads/{upload_id}/parts/{part}",
    response_model=PartOut,
    summary="Send one part",
    description="The body is the part's bytes (application/octet-stream): part n holds bytes "
    "n * part_size onwards, part_size of them (the last part the rest). Sending a part again "
    "replaces it. 422 for a part of another length or number.",
    responses=errors(401, 404, 409, 413, 422),
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {
                "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}
            },
        }
    },
)
async def put_part(
    upload_id: UploadId,
    part: Annotated[int, Path(ge=0, le=2**31 - 1)],
    request: Request,
    session: SessionDep,
    user: CurrentUser,
    services: ServicesDep,
) -> PartOut:
    # The body is bounded before it arrives (api/limits.py: max_upload_part_bytes).
    body = await request.body()
    size = await run_in_threadpool(
        uploads.put_part, session, user, upload_id, part, [body], services.settings
    )
    return PartOut(upload_id=upload_id, part=part, size=size)


@router.post(
    "/uploads/{upload_id}/complete",
    status_code=201,
    response_model=DatasetOut,
    summary="Complete an upload",
    description="Puts the parts together, checks the SHA-256 declared at the start, then the "
    "content (an .npz's arrays, a table's columns, UTF-8 text); a table with text columns or a "
    "Parquet file becomes a folder of npy shards with categories.json. Only then is the "
    "dataset there. 422 if parts are missing (nothing changes); a checksum or content that "
    "fails drops the upload (422, nothing stored or counted).",
    responses=errors(401, 403, 404, 409, 413, 415, 422),
)
def complete_upload(
    upload_id: UploadId, session: SessionDep, user: CurrentUser, services: ServicesDep
) -> DatasetOut:
    record = uploads.complete_upload(session, user, upload_id, services.settings)
    return _dataset_out(record, user.name)


@router.delete(
    "/uploads/{upload_id}",
    status_code=204,
    summary="Abort an upload",
    description="Deletes its parts and frees the bytes it held of your quota.",
    responses=errors(401, 404, 409, 422),
)
def abort_upload(
    upload_id: UploadId, session: SessionDep, user: CurrentUser, services: ServicesDep
) -> Response:
    uploads.abort_upload(session, user, upload_id, services.settings)
    return Response(status_code=204)


def _dataset_out(record: DatasetRecord, owner: str) -> DatasetOut:
    return DatasetOut(
        name=record.name,
        kind=record.kind,
        size=record.size,
        owner=owner,
        created_at=aware(record.created_at),
    )


def _upload_out(state: UploadState) -> UploadOut:
    upload = state.upload
    return UploadOut(
        id=upload.id,
        name=upload.name,
        filename=upload.filename,
        kind=upload.kind,
        size=upload.size,
        sha256=upload.sha256,
        part_size=upload.part_size,
        parts=state.parts,
        received=state.received,
        received_bytes=state.received_bytes,
        completing=upload.completing,
        created_at=aware(upload.created_at),
        expires_at=aware(upload.expires_at),
    )
