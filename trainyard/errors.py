"""The SDK's typed errors: every HTTP failure becomes one (`raise_for_response`); a rejected
job carries the language's located errors (`JobSpecRejected.errors`). `trainyard.client` exports
them too."""

from __future__ import annotations

import json
from collections.abc import Mapping

import httpx

from dsl.errors import SpecIssue


class TrainyardError(Exception):
    """Base of every SDK error; `status` is the HTTP status when there was a response."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


class Unreachable(TrainyardError):
    """No answer from the server (not started, wrong address, network)."""


class AuthError(TrainyardError):
    """401 (missing or bad token) or 403 (not allowed)."""


class NotFound(TrainyardError):
    """404: unknown id, or a job of another user."""


class Conflict(TrainyardError):
    """409: the request does not fit the resource's state (e.g. cancel a finished job)."""


class RequestRejected(TrainyardError):
    """Another 4xx: body too big (413), wrong content type (415), a bad query parameter (422
    without located job errors)."""


class JobSpecRejected(RequestRejected):
    """422: the job document is invalid; `errors` locate each problem in the YAML."""

    def __init__(self, message: str, errors: list[SpecIssue], status: int = 422) -> None:
        super().__init__(message, status)
        self.errors = errors

    def __str__(self) -> str:
        # The server's detail already lists the problems; print them once, located.
        lines = [self.message.splitlines()[0] if self.errors else self.message]
        for issue in self.errors:
            where = f"{issue.line}:{issue.column}: " if issue.line else ""
            lines.append(f"  error {where}{issue.path}: {issue.message}")
            if issue.hint:
                lines.append(f"      hint: {issue.hint}")
        return "\n".join(lines)


class ServerError(TrainyardError):
    """5xx: the server failed; the message is what it said."""


class WaitTimeout(TrainyardError, TimeoutError):
    """`Job.wait(timeout=...)` ran out before the job finished."""


_BY_STATUS: dict[int, type[TrainyardError]] = {
    401: AuthError,
    403: AuthError,
    404: NotFound,
    409: Conflict,
}


def _issues(raw: object) -> list[SpecIssue]:
    if not isinstance(raw, list):
        return []
    out = []
    for item in raw:
        if isinstance(item, Mapping):
            out.append(
                SpecIssue(
                    path=str(item.get("path", "")),
                    message=str(item.get("message", "")),
                    line=item.get("line"),
                    column=item.get("column"),
                    hint=item.get("hint"),
                )
            )
    return out


def raise_for_response(response: httpx.Response) -> None:
    """Translate an error response (`{"detail": ..., "errors": [...]}`) to a typed exception."""
    if response.is_success:
        return
    status = response.status_code
    try:
        body = response.json()
    except ValueError:
        body = None
    detail = body.get("detail") if isinstance(body, dict) else None
    if not isinstance(detail, str):
        detail = (
            json.dumps(detail) if detail is not None else (response.text or response.reason_phrase)
        )
    message = f"{status} {detail}"
    errors = _issues(body.get("errors") if isinstance(body, dict) else None)
    if status == 422 and errors:
        raise JobSpecRejected(message, errors, status)
    if status >= 500:
        raise ServerError(message, status)
    raise _BY_STATUS.get(status, RequestRejected)(message, status)
