"""API throughput: GET /jobs (target >= 500 req/s) and POST /jobs/validate (target >= 50 req/s).

The bench starts its own API server (`trainyard api`: one uvicorn process as `trainyard up`
runs it, or `--api-workers` processes) on an embedded Redis and a SQLite file in a temporary
directory, with a local admin token. It stores `--jobs` jobs through POST /jobs (no scheduler
runs, so they stay QUEUED), then a load generator in this process (`--concurrency`
keep-alive HTTP/1.1 connections, one request in flight on each; a minimal asyncio client, as
httpx would cost more CPU than the server it measures) calls each endpoint for `--seconds`
seconds:

- GET /api/v1/jobs?limit=50 (a page of 50 jobs, newest first, with owners and queue positions);
- POST /api/v1/jobs/validate with examples/digits_mlp.yaml (parse, validate, describe the data,
  infer shapes, count parameters, preview the placement);
- GET /api/v1/cluster (no target; the dashboard polls it: nodes, running jobs, the queue of
  `--jobs` jobs with the scheduler's reasons).

Every response must be 200; the throughput counts completed requests over the wall time.

    .venv/bin/python bench/api_load.py [--seconds 10] [--concurrency 16] [--jobs 200]
                                       [--api-workers 1]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from api.schemas import JobPage
from scheduler.cli.redis_server import RedisServer, free_port
from scheduler.cli.stack import HEALTH_PATH, ensure_admin_token
from scheduler.store.database import migrate

ROOT = Path(__file__).resolve().parent.parent
JOB_TEXT = (ROOT / "examples" / "digits_mlp.yaml").read_text()
API_PREFIX = "/api/v1"
# GET /cluster has no target: measured because the dashboard polls it.
TARGETS: dict[str, float | None] = {
    "GET /jobs": 500.0,
    "POST /jobs/validate": 50.0,
    "GET /cluster": None,
}


@dataclass
class Phase:
    name: str
    method: str
    path: str
    body: dict[str, Any] | None = None
    params: dict[str, Any] | None = None


@dataclass
class Result:
    name: str
    requests: int
    errors: int
    seconds: float
    latencies: list[float]

    @property
    def rate(self) -> float:
        return self.requests / self.seconds

    def line(self) -> dict[str, object]:
        cuts = statistics.quantiles(self.latencies, n=100, method="inclusive")
        target = TARGETS[self.name]
        return {
            "endpoint": self.name,
            "requests": self.requests,
            "errors": self.errors,
            "req_per_s": round(self.rate, 1),
            "p50_ms": round(cuts[49] * 1000, 2),
            "p99_ms": round(cuts[98] * 1000, 2),
            "target_req_per_s": target,
            "pass": (target is None or self.rate >= target) and self.errors == 0,
        }


def start_api(
    tmp: Path, workers: int, jobs: int
) -> tuple[RedisServer, subprocess.Popen[bytes], str, str]:
    redis_server = RedisServer(tmp / "redis", persist=False)
    redis_url = redis_server.start()
    database_url = f"sqlite:///{tmp / 'trainyard.db'}"
    migrate(database_url)
    token = ensure_admin_token(database_url, None)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TRAINYARD_", "REDIS_"))}
    env.update(TRAINYARD_DATA_DIR=str(tmp), REDIS_URL=redis_url, DATABASE_URL=database_url)
    # The store is filled through POST /jobs before the clock starts: past the default rate.
    env.update(TRAINYARD_QUOTA_SUBMISSIONS_PER_MINUTE=str(max(jobs, 1) * 2))
    process = subprocess.Popen(
        [
            *(sys.executable, "-m", "scheduler", "api", "--no-migrate"),
            *("--port", str(port), "--workers", str(workers)),
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=(tmp / "api.log").open("wb"),
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + HEALTH_PATH, timeout=1).status_code == 200:
                return redis_server, process, url, token
        except httpx.TransportError:
            time.sleep(0.1)
        if process.poll() is not None:
            break
    raise SystemExit(f"the API did not start; see {tmp / 'api.log'}")


class Connection:
    """One keep-alive HTTP/1.1 connection that sends prepared requests and reads whole
    responses: the load generator. Hand-written because an HTTP client library in Python
    (httpx) costs more CPU per request than the server it measures, and here both share the
    same two cores."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, url: str) -> Connection:
        address = httpx.URL(url)
        reader, writer = await asyncio.open_connection(address.host, address.port)
        return cls(reader, writer)

    async def request(self, raw: bytes) -> tuple[int, bytes]:
        self.writer.write(raw)
        head = await self.reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        length = None
        for line in lines[1:]:
            key, _, value = line.partition(":")
            if key.strip().lower() == "content-length":
                length = int(value)
        if length is None:
            raise RuntimeError(f"a response without Content-Length: {lines[0]}")
        return status, await self.reader.readexactly(length)

    def close(self) -> None:
        self.writer.close()


