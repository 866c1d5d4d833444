"""Domain errors to HTTP: the one place status codes are chosen for failures.

Every error body is JSON `{"detail": "<message>", "errors": [...]}`; `errors` holds the job
language's located issues ({path, line, column, message, hint}) and is empty otherwise.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import redis
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import DataError, OperationalError
from starlette.exceptions import HTTPException

from api.exports import ExportUnavailable
from dsl.errors import JobSpecError
from scheduler.admission.policy import NotAllowed
from scheduler.admission.quotas import QuotaExceeded
from scheduler.admission.rate_limit import RateLimited
from scheduler.store.artifacts import UnsafePath
from scheduler.store.errors import (
    Conflict,
    InvalidRequest,
    NotFound,
    StoreError,
    TooLarge,
    UnsupportedKind,
)
from scheduler.store.lifecycle import IllegalTransition
from scheduler.store.webhooks import TooManyWebhooks

log = logging.getLogger("trainyard.api")


class ErrorResponse(JSONResponse):
    """An error answer quotes the request, which may hold lone surrogates (a YAML escape such
    as "\\ud800" in a key): written as ASCII JSON they are escaped, where UTF-8 cannot encode
    them at all."""

    def render(self, content: Any) -> bytes:
        text = json.dumps(content, ensure_ascii=True, allow_nan=False, separators=(",", ":"))
        return text.encode("ascii")


class PathScrubber:
    """Drops the server's own folders from a message meant for a client: an uploaded dataset's
    file by its file name alone (`<artifacts>/datasets/<user id>/` dropped), anything else
    under a private folder as `<its label>/...`."""

    def __init__(self, private: Mapping[Path, str]) -> None:
        labels = {str(path).rstrip("/"): label for path, label in private.items()}
        labels.pop("", None)
        folders = sorted(labels, key=len, reverse=True)  # the deepest first
        self._datasets = re.compile(
            "|".join(re.escape(f"{folder}/datasets/") + r"\d+/" for folder in folders) or "(?!)"
        )
        self._folders = re.compile(
            "|".join(re.escape(folder) + "(?=/|$)" for folder in folders) or "(?!)"
        )
        self._labels = labels

    def __call__(self, text: str) -> str:
        text = self._datasets.sub("", text)
        return self._folders.sub(lambda match: f"<{self._labels[match.group(0)]}>", text)


def error_response(
    status: int,
    detail: str,
    errors: list[dict[str, Any]] | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    return ErrorResponse({"detail": detail, "errors": errors or []}, status, headers=headers)


def status_of(error: StoreError) -> int:
    if isinstance(error, NotFound):
        return 404
    if isinstance(error, QuotaExceeded | NotAllowed | TooManyWebhooks):
        return 403
    if isinstance(error, RateLimited):
        return 429
    if isinstance(error, Conflict):
        return 409
    if isinstance(error, TooLarge):
        return 413
    if isinstance(error, UnsupportedKind):
        return 415
    if isinstance(error, InvalidRequest):
        return 422
    if isinstance(error, ExportUnavailable):
        return 503
    return 400


def describe_validation(error: RequestValidationError) -> str:
    """`query.limit: Input should be less than or equal to 1000; ...`"""
    parts = []
    for item in error.errors():
        where = ".".join(str(part) for part in item.get("loc", ()))
        parts.append(f"{where}: {item.get('msg', 'invalid')}" if where else item.get("msg", ""))
    return "; ".join(parts) or "invalid request"


def install_error_handlers(app: FastAPI, private: Mapping[Path, str] | None = None) -> None:
    """Every failure as its status and JSON body. No body names a path under `private` (the
    data and artifact directories, each with the label a message shows instead)."""
    scrub = PathScrubber(private or {})

    def answer(
        status: int,
        detail: str,
        errors: list[dict[str, Any]] | None = None,
        headers: dict[str, str] | None = None,
    ) -> JSONResponse:
        issues = [
            {k: scrub(v) if isinstance(v, str) else v for k, v in issue.items()}
            for issue in errors or []
        ]
        return error_response(status, scrub(detail), issues, headers)

    @app.exception_handler(JobSpecError)
    async def job_spec_error(_: Request, exc: JobSpecError) -> JSONResponse:
        count = len(exc.issues)
        detail = f"{count} problem{'s' if count != 1 else ''} in the job: " + "; ".join(
            f"{issue.where()}: {issue.message}" for issue in exc.issues[:3]
        )
        return answer(422, detail, exc.to_list())

    @app.exception_handler(StoreError)
    async def store_error(_: Request, exc: StoreError) -> JSONResponse:
        headers = {"Retry-After": str(exc.retry_after)} if isinstance(exc, RateLimited) else None
        return answer(status_of(exc), str(exc), headers=headers)

    @app.exception_handler(IllegalTransition)
    async def illegal_transition(_: Request, exc: IllegalTransition) -> JSONResponse:
        return answer(409, str(exc))

    @app.exception_handler(UnsafePath)
    async def unsafe_path(request: Request, exc: UnsafePath) -> JSONResponse:
        # A record that points out of the artifact directory: tampering or a bug elsewhere.
        log.warning("refused %s %s: %s", request.method, request.url.path, exc)
        return answer(403, str(exc))

    @app.exception_handler(RequestValidationError)
    async def request_validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        return answer(422, describe_validation(exc))

    @app.exception_handler(HTTPException)
    async def http_error(_: Request, exc: HTTPException) -> JSONResponse:
        return answer(
            exc.status_code, str(exc.detail), headers=dict(exc.headers) if exc.headers else None
        )

    @app.exception_handler(OperationalError)
    async def database_down(request: Request, exc: OperationalError) -> JSONResponse:
        log.error("database error on %s %s: %s", request.method, request.url.path, exc.orig)
        return answer(503, "the database is unavailable; try again shortly")

    @app.exception_handler(DataError)
    async def unstorable_value(request: Request, exc: DataError) -> JSONResponse:
        # A value the database refuses (PostgreSQL: a NUL in a text, a number out of its
        # column's range) that no check before the store caught: the client's to change.
        log.warning(
            "database refused a value on %s %s: %s", request.method, request.url.path, exc.orig
        )
        return answer(422, f"a value the database cannot store: {exc.orig}")

    @app.exception_handler(redis.ConnectionError)
    @app.exception_handler(redis.TimeoutError)
    async def redis_down(request: Request, exc: redis.RedisError) -> JSONResponse:
        log.error("Redis error on %s %s: %s", request.method, request.url.path, exc)
        return answer(503, "Redis is unavailable; try again shortly")

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        # A bug: tests show no input reaches here. Log it whole; tell the client little.
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return answer(500, "internal server error; the server log has the details")
