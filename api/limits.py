"""What a request may be before any route reads it: a cap on bodies, enforced while they
arrive (before anything buffers them), and no NUL character in its address.

A declared Content-Length over the limit is refused at once; a body sent without one (chunked)
is counted as it streams and refused when it passes the limit. Either way the client gets the
API's JSON 413, and nothing of the request reaches the store. A NUL in the path or a query
parameter (`?name=a%00b`) is refused with a 422 naming the parameter: no text column of
PostgreSQL can hold one, and no name or id of ours contains one.
"""

from __future__ import annotations

import json
from urllib.parse import parse_qsl

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send


def too_large(limit: int) -> str:
    return f"the request body is larger than the limit of {limit} bytes"


class BodyLimit:
    """Pure ASGI middleware: `limits` maps path prefixes to (byte limit, message when passed);
    the longest matching prefix wins, other paths get `default` bytes."""

    def __init__(
        self, app: ASGIApp, *, default: int, limits: dict[str, tuple[int, str]] | None = None
    ) -> None:
        self.app = app
        self.default = (default, too_large(default))
        self.limits = sorted((limits or {}).items(), key=lambda item: -len(item[0]))

    def limit_for(self, path: str) -> tuple[int, str]:
        for prefix, limit in self.limits:
            if path.startswith(prefix):
                return limit
        return self.default

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit, refusal = self.limit_for(scope["path"])
        declared = _content_length(scope)
        if declared is not None and declared > limit:
            await _send_413(send, refusal)
            return
        received = 0

        async def counted() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    # Raised inside the route's body read; the error handlers answer it.
                    raise HTTPException(413, refusal)
            return message

        await self.app(scope, counted, send)


class NoNul:
    """Pure ASGI middleware: a 422 for a NUL character in the path or in a query parameter."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            problem = nul_in_address(
                scope["path"], scope.get("query_string", b"").decode("latin-1")
            )
            if problem is not None:
                await _send_error(send, 422, problem)
                return
        await self.app(scope, receive, send)


def nul_in_address(path: str, query: str) -> str | None:
    """Where a NUL character is, as the API's 422s name a place (`query.name: ...`), or None."""
    if "\0" in path:
        return "path: holds a NUL character"
    if "%00" not in query and "\0" not in query:
        return None
    for name, value in parse_qsl(query, keep_blank_values=True):
        if "\0" in value or "\0" in name:
            return f"query.{name.replace(chr(0), '?')}: holds a NUL character"
    return None


def _content_length(scope: Scope) -> int | None:
    for name, value in scope["headers"]:
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


async def _send_413(send: Send, message: str) -> None:
    await _send_error(send, 413, message)


async def _send_error(send: Send, status: int, message: str) -> None:
    body = json.dumps({"detail": message, "errors": []}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
