"""The API server: `create_app(settings)` builds the FastAPI app (uvicorn runs it).

Everything lives under /api/v1 (OpenAPI document at /api/v1/openapi.json, interactive docs at
/docs); /healthz and /metrics are also served at the root for health checks and Prometheus.
The dashboard's build (web/dist), when present, is served at /.

The caller migrates the database first (`trainyard api` and `trainyard up` do): the app itself
never runs migrations, so starting several API processes is safe.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import redis
import redis.asyncio
from anyio import to_thread
from fastapi import FastAPI

from api.dashboard import Dashboard
from api.deps import Services, listen_for_revocations
from api.errors import install_error_handlers
from api.limits import BodyLimit, NoNul
from api.openapi import install as install_client_document
from api.openapi import operation_id
from api.routes import (
    cluster,
    compare,
    datasets,
    environments,
    examples,
    job_files,
    jobs,
    models,
    pipeline,
    predictions,
    quotas,
    sweeps,
    system,
    tokens,
    webhooks,
)
from api.stream import router as stream_router
from contract.keys import Keys
from contract.settings import Settings
from scheduler.store.database import Database

API_PREFIX = "/api/v1"
WEB_DIST = Path(__file__).resolve().parent.parent / "web" / "dist"
# Connections of the streams' pool beyond one per stream: taking and releasing their places.
STREAM_POOL_SPARE = 8
# Room for the multipart envelope around an uploaded file.
MULTIPART_OVERHEAD = 64 * 1024


def create_app(settings: Settings | None = None, *, web_dist: Path | None = WEB_DIST) -> FastAPI:
    settings = settings or Settings()
    if not settings.redis_url:
        raise ValueError(
            "the API server needs Redis: set REDIS_URL (`trainyard up` starts one and sets it)"
        )
    services = Services(
        settings=settings,
        db=Database(settings.sql_url()),
        redis=redis.Redis.from_url(settings.redis_url),
        keys=Keys(settings.redis_prefix),
    )

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        import torch  # compiling jobs to check them: one thread per request, not per core

        torch.set_num_threads(1)
        # Sync handlers and dependencies run in anyio's pool (40 threads by default); on the
        # CPU-bound SQL reads more threads than cores only convoy on the interpreter lock.
        to_thread.current_default_thread_limiter().total_tokens = settings.api_threads
        # Every live stream of this process shares one pool (on this event loop); a stream
        # holds a connection while it blocks on its job's Redis stream, up to a second.
        loop = asyncio.get_running_loop()
        services.stream_redis[loop] = redis.asyncio.Redis(
            connection_pool=redis.asyncio.BlockingConnectionPool.from_url(
                settings.redis_url or "",
                max_connections=settings.stream_connections + STREAM_POOL_SPARE,
                timeout=10,
            )
        )
        listener = asyncio.create_task(
            listen_for_revocations(
                settings.redis_url or "", services.keys.tokens_revoked, services.tokens
            )
        )
        yield
        listener.cancel()
        # Bounded: a pub/sub connection being closed may never answer the cancellation.
        await asyncio.wait({listener}, timeout=2.0)
        await services.stream_redis.pop(loop).aclose(close_connection_pool=True)
        services.redis.close()
        services.db.dispose()

    app = FastAPI(
        title="Trainyard",
        summary="Training as a service: submit jobs written in the Trainyard job language, "
        "follow them live, fetch their metrics and checkpoints.",
        version="1",
        openapi_url=f"{API_PREFIX}/openapi.json",
        docs_url="/docs",
        redoc_url=None,
        lifespan=lifespan,
        generate_unique_id_function=operation_id,
    )
    app.state.services = services
    install_error_handlers(
        app, {settings.resolved_data_dir(): "data directory", settings.artifacts(): "artifacts"}
    )
    app.add_middleware(NoNul)
    app.add_middleware(
        BodyLimit,
        default=settings.max_job_bytes,
        limits={
            f"{API_PREFIX}/datasets": (
                settings.max_dataset_bytes + MULTIPART_OVERHEAD,
                f"the dataset is larger than the limit of {settings.max_dataset_bytes} bytes",
            ),
            f"{API_PREFIX}/datasets/uploads": (
                settings.max_upload_part_bytes,
                f"a part is larger than the limit of {settings.max_upload_part_bytes} bytes",
            ),
        },
    )
    for router in (
        jobs.router,
        job_files.router,
        pipeline.router,
        sweeps.router,
        stream_router,
        cluster.router,
        datasets.router,
        system.router,
        examples.router,
        tokens.router,
        quotas.router,
        models.router,
        environments.router,
        compare.router,
        webhooks.router,
        predictions.router,
    ):
        app.include_router(router, prefix=API_PREFIX)
    app.add_api_route("/healthz", system.healthz, include_in_schema=False)
    app.add_api_route("/metrics", system.prometheus, include_in_schema=False)
    install_client_document(app)
    if web_dist is not None and web_dist.is_dir():
        app.mount("/", Dashboard(str(web_dist)), name="web")
    return app
