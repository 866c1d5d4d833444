"""A cap on request bodies, enforced while they arrive (before anything buffers them).

A declared Content-Length over the limit is refused at once; a body sent without one (chunked)
is counted as it streams and refused when it passes the limit. Either way the client gets the
API's JSON 413, and nothing of the request reaches the store.
"""

from __future__ import annotations

import json

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


def _content_length(scope: Scope) -> int | None:
    for name, value in scope["headers"]:
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


async def _send_413(send: Send, message: str) -> None:
    body = json.dumps({"detail": message, "errors": []}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 413,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
