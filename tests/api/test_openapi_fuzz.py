"""Schemathesis against the API's own OpenAPI document, in-process (ASGI) on a real SQLite
store and the session's real Redis, with a valid token: every operation, generated inputs
(valid and not), no 5xx, and every response as the document declares it (status code,
content type, body schema, headers).

Excluded: GET /jobs/{id}/stream, a server-sent event stream that stays open while the job
lives (tests/api/test_stream.py covers it over a real server). Nothing here trains: the app
runs without a scheduler or node agents, so submitted jobs stay QUEUED.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error
from schemathesis.generation.modes import GenerationMode
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from api.app import create_app
from tests.api.conftest import example, make_settings, start_api

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    response_headers_conformance,
]
# ~25 operations x this many examples stays well under two minutes on a busy machine.
EXAMPLES_PER_OPERATION = 40


@pytest.fixture(scope="module")
def token_and_app(
    tmp_path_factory: pytest.TempPathFactory, sqlite_template: Path, redis_url: str
) -> Iterator[tuple[str, Any]]:
    base = tmp_path_factory.mktemp("openapi-fuzz")
    database = base / "trainyard.db"
    shutil.copyfile(sqlite_template, database)
    settings_ = make_settings(base, f"sqlite:///{database}", redis_url, max_dataset_bytes=200_000)
    db, tokens, _ = start_api(settings_)
    app = create_app(settings_, web_dist=None)
    from fastapi.testclient import TestClient

    with TestClient(app) as client:  # runs the lifespan; a job so that ids 1.. exist
        auth = {"Authorization": f"Bearer {tokens['alice']}", "content-type": "application/yaml"}
        created = client.post("/api/v1/jobs", content=example("digits_mlp.yaml"), headers=auth)
        assert created.status_code == 201, created.text
        yield tokens["alice"], app
    db.dispose()


def test_every_operation_answers_as_documented(token_and_app: tuple[str, Any]) -> None:
    """Each operation in turn, its cases drawn by Hypothesis from the document. (Driven by
    hand rather than by `schemathesis.pytest.from_fixture`, whose lazy loader reads a pytest
    attribute that pytest 9 no longer has.)"""
    token, app = token_and_app
    schema = schemathesis.openapi.from_asgi("/api/v1/openapi.json", app).exclude(
        path="/api/v1/jobs/{job_id}/stream"
    )
    headers = {"Authorization": f"Bearer {token}"}
    failures: dict[str, str] = {}
    calls: dict[str, int] = {}
    succeeded: set[str] = set()  # operations that answered 2xx at least once: the token works
    for result in schema.get_all_operations():
        operation = result.ok()

        # Valid inputs and invalid ones (wrong types, missing fields, out-of-range values).
        cases = operation.as_strategy(GenerationMode.POSITIVE) | operation.as_strategy(
            GenerationMode.NEGATIVE
        )

        @given(case=cases)
        @settings(
            max_examples=EXAMPLES_PER_OPERATION,
            deadline=None,
            derandomize=True,
            suppress_health_check=list(HealthCheck),
            database=None,
        )
        def run(case: Any) -> None:
            label = case.operation.label
            calls[label] = calls.get(label, 0) + 1
            response = case.call_and_validate(headers=headers, checks=CHECKS)
            if response.status_code < 300:
                succeeded.add(label)

        try:
            run()
        except Exception as error:  # every operation is tried; all failures are shown at once
            failures[operation.label] = str(error)[:3000]
    print(
        f"schemathesis: {len(calls)} operations, {sum(calls.values())} calls, "
        f"{len(succeeded)} operations answered 2xx, {len(failures)} failing"
    )
    assert len(calls) >= 24, (sorted(calls), failures)
    # Random ids rarely name an object (a job's checkpoint, a sweep): about half the
    # operations reach a 2xx, which shows the token was accepted throughout.
    assert len(succeeded) >= 12, sorted(set(calls) - succeeded)
    assert not failures, "\n\n".join(f"{label}:\n{text}" for label, text in failures.items())
