"""Many requests at once on a real uvicorn server: each is answered. Requests keep their
session's connection between the threads their dependencies and handler run in; with every
pooled connection held by requests waiting for a thread, and the threads waiting for a
connection, the API stood still (16 submissions at once were enough on SQLite)."""

from __future__ import annotations

import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from scheduler.store.database import pool_limits

DIGITS_MLP = Path(__file__).resolve().parents[2] / "examples" / "digits_mlp.yaml"


def test_more_requests_at_once_than_pooled_connections_are_all_answered(
    api: Any, live_server: Any
) -> None:
    document = DIGITS_MLP.read_text()
    job_id = api.submit(document)["id"]
    requests = 2 * sum(pool_limits(api.settings.sql_url())) + 8
    start = threading.Barrier(requests)

    def call(k: int) -> int:
        with httpx.Client(base_url=live_server.url, headers=api.auth(), timeout=60) as client:
            start.wait()
            if k % 2:
                return client.get(f"/api/v1/jobs/{job_id}").status_code
            body = {"spec": document, "overrides": {"train_steps": 5}}
            return client.post("/api/v1/jobs", json=body).status_code

    with ThreadPoolExecutor(requests) as pool:
        answers = Counter(pool.map(call, range(requests)))
    assert answers == {200: requests // 2, 201: requests // 2}
