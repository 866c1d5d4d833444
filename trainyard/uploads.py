"""Chunked, resumable dataset uploads from the client's side.

    client.upload_dataset("big.parquet", "big", progress=print)

The file's SHA-256 is computed first; an open upload of the same name, size and checksum on
the server (one interrupted, by a lost connection or a killed process) is resumed: only the
parts it lacks are sent. Parts are read from the file one at a time, so memory stays at one
part whatever the file's size.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import httpx

from trainyard.errors import Conflict
from trainyard.models import DatasetOut, UploadOut

if TYPE_CHECKING:
    from trainyard.client import Client

HASH_CHUNK = 1 << 20
# Completing reads the whole file on the server (checksum, checks, conversion): minutes for
# gigabytes, so that one request waits longer than the client's usual timeout.
COMPLETE_TIMEOUT = httpx.Timeout(30.0, read=3600.0)
# Bytes sent so far, bytes in all: called after every part (and once before the first).
Progress = Callable[[int, int], None]


class UploadClash(Conflict):
    """An upload of the name is open on the server for another file."""


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def open_uploads(client: Client) -> list[UploadOut]:
    return [UploadOut.model_validate(item) for item in client.get_json("/datasets/uploads")]


def upload_file(
    client: Client,
    path: Path,
    name: str,
    *,
    part_size: int | None = None,
    label_column: str | None = None,
    restart: bool = False,
    progress: Progress | None = None,
) -> DatasetOut:
    """Upload `path` as the dataset `name` in parts, resuming an interrupted upload of it;
    `restart` aborts an open upload of the name for another file (else UploadClash)."""
    size = path.stat().st_size
    digest = file_sha256(path)
    upload = _resume_or_start(client, path, name, size, digest, part_size, label_column, restart)
    done = upload.received_bytes
    if progress is not None:
        progress(done, size)
    have = set(upload.received)
    with path.open("rb") as handle:
        for number in range(upload.parts):
            if number in have:
                continue
            handle.seek(number * upload.part_size)
            body = handle.read(upload.part_size)
            client.request(
                "PUT",
                f"/datasets/uploads/{upload.id}/parts/{number}",
                content=body,
                headers={"content-type": "application/octet-stream"},
            )
            done += len(body)
            if progress is not None:
                progress(done, size)
    response = client.request(
        "POST", f"/datasets/uploads/{upload.id}/complete", timeout=COMPLETE_TIMEOUT
    )
    return DatasetOut.model_validate(response.json())


def _resume_or_start(
    client: Client,
    path: Path,
    name: str,
    size: int,
    digest: str,
    part_size: int | None,
    label_column: str | None,
    restart: bool,
) -> UploadOut:
    for upload in open_uploads(client):
        if upload.name != name:
            continue
        if upload.size == size and upload.sha256 == digest and upload.filename == path.name:
            return upload
        if not restart:
            raise UploadClash(
                f"an upload of '{name}' for another file ({upload.filename}, {upload.size} "
                f"bytes) is open on the server; restart to abort it (--restart)"
            )
        client.request("DELETE", f"/datasets/uploads/{upload.id}")
    body = {
        "name": name,
        "filename": path.name,
        "size": size,
        "sha256": digest,
        "part_size": part_size,
        "label_column": label_column,
    }
    response = client.request(
        "POST", "/datasets/uploads", json={k: v for k, v in body.items() if v is not None}
    )
    return UploadOut.model_validate(response.json())
