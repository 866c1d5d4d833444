"""The API in-process against real SQL (SQLite and PostgreSQL) and the session's real Redis.

`api` gives a TestClient on `create_app(settings)` with three users: an admin, alice and bob.
Stream tests run the app in a real uvicorn server (`live_server`), since SSE is about bytes
arriving while the request is still open.
"""

from __future__ import annotations

import threading
import time
import uuid
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis
import uvicorn
from fastapi import FastAPI

from api.app import create_app
from contract.keys import Keys
from contract.settings import Settings
from scheduler.cli.redis_server import free_port
from scheduler.store.database import Database
from scheduler.store.models import Job
from scheduler.store.users import create_token, create_user

warnings.filterwarnings("ignore", message="Using `httpx` with `starlette.testclient`")

from fastapi.testclient import TestClient  # noqa: E402  (after its deprecation filter)

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


def make_settings(base: Path, sql_url: str, redis_url: str, **extra: object) -> Settings:
    return Settings(
        data_dir=base / "data",
        database_url=sql_url,
        redis_url=redis_url,
        redis_prefix=f"test-{uuid.uuid4().hex[:10]}",
        **extra,  # type: ignore[arg-type]
    )


@dataclass
class Api:
    client: TestClient
    app: FastAPI
    settings: Settings
    db: Database
    redis: redis.Redis
    keys: Keys
    tokens: dict[str, str]  # user name -> token
    user_ids: dict[str, int]

    def auth(self, user: str = "alice") -> dict[str, str]:
        return {"Authorization": f"Bearer {self.tokens[user]}"}

    def yaml_headers(self, user: str = "alice") -> dict[str, str]:
        return {**self.auth(user), "content-type": "application/yaml"}

    def submit(self, document: str, user: str = "alice", **params: object) -> dict[str, object]:
        response = self.client.post(
            "/api/v1/jobs", content=document, headers=self.yaml_headers(user), params=params
        )
        assert response.status_code == 201, response.text
        body: dict[str, object] = response.json()
        return body

    def counts(self) -> tuple[int, int, int]:
        """Rows that a rejected request must leave alone: jobs, events, datasets."""
        from sqlalchemy import func, select

        from scheduler.store.models import DatasetRecord, JobEvent

        with self.db.session() as session:
            return (
                session.scalar(select(func.count()).select_from(Job)) or 0,
                session.scalar(select(func.count()).select_from(JobEvent)) or 0,
                session.scalar(select(func.count()).select_from(DatasetRecord)) or 0,
            )


def start_api(settings: Settings) -> tuple[Database, dict[str, str], dict[str, int]]:
    db = Database(settings.sql_url())
    tokens, ids = {}, {}
    with db.session() as session:
        for name, admin in (("admin", True), ("alice", False), ("bob", False)):
            user = create_user(session, name, admin)
            tokens[name] = create_token(session, user, "tests")
            ids[name] = user.id
    return db, tokens, ids


@pytest.fixture
def api_settings(tmp_path: Path, migrated_sql_url: str, redis_url: str) -> Settings:
    return make_settings(tmp_path, migrated_sql_url, redis_url, max_dataset_bytes=200_000)


@pytest.fixture
def api(api_settings: Settings) -> Iterator[Api]:
    db, tokens, ids = start_api(api_settings)
    app = create_app(api_settings, web_dist=None)
    client = redis.Redis.from_url(api_settings.redis_url or "")
    with TestClient(app) as test_client:
        yield Api(
            test_client,
            app,
            api_settings,
            db,
            client,
            Keys(api_settings.redis_prefix),
            tokens,
            ids,
        )
    client.close()
    db.dispose()


@dataclass
class LiveServer:
    url: str
    server: uvicorn.Server
    thread: threading.Thread


@pytest.fixture
def live_server(api: Api) -> Iterator[LiveServer]:
    """The same app served by uvicorn on a free port, in a thread of this process."""
    port = free_port()
    config = uvicorn.Config(api.app, host="127.0.0.1", port=port, log_level="warning")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.02)
    yield LiveServer(f"http://127.0.0.1:{port}", server, thread)
    server.should_exit = True
    thread.join(timeout=10)


def example(name: str) -> str:
    return (EXAMPLES / name).read_text()