def prepare(url: str, token: str, phase: Phase) -> bytes:
    """The request's bytes, built once (by httpx, so they are what a client would send)."""
    request = httpx.Request(
        phase.method,
        url + API_PREFIX + phase.path,
        params=phase.params,
        json=phase.body,
        headers={"Authorization": f"Bearer {token}", "Connection": "keep-alive"},
    )
    request.read()
    target = request.url.raw_path.decode("ascii")
    lines = [f"{phase.method} {target} HTTP/1.1"]
    lines += [f"{key}: {value}" for key, value in request.headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + request.content


async def run_phase(url: str, raw: bytes, name: str, seconds: float, concurrency: int) -> Result:
    latencies: list[float] = []
    errors = 0
    connections = [await Connection.open(url) for _ in range(concurrency)]
    stop_at = time.perf_counter() + seconds

    async def user(connection: Connection) -> None:
        nonlocal errors
        while time.perf_counter() < stop_at:
            started = time.perf_counter()
            status, _ = await connection.request(raw)
            latencies.append(time.perf_counter() - started)
            if status != 200:
                errors += 1

    began = time.perf_counter()
    try:
        await asyncio.gather(*(user(connection) for connection in connections))
    finally:
        for connection in connections:
            connection.close()
    return Result(name, len(latencies), errors, time.perf_counter() - began, latencies)


def check_page(body: Any, jobs: int) -> None:
    """What the load will fetch is a whole page: JobPage's fields, newest first, in the queue."""
    page = JobPage.model_validate(body)
    ids = [item.id for item in page.items]
    if len(ids) != min(50, jobs) or ids != sorted(ids, reverse=True):
        raise SystemExit(f"GET /jobs returned {len(ids)} jobs, not the newest {min(50, jobs)}")
    if any(item.queue_position is None for item in page.items):
        raise SystemExit("GET /jobs left out the queue positions of queued jobs")


async def load(url: str, token: str, args: argparse.Namespace) -> list[Result]:
    async with httpx.AsyncClient(
        base_url=url + API_PREFIX, headers={"Authorization": f"Bearer {token}"}, timeout=60
    ) as client:
        for i in range(args.jobs):
            response = await client.post(
                "/jobs", json={"spec": JOB_TEXT, "overrides": {"name": f"load-{i}"}}
            )
            response.raise_for_status()
        check_page((await client.get("/jobs", params={"limit": 50})).json(), args.jobs)
    phases = [
        Phase("GET /jobs", "GET", "/jobs", params={"limit": 50}),
        Phase("POST /jobs/validate", "POST", "/jobs/validate", body={"spec": JOB_TEXT}),
        Phase("GET /cluster", "GET", "/cluster"),
    ]
    results = []
    for phase in phases:
        raw = prepare(url, token, phase)
        await run_phase(url, raw, phase.name, 1.0, args.concurrency)  # warm caches
        results.append(await run_phase(url, raw, phase.name, args.seconds, args.concurrency))
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="per endpoint")
    parser.add_argument("--concurrency", type=int, default=16, help="requests in flight")
    parser.add_argument("--jobs", type=int, default=200, help="jobs stored before the load")
    parser.add_argument("--api-workers", type=int, default=1, help="API server processes")
    parser.add_argument("--json", action="store_true", help="print JSON lines")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="trainyard-bench-") as tmp:
        redis_server, process, url, token = start_api(Path(tmp), args.api_workers, args.jobs)
        try:
            results = asyncio.run(load(url, token, args))
        finally:
            process.terminate()
            process.wait(timeout=30)
            redis_server.stop()
    lines = [result.line() for result in results]
    for line in lines:
        if args.json:
            print(json.dumps(line))
        else:
            verdict = "PASS" if line["pass"] else "FAIL"
            target = line["target_req_per_s"]
            goal = f"target >= {target:.0f}" if target is not None else "no target"
            print(
                f"{line['endpoint']:<22} {line['req_per_s']:>8.1f} req/s   "
                f"p50 {line['p50_ms']:>7.2f} ms   p99 {line['p99_ms']:>7.2f} ms   "
                f"errors {line['errors']}   {goal}: {verdict}"
            )
    if not all(line["pass"] for line in lines):
        sys.exit(1)


if __name__ == "__main__":
    main()
