"""The service's exports of a trained model (`GET /jobs/{id}/export`), bounded.

An export builds the job's net and traces it (torch.export, torch.onnx): seconds of CPU and the
net's memory. It runs in a process of its own (`python -m dsl.export`), killed past
`export_timeout_seconds`; at most `exports_at_once` run at a time in one API process (more are
answered 429 with Retry-After); a checkpoint past `max_export_bytes` is not exported, and
neither is a result past it. The file is written to a temporary folder that goes once the
answer is sent.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from fastapi import Query
from fastapi.responses import FileResponse
from sqlalchemy.orm import Session
from starlette.background import BackgroundTask

from contract.settings import Settings
from dsl.export import FORMATS, SUFFIXES, metadata_path
from scheduler.admission.rate_limit import RateLimited
from scheduler.store import reports as report_store
from scheduler.store.errors import InvalidRequest, NotFound, StoreError, TooLarge
from scheduler.store.models import Job, User

RETRY_SECONDS = 5

# What the export routes (a job's, a model version's) take and answer, declared once.
ExportFormat = Annotated[Literal["onnx", "torch-export"], Query(description="onnx or torch-export")]
Probabilities = Annotated[bool, Query(description="the output is the softmax of the class scores")]
EXPORT_FILE: dict[int | str, dict[str, Any]] = {
    200: {"content": {"application/octet-stream": {}}, "description": "the exported model"}
}


class ExportUnavailable(StoreError):
    """The export did not finish in the time the service allows it (503)."""


@dataclass(frozen=True)
class Export:
    folder: Path  # the temporary folder, removed once the answer is sent
    file: Path
    metadata: dict[str, object]


class Exporter:
    """Runs the exports of one API process, `at_once` at a time."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.slots = threading.BoundedSemaphore(settings.exports_at_once)

    def export_job(
        self,
        session: Session,
        user: User,
        job: Job,
        *,
        fmt: str,
        choice: str | int | None,
        probabilities: bool,
    ) -> Export:
        """The job's checkpoint that `choice` names, exported as `fmt`; the job must be the
        caller's own (others' answer 404 as if absent, an admin's included)."""
        if job.owner_id != user.id:
            raise NotFound(f"no job {job.id}")
        step, checkpoint = report_store.model_checkpoint(
            session, job.id, choice, artifacts=self.settings.artifacts()
        )
        label = f"{job.name}-job{job.id}-step{step}"
        return self.export_file(checkpoint, fmt=fmt, probabilities=probabilities, label=label)

    def export_file(self, checkpoint: Path, *, fmt: str, probabilities: bool, label: str) -> Export:
        """A checkpoint file exported as `fmt`, in `<label><suffix>` of a temporary folder."""
        if fmt not in FORMATS:
            raise InvalidRequest(f"format {fmt!r}: say one of {', '.join(FORMATS)}")
        limit = self.settings.max_export_bytes
        if checkpoint.stat().st_size > limit:
            raise TooLarge(
                f"the checkpoint of {label} is larger than the {limit:,} bytes the service "
                "exports (max_export_bytes); download it (trainyard download) and export the "
                "file where you are (trainyard export FILE)"
            )
        if not self.slots.acquire(blocking=False):
            raise RateLimited(
                f"the service is exporting {self.settings.exports_at_once} model(s) already; "
                f"retry in {RETRY_SECONDS} s",
                retry_after=RETRY_SECONDS,
            )
        folder = Path(tempfile.mkdtemp(prefix="trainyard-export-"))
        try:
            out = folder / f"{label}{SUFFIXES[fmt]}"
            self._run(checkpoint, fmt, out, probabilities, label)
            if out.stat().st_size > limit:
                raise TooLarge(
                    f"the export of {label} is larger than the {limit:,} bytes the service "
                    "sends (max_export_bytes)"
                )
            metadata: dict[str, object] = json.loads(metadata_path(out).read_text())
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            raise
        finally:
            self.slots.release()
        return Export(folder, out, metadata)

    def _run(self, checkpoint: Path, fmt: str, out: Path, probabilities: bool, label: str) -> None:
        command = [sys.executable, "-m", "dsl.export", str(checkpoint), fmt, str(out)]
        if probabilities:
            command.append("--probabilities")
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        seconds = self.settings.export_timeout_seconds
        try:
            done = subprocess.run(
                command, capture_output=True, text=True, timeout=seconds, env=env, check=False
            )
        except subprocess.TimeoutExpired:
            raise ExportUnavailable(
                f"the export of {label} took longer than the {seconds:g} s the service "
                "allows (export_timeout_seconds) and was stopped"
            ) from None
        if done.returncode == 2:
            reason = done.stderr.strip().splitlines()[-1].removeprefix("error: ")
            raise InvalidRequest(f"{label} cannot be exported as {fmt}: {reason}")
        if done.returncode != 0 or not out.is_file():
            last = (done.stderr.strip().splitlines() or ["no output"])[-1][:300]
            raise ExportUnavailable(f"the export of {label} as {fmt} failed: {last}")


def export_response(done: Export) -> FileResponse:
    """The exported file, its metadata in the `X-Trainyard-Model` header; its temporary folder
    goes once the answer is sent."""
    return FileResponse(
        done.file,
        media_type="application/octet-stream",
        filename=done.file.name,
        headers={"X-Trainyard-Model": json.dumps(done.metadata, sort_keys=True)},
        background=BackgroundTask(shutil.rmtree, done.folder, ignore_errors=True),
    )
