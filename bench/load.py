"""Load: `--users` users submit `--jobs-per-user` jobs each, all at once, to a real `trainyard
up` over HTTP, and every job runs to its end.

The bench starts `trainyard up` (its own Redis, SQLite file, API, scheduler and one node agent
of `--slots` slots) in a temporary directory, creates the users with `trainyard admin
create-user`, and submits examples/digits_mlp.yaml with `train_steps` 10 as JSON
`{spec, overrides}` from one thread per user and job (the users' requests interleaved, all
released together). It waits until the API lists every job in a final state, then prints the
submission latency percentiles, the time from the first submission until all jobs were final,
the jobs per minute, and the checks: no job lost (the API lists exactly the jobs submitted),
none placed twice (one allocation and one SCHEDULED event each), every one trained all its
steps (each train/loss step reported once), and the first jobs placed were several users'.

    .venv/bin/python bench/load.py [--users 10] [--jobs-per-user 20] [--slots 4] [--json out.json]

tests/scheduler/test_load.py runs the same load, cancelling most queued jobs; docs/reliability.md
and docs/performance.md record a run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx
from sqlalchemy import select

from bench import smoke
from contract.settings import Settings
from scheduler.cli.redis_server import free_port
from scheduler.cli.stack import read_stack_file
from scheduler.store.database import Database
from scheduler.store.models import Allocation, Job, JobEvent, Metric, User
from scheduler.store.states import JobState

ROOT = Path(__file__).resolve().parent.parent
JOB_TEXT = (ROOT / "examples" / "digits_mlp.yaml").read_text()
TRAIN_STEPS, DISP_FREQ = 10, 5
START_TIMEOUT = 120.0


@dataclass(frozen=True)
class LoadUser:
    name: str
    token: str
    url: str

    def client(self) -> httpx.Client:
        return httpx.Client(
            base_url=self.url, headers={"Authorization": f"Bearer {self.token}"}, timeout=120
        )


@dataclass
class Submitted:
    user: str
    status: int
    seconds: float
    job_id: int | None
    body: str


@dataclass
class JobRecord:
    """What the store holds of one job: its state, and every placement it had."""

    id: int
    owner: str
    state: str
    step: int
    started_at: datetime | None
    allocations: list[int]  # allocation ids, in order
    scheduled_events: int
    loss_steps: list[int]  # the steps of its train/loss reports, sorted


def stack_env(**extra: str) -> dict[str, str]:
    """Our environment without any Trainyard, Redis or SQL configuration, plus `extra`."""
    drop = ("TRAINYARD_", "REDIS_", "DATABASE_URL")
    return {**{k: v for k, v in os.environ.items() if not k.startswith(drop)}, **extra}


def start_stack(
    data_dir: Path, slots: int, log: Path, **settings: str
) -> tuple[subprocess.Popen[bytes], str, str]:
    """`trainyard up` on a free port with one node agent of `slots` slots (and the `settings`,
    TRAINYARD_... variables): (process, URL, admin token) once its stack file says it is up."""
    port = free_port()
    with log.open("wb") as sink:
        process = subprocess.Popen(
            [sys.executable, "-m", "scheduler", "up", "--port", str(port), "--data-dir", data_dir],
            cwd=ROOT,
            env=stack_env(
                TRAINYARD_NODE_SLOTS=str(slots), TRAINYARD_HEARTBEAT_SECONDS="1", **settings
            ),
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        found = read_stack_file(data_dir / "stack.json")
        if found is not None and found.pid == process.pid:
            return process, found.url, found.token
        if process.poll() is not None:
            break
        time.sleep(0.2)
    process.kill()
    raise RuntimeError(f"trainyard up did not come up:\n{log.read_text()}")


def create_users(url: str, data_dir: Path, count: int) -> list[LoadUser]:
    """`trainyard admin create-user load-N` for each, at once; each prints its token."""

    def create(name: str) -> LoadUser:
        done = subprocess.run(
            [sys.executable, "-m", "scheduler", "admin", "create-user", name],
            cwd=ROOT,
            env=stack_env(TRAINYARD_DATA_DIR=str(data_dir)),
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(f"create-user {name} exited {done.returncode}: {done.stderr}")
        return LoadUser(name, done.stdout.strip().splitlines()[-1], url)

    with ThreadPoolExecutor(count) as pool:
        return list(pool.map(create, [f"load-{n}" for n in range(count)]))


def submit_all(users: Sequence[LoadUser], per_user: int) -> list[Submitted]:
    """Every user's `per_user` jobs, each from a thread of its own, released together (the
    users' requests interleaved); the answers in submission order."""
    clients = {user.name: user.client() for user in users}
    tasks = [(user, k) for k in range(per_user) for user in users]
    start = threading.Barrier(len(tasks))

    def submit(task: tuple[LoadUser, int]) -> Submitted:
        user, k = task
        body = {
            "spec": JOB_TEXT,
            "overrides": {
                "name": f"{user.name}-{k}",
                "train_steps": TRAIN_STEPS,
                "disp_freq": DISP_FREQ,
            },
        }
        start.wait()
        began = time.perf_counter()
        answer = clients[user.name].post("/api/v1/jobs", json=body)
        seconds = time.perf_counter() - began
        job_id = answer.json()["id"] if answer.status_code == 201 else None
        return Submitted(user.name, answer.status_code, seconds, job_id, answer.text[:300])

    try:
        with ThreadPoolExecutor(len(tasks)) as pool:
            return list(pool.map(submit, tasks))
    finally:
        for client in clients.values():
            client.close()


