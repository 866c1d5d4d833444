"""Load: 10 users submit 200 jobs at once to a real `trainyard up` over HTTP; every job reaches
a final state, none is lost, none is placed twice, and the queue is shared between the users.

Training all 200 would take minutes on 2 cores, so each user then cancels their queued jobs
but their first, as users do: about 10 jobs train to the end (each costs about 4 CPU-seconds).
bench/load.py runs all 200; both load the stack through harness/load.py.

The users are created as `trainyard admin create-user` creates them (create_user and
create_token), at once from a thread each, in this process: ten CLI processes would cost
ten Python start-ups. tests/trainyard/test_cli_client.py runs the command itself against a stack.
"""

from __future__ import annotations

from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from sqlalchemy import func, select

from contract.allocation import AllocationState
from harness.load import (
    DISP_FREQ,
    TRAIN_STEPS,
    JobRecord,
    LoadUser,
    final_jobs,
    job_records,
    store_of,
    submit_all,
)
from scheduler.store.models import Allocation
from scheduler.store.states import JobState
from scheduler.store.users import create_token, create_user

if TYPE_CHECKING:
    from collections.abc import Callable

    from conftest import RunningStack

pytestmark = pytest.mark.slow

USERS = 10
JOBS_PER_USER = 20
KEPT_PER_USER = 1  # each user's first job, left to run


def create_users(url: str, data_dir: Path, count: int) -> list[LoadUser]:
    """Users load-0 ... load-N and a token each, created at once in the stack's store."""
    db = store_of(data_dir)

    def create(name: str) -> LoadUser:
        with db.session() as session:
            user = create_user(session, name)
            return LoadUser(name, create_token(session, user, "created by the test"), url)

    try:
        with ThreadPoolExecutor(count) as pool:
            return list(pool.map(create, [f"load-{n}" for n in range(count)]))
    finally:
        db.dispose()


def cancel_queued(user: LoadUser, keep: int) -> dict[int, dict[str, Any]]:
    """The user's queued jobs but their first `keep`, cancelled: the answers by job id."""
    with user.client() as client:
        page = client.get("/api/v1/jobs", params={"limit": 1000}).json()
        first = sorted(job["id"] for job in page["items"])[:keep]
        queued = client.get("/api/v1/jobs", params={"limit": 1000, "state": "QUEUED"}).json()
        answers = {}
        for job_id in sorted(job["id"] for job in queued["items"] if job["id"] not in first):
            answer = client.post(f"/api/v1/jobs/{job_id}/cancel")
            # 409: it was placed since the listing, and has ended already
            assert answer.status_code in (200, 409), answer.text
            answers[job_id] = answer.json()
        return answers


def test_200_jobs_of_10_users_all_end_none_lost_none_twice(
    stack_factory: Callable[..., RunningStack],
) -> None:
    stack = stack_factory(env={"TRAINYARD_NODE_SLOTS": "4"})
    users = create_users(stack.url, stack.data_dir, USERS)
    submitted = submit_all(users, JOBS_PER_USER)
    refused = [s for s in submitted if s.status != 201]
    assert not refused, refused[:3]
    with ThreadPoolExecutor(len(users)) as pool:
        answers = [
            answer
            for found in pool.map(lambda user: cancel_queued(user, KEPT_PER_USER), users)
            for answer in found.values()
        ]
    # Cancelled before they started: still queued, or placed with no process running yet. The
    # others were running and stop (or end) later.
    cancelled_at_once = {a["id"] for a in answers if a.get("state") == JobState.CANCELLED}
    assert len(cancelled_at_once) >= USERS * (JOBS_PER_USER - KEPT_PER_USER) // 2

    admin = LoadUser("admin", stack.token, stack.url).client()
    listed = final_jobs(admin, timeout=300)
    ids = [job["id"] for job in listed]
    assert len(ids) == len(set(ids)) == USERS * JOBS_PER_USER
    assert set(ids) == {s.job_id for s in submitted}, "a job listed that was not submitted"
    assert Counter(job["owner"] for job in listed) == {u.name: JOBS_PER_USER for u in users}
    states = Counter(job["state"] for job in listed)
    assert set(states) <= {JobState.SUCCEEDED, JobState.CANCELLED}, states
    assert states[JobState.SUCCEEDED] >= USERS * KEPT_PER_USER, states

    db = store_of(stack.data_dir)
    try:
        records = job_records(db, ids)
        with db.session() as session:  # every slot was given back
            active = [AllocationState.PENDING, AllocationState.RUNNING]
            held = select(func.count()).where(Allocation.state.in_(active))
            assert session.scalar(held) == 0
    finally:
        db.dispose()
    for record in records.values():
        assert len(record.allocations) <= 1, f"job {record.id} placed twice: {record}"
        assert record.scheduled_events == len(record.allocations), record
    for job_id in cancelled_at_once:
        record = records[job_id]
        assert record.state == JobState.CANCELLED, record
        assert record.started_at is None and record.step == 0, record  # never trained
    queued = [job_id for job_id in cancelled_at_once if not records[job_id].allocations]
    assert len(queued) >= USERS * (JOBS_PER_USER - KEPT_PER_USER) // 2
    for record in records.values():
        if record.state == JobState.SUCCEEDED:
            assert record.step == TRAIN_STEPS, record
            assert record.loss_steps == list(range(DISP_FREQ, TRAIN_STEPS + 1, DISP_FREQ)), record
    assert_fair_share(records)


def assert_fair_share(records: dict[int, JobRecord]) -> None:
    """Users took turns: the first jobs placed were several users' (some users' requests
    arrive first, and their jobs start at once), and every user's jobs ran."""
    placed = sorted((r for r in records.values() if r.allocations), key=lambda r: r.allocations[0])
    order = [r.owner for r in placed]
    assert len(set(order[:10])) >= 5, order
    assert set(order) == {r.owner for r in records.values()}, "a user none of whose jobs ran"
