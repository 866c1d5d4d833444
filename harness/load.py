"""Many users' jobs at once against a running stack, over HTTP: the users and their
clients, every job submitted from a thread of its own (all released together), the listing
until every job is final, and what the store holds of each job (its placements, SCHEDULED
events and reported steps). tests/scheduler/test_load.py and bench/load.py use it."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import select

from contract.settings import Settings
from scheduler.store.database import Database
from scheduler.store.models import Allocation, Job, JobEvent, Metric, User
from scheduler.store.states import JobState

ROOT = Path(__file__).resolve().parents[1]
JOB_TEXT = (ROOT / "examples" / "digits_mlp.yaml").read_text()
TRAIN_STEPS, DISP_FREQ = 10, 5


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