def listed_jobs(client: httpx.Client) -> list[dict[str, Any]]:
    """Every job the client may see, through the pages of GET /jobs."""
    items: list[dict[str, Any]] = []
    cursor = None
    while True:
        params: dict[str, Any] = {"limit": 1000}
        if cursor:
            params["cursor"] = cursor
        answer = client.get("/api/v1/jobs", params=params)
        answer.raise_for_status()
        page = answer.json()
        items.extend(page["items"])
        cursor = page["next_cursor"]
        if not cursor:
            return items


def final_jobs(client: httpx.Client, timeout: float) -> list[dict[str, Any]]:
    """The listed jobs once every one is in a final state."""
    deadline = time.monotonic() + timeout
    while True:
        items = listed_jobs(client)
        live = [job for job in items if not JobState(job["state"]).terminal]
        if not live:
            return items
        if time.monotonic() > deadline:
            raise TimeoutError(f"{len(live)} jobs still live after {timeout:.0f}s: {live[:3]}")
        time.sleep(1.0)


def job_records(db: Database, ids: Sequence[int]) -> dict[int, JobRecord]:
    """The store's record of each job: allocations, SCHEDULED events, train/loss steps."""
    with db.session() as session:
        jobs = session.execute(
            select(Job, User.name).join(User, User.id == Job.owner_id).where(Job.id.in_(ids))
        ).all()
        records = {
            job.id: JobRecord(job.id, owner, job.state, job.step, job.started_at, [], 0, [])
            for job, owner in jobs
        }
        for job_id, alloc_id in session.execute(
            select(Allocation.job_id, Allocation.id)
            .where(Allocation.job_id.in_(ids))
            .order_by(Allocation.id)
        ):
            records[job_id].allocations.append(alloc_id)
        for (job_id,) in session.execute(
            select(JobEvent.job_id).where(
                JobEvent.job_id.in_(ids), JobEvent.state == JobState.SCHEDULED
            )
        ):
            records[job_id].scheduled_events += 1
        for job_id, step in session.execute(
            select(Metric.job_id, Metric.step)
            .where(Metric.job_id.in_(ids), Metric.name == "train/loss")
            .order_by(Metric.step)
        ):
            records[job_id].loss_steps.append(step)
    return records


def store_of(data_dir: Path) -> Database:
    return Database(Settings(data_dir=data_dir, database_url=None).sql_url())


def percentiles(values: Sequence[float]) -> dict[str, float]:
    cuts = statistics.quantiles(values, n=100, method="inclusive")
    return {
        "p50_ms": round(cuts[49] * 1000, 1),
        "p90_ms": round(cuts[89] * 1000, 1),
        "p99_ms": round(cuts[98] * 1000, 1),
        "max_ms": round(max(values) * 1000, 1),
    }


def checks(
    submitted: Sequence[Submitted], listed: Sequence[dict[str, Any]], records: dict[int, JobRecord]
) -> dict[str, Any]:
    """The load's invariants, each a count that must be 0 (or true)."""
    accepted = {s.job_id for s in submitted if s.job_id is not None}
    ids = [job["id"] for job in listed]
    steps = list(range(DISP_FREQ, TRAIN_STEPS + 1, DISP_FREQ))
    placed = sorted((r for r in records.values() if r.allocations), key=lambda r: r.allocations[0])
    return {
        "refused": sum(1 for s in submitted if s.status != 201),
        "lost": len(accepted - set(ids)),
        "listed_not_submitted": len(set(ids) - accepted),
        "listed_twice": len(ids) - len(set(ids)),
        "not_succeeded": sum(1 for r in records.values() if r.state != JobState.SUCCEEDED),
        "placed_twice": sum(1 for r in records.values() if len(r.allocations) > 1),
        "scheduled_twice": sum(1 for r in records.values() if r.scheduled_events > 1),
        "steps_wrong": sum(1 for r in records.values() if r.loss_steps != steps),
        "users_in_first_10_placed": len({r.owner for r in placed[:10]}),
    }


def run(users: int, per_user: int, slots: int, timeout: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="trainyard-load-") as tmp:
        data_dir = Path(tmp) / "data"
        process, url, token = start_stack(data_dir, slots, Path(tmp) / "up.log")
        db = store_of(data_dir)
        try:
            people = create_users(url, data_dir, users)
            began = time.monotonic()
            submitted = submit_all(people, per_user)
            submit_seconds = time.monotonic() - began
            admin = httpx.Client(
                base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=60
            )
            listed = final_jobs(admin, timeout)
            all_final = time.monotonic() - began
            records = job_records(db, [job["id"] for job in listed])
        finally:
            db.dispose()
            process.terminate()
            process.wait(timeout=60)
    jobs = len(submitted)
    return {
        "users": users,
        "jobs": jobs,
        "slots": slots,
        "train_steps": TRAIN_STEPS,
        "statuses": dict(Counter(s.status for s in submitted)),
        "submission_latency": percentiles([s.seconds for s in submitted]),
        "all_submitted_s": round(submit_seconds, 1),
        "all_final_s": round(all_final, 1),
        "jobs_per_minute": round(jobs / all_final * 60, 1),
        "final_states": dict(Counter(job["state"] for job in listed)),
        "checks": checks(submitted, listed, records),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, default=10)
    parser.add_argument("--jobs-per-user", type=int, default=20)
    parser.add_argument("--slots", type=int, default=4, help="the node agent's slots")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds to wait for all")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = smoke.parse(parser, users=2, jobs_per_user=2, timeout=300.0)
    result = run(args.users, args.jobs_per_user, args.slots, args.timeout)
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    bad = {k: v for k, v in result["checks"].items() if k != "users_in_first_10_placed" and v}
    if bad:
        sys.exit(f"checks failed: {bad}")


if __name__ == "__main__":
    main()
