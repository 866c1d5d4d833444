"""Metric ingestion: points per second from a job's Redis stream into SQLite, none lost.

Publishes `--points` metric points into one job's stream the way workers do (records of
`--per-record` values, sent through pipelines), then runs the ingester (`ingest_once`) until
the stream is drained, and checks that the metrics table holds exactly that many rows and
nothing is left unacknowledged. Target: >= 20,000 points/s. Besides wall-clock throughput it
prints points per CPU-second of the ingesting process, which a busy machine disturbs less.

    .venv/bin/python bench/ingest.py [--points 200000] [--per-record 4] [--redis-url URL]

Without --redis-url it starts a private redis-server (the stack's embedded launcher).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import redis
import smoke  # bench/smoke.py: run as a script, bench/ is on sys.path
from sqlalchemy import func, select

from contract.keys import Keys, delete_matching
from contract.stream import MetricRecord, encode_record
from scheduler.cli.redis_server import RedisServer
from scheduler.ingest.ingester import GROUP, ingest_once
from scheduler.store.database import Database, migrate
from scheduler.store.jobs import NewJob, create_job
from scheduler.store.models import Metric
from scheduler.store.users import create_user

NAMES = ("train/loss", "train/accuracy", "samples_per_sec", "lr", "test/loss", "test/accuracy")


def make_job(db: Database) -> int:
    with db.session() as session:
        owner = create_user(session, "bench")
        job = create_job(
            session,
            owner,
            NewJob(
                name="bench-ingest",
                spec_yaml="name: bench-ingest",
                overrides={},
                spec={"name": "bench-ingest"},
                topology={},
                framework="local",
                train_steps=1,
            ),
        )
        return job.id


def publish(client: redis.Redis, keys: Keys, job_id: int, points: int, per_record: int) -> int:
    stream = keys.job_stream(job_id)
    pipe = client.pipeline(transaction=False)
    sent = 0
    step = 0
    while sent < points:
        step += 1
        count = min(per_record, points - sent)
        values = {NAMES[i % len(NAMES)] + ("" if i < len(NAMES) else f"_{i}"): step * 0.001 + i
                  for i in range(count)}  # fmt: skip
        pipe.xadd(stream, encode_record(MetricRecord(step, values)), maxlen=None)  # type: ignore[arg-type]
        sent += count
        if step % 2000 == 0:
            pipe.execute()
    pipe.sadd(keys.streams_with_data, str(job_id))
    pipe.execute()
    return step


def run(redis_url: str, points: int, per_record: int, workdir: Path) -> None:
    url = f"sqlite:///{workdir / 'bench.db'}"
    migrate(url)
    db = Database(url)
    client = redis.Redis.from_url(redis_url, protocol=2)  # as the scheduler connects
    keys = Keys(f"bench-{int(time.time())}")
    job_id = make_job(db)
    started = time.perf_counter()
    records = publish(client, keys, job_id, points, per_record)
    published = time.perf_counter() - started
    started, cpu_started = time.perf_counter(), time.process_time()
    written = passes = 0
    while True:
        got = ingest_once(db, client, keys)
        passes += 1
        if not got:
            break
        written += got
    elapsed = time.perf_counter() - started
    cpu = time.process_time() - cpu_started
    with db.session() as session:
        rows = session.scalar(select(func.count(Metric.id)).where(Metric.job_id == job_id))
    pending = client.xpending(keys.job_stream(job_id), GROUP)["pending"]
    print(f"published {points:,} points in {records:,} records in {published:.2f}s")
    print(
        f"ingested {written:,} points in {elapsed:.2f}s over {passes} passes: "
        f"{written / elapsed:,.0f} points/s into SQLite"
    )
    # On a shared machine the wall clock counts other work too; this counts ours (the
    # ingester's process, SQLite included; not the Redis server's).
    print(f"ingester CPU time {cpu:.2f}s: {written / cpu:,.0f} points per CPU-second")
    print(f"rows in SQL: {rows:,} (expected {points:,}); unacknowledged records: {pending}")
    delete_matching(client, keys.pattern)
    db.dispose()
    if rows != points or pending:
        raise SystemExit("points were lost")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", type=int, default=200_000)
    parser.add_argument("--per-record", type=int, default=4, help="values per metric record")
    parser.add_argument("--redis-url", help="an existing Redis (default: start a private one)")
    args = smoke.parse(parser, points=4000)
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        if args.redis_url:
            run(args.redis_url, args.points, args.per_record, workdir)
            return
        server = RedisServer(workdir / "redis", persist=False)
        try:
            run(server.start(), args.points, args.per_record, workdir)
        finally:
            server.stop()


if __name__ == "__main__":
    main()
