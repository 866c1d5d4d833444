"""The connection to one Trainyard server: its HTTP client (httpx) with retries, and the two
ways every request of the Python client goes: `request` (an answer whose failure becomes a
typed exception, trainyard/errors.py) and `download` (a streamed file, whole or not at all).
`Client` (trainyard/client.py) builds on it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Self

import httpx
from httpx_retries import Retry, RetryTransport

from contract.settings import Settings
from trainyard.connection import resolve_connection
from trainyard.errors import TrainyardError, Unreachable, raise_for_response

API_PREFIX = "/api/v1"

# Idempotent requests (GET, PUT, DELETE, ...) are retried on 429, 502, 503, 504 and on
# connection errors, waiting what Retry-After says (at most MAX_RETRY_WAIT), else backing off
# exponentially; a submission (POST) is never sent twice.
RETRIES = 5
MAX_RETRY_WAIT = 60.0


def retrying_transport(retries: int) -> RetryTransport:
    """httpx-retries' transport: Retry-After honoured, jittered exponential back-off."""
    return RetryTransport(
        retry=Retry(total=retries, backoff_factor=0.5, max_backoff_wait=MAX_RETRY_WAIT)
    )


class Connection:
    """An HTTP client of one server's API, authenticated by a token (thread-safe for
    concurrent requests, like httpx)."""

    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        *,
        timeout: float = 30.0,
        retries: int = RETRIES,
        settings: Settings | None = None,
    ) -> None:
        if url is None or token is None:
            found = resolve_connection(settings or Settings())
            url = url or found.url
            token = token or found.token
        if not url:
            raise TrainyardError(
                "no server address: pass url=, set TRAINYARD_URL, run `trainyard login URL`, "
                "or start a local stack with `trainyard up`"
            )
        self.url = url.rstrip("/")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.http = httpx.Client(
            base_url=self.url + API_PREFIX,
            headers=headers,
            timeout=timeout,
            transport=retrying_transport(retries),
        )

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            response = self.http.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise Unreachable(
                f"cannot reach {self.url} ({exc.__class__.__name__}: {exc}); is the server "
                "running (`trainyard up`)?"
            ) from None
        raise_for_response(response)
        return response

    def get_json(self, path: str, **params: Any) -> Any:
        clean = {k: v for k, v in params.items() if v is not None}
        return self.request("GET", path, params=clean).json()

    def download(
        self,
        url: str,
        target: Path,
        *,
        params: dict[str, Any] | None = None,
        metadata: bool = False,
    ) -> Path:
        """GET `url` streamed into `target` (whole or not at all); with `metadata`, the
        answer's X-Trainyard-Model header also into `<target>.json`."""
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(target.name + ".part")
        try:
            with self.http.stream("GET", url, params=params, timeout=None) as response:
                if not response.is_success:
                    response.read()
                    raise_for_response(response)
                header = response.headers.get("x-trainyard-model", "{}")
                with partial.open("wb") as handle:
                    for chunk in response.iter_bytes():
                        handle.write(chunk)
        except httpx.TransportError as exc:
            partial.unlink(missing_ok=True)
            raise Unreachable(f"cannot reach {self.url} ({exc})") from None
        partial.replace(target)
        if metadata:
            text = json.dumps(json.loads(header), indent=2, sort_keys=True) + "\n"
            target.with_name(target.name + ".json").write_text(text)
        return target
