"""/datasets: upload .npz and .csv files that jobs then name (`data: {source: dataset}`)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, File, Form, UploadFile

from api.deps import CurrentUser, ServicesDep, SessionDep
from api.schemas import DatasetOut, errors
from dsl.data_config import DATASET_NAME_PATTERN
from scheduler.admission import uploads
from scheduler.store.datasets import list_datasets
from scheduler.store.models import aware

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
    return DatasetOut(
        name=record.name,
        kind=record.kind,
        size=record.size,
        owner=user.name,
        created_at=aware(record.created_at),
    )


@router.get(
    "",
    response_model=list[DatasetOut],
    summary="List datasets",
    description="Your datasets; an admin sees every user's.",
    responses=errors(401),
)
def get_datasets(session: SessionDep, user: CurrentUser) -> list[DatasetOut]:
    return [
        DatasetOut(
            name=record.name,
            kind=record.kind,
            size=record.size,
            owner=owner,
            created_at=aware(record.created_at),
        )
        for record, owner in list_datasets(session, user)
    ]
