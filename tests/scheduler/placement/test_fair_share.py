"""Fair share: the queue is shared between users, not first-in-first-out; placement quotas
(running jobs, slots, GPUs) make jobs wait without blocking other users'."""

from __future__ import annotations

import uuid
from pathlib import Path

from sqlalchemy import select

from contract.allocation import AllocationState
from contract.nodes import NodeRegistration
from contract.settings import Settings
from scheduler.daemon.nodes import NodeTracker, sync_nodes
from scheduler.daemon.placing import schedule_once
from scheduler.placement.cluster import queue_view
from scheduler.placement.plan import (
    NodeCapacity,
    OwnerShare,
    PlacementRequest,
    order_queue,
    plan_queue,
)
from scheduler.store.database import Database
from scheduler.store.job_page import QUEUE_POSITIONS
from scheduler.store.jobs import NewJob, create_job, queue_positions
from scheduler.store.models import Allocation, Job
from scheduler.store.quotas import Limits, set_quotas
from scheduler.store.states import JobState
from scheduler.store.users import create_user, get_user

ALICE, BOB = 1, 2


def request(job_id: int, owner: int, *, slots: int = 1, priority: int = 0) -> PlacementRequest:
    return PlacementRequest(
        job_id, workers=[(0, r) for r in range(slots)], priority=priority, owner_id=owner
    )


def test_a_flooding_user_does_not_hold_back_anothers_next_job() -> None:
    flood = [request(i, ALICE) for i in range(1, 11)]  # alice queued 10 jobs first
    late = request(11, BOB)
    node = NodeCapacity("n1", "q.n1", slots=2, slots_used=1)  # alice's job 0 holds a slot
    shares = {ALICE: OwnerShare(jobs=1, slots=1), BOB: OwnerShare()}
    decision = plan_queue([*flood, late], [node], shares)
    assert [r.job_id for r, _ in decision.placed] == [11]
    assert decision.order[0] == 11
    assert decision.waiting[1] == "waiting for free resources: needs 1 worker(s): 1 slot(s)"
    assert decision.waiting[2] == "waiting behind job 1"


def test_users_holding_as_much_take_turns_and_priority_comes_first() -> None:
    jobs = [request(1, ALICE), request(2, ALICE), request(3, ALICE), request(4, BOB)]
    assert [r.job_id for r in order_queue(jobs)] == [1, 4, 2, 3]
    # who holds fewer slots goes first
    held = {ALICE: OwnerShare(slots=0), BOB: OwnerShare(slots=4)}
    assert [r.job_id for r in order_queue(jobs, held)] == [1, 2, 3, 4]
    # an admin-set priority overrides the share
    urgent = [*jobs, request(5, BOB, priority=5)]
    assert order_queue(urgent, held)[0].job_id == 5
    # within one user, the order is theirs: priority, then submission
    mine = [request(1, ALICE), request(2, ALICE, priority=-1), request(3, ALICE)]
    assert [r.job_id for r in order_queue(mine)] == [1, 3, 2]


def test_one_pass_shares_free_slots_between_users() -> None:
    jobs = [request(i, ALICE) for i in range(1, 6)] + [request(6, BOB)]
    decision = plan_queue(jobs, [NodeCapacity("n1", "q.n1", slots=3)])
    assert sorted(r.job_id for r, _ in decision.placed) == [1, 2, 6]


def test_a_job_over_its_owners_quota_waits_without_blocking_others() -> None:
    shares = {ALICE: OwnerShare(jobs=1, slots=1, max_jobs=1), BOB: OwnerShare()}
    node = NodeCapacity("n1", "q.n1", slots=4, slots_used=1)
    decision = plan_queue([request(1, ALICE), request(2, BOB)], [node], shares)
    assert [r.job_id for r, _ in decision.placed] == [2]
    assert decision.waiting[1] == (
        "waiting for its owner's quota running_jobs: 1 of 1 job(s) placed"
    )
    # slots and GPUs: counted with the jobs placed in the same pass
    capped = {ALICE: OwnerShare(max_slots=3)}
    decision = plan_queue([request(1, ALICE, slots=2), request(2, ALICE, slots=2)], [node], capped)
    assert [r.job_id for r, _ in decision.placed] == [1]
    assert decision.waiting[2] == ("waiting for its owner's quota slots: 2 of 3 held, needs 2")


# -- the same on SQL (SQLite and PostgreSQL), through the scheduler's pass and the API's queue


def settings_for(tmp_path: Path, **quotas: int) -> Settings:
    return Settings(data_dir=tmp_path, redis_prefix=f"t{uuid.uuid4().hex[:8]}", **quotas)  # type: ignore[arg-type]


def add_job(db: Database, owner: str, *, slots: int = 1) -> int:
    topology = {
        "framework": "local",
        "nworker_groups": 1,
        "nworkers_per_group": slots,
        "nserver_groups": 0,
        "nservers_per_group": 0,
        "server_worker_separate": False,
        "slots_per_worker": 1,
        "gpus_per_worker": 0,
    }
    with db.session() as session:
        user = get_user(session, owner) or create_user(session, owner)
        new = NewJob(
            name=f"{owner}-job",
            spec_yaml="",
            overrides={},
            spec={"name": f"{owner}-job", "train_steps": 5},
            topology=topology,
            framework="local",
            train_steps=5,
        )
        return create_job(session, user, new).id


def add_node(db: Database, slots: int) -> None:
    beat = NodeRegistration(queue="q.n1", slots=slots, gpus=0, heartbeat=1.0)
    with db.session() as session:
        sync_nodes(session, {"n1": beat}, NodeTracker(), 3.0, now=0.0)


def finish(db: Database, job_id: int) -> None:
    with db.session() as session:
        job = session.get(Job, job_id)
        assert job is not None
        job.state = JobState.SUCCEEDED
        for alloc in session.scalars(select(Allocation).where(Allocation.job_id == job_id)):
            alloc.state = AllocationState.DONE


def placed_jobs(db: Database, settings: Settings) -> list[int]:
    with db.session() as session:
        return sorted({item.info.job_id for item in schedule_once(session, settings)})


def test_the_other_users_job_starts_next_and_the_queue_shows_it(
    db: Database, tmp_path: Path
) -> None:
    settings = settings_for(tmp_path)
    add_node(db, 2)
    flood = [add_job(db, "alice") for _ in range(6)]
    assert placed_jobs(db, settings) == flood[:2]
    late = add_job(db, "bob")
    with db.session() as session:
        view = queue_view(session)
        positions = queue_positions(session)
        listed = {job_id: pos for job_id, pos in session.execute(QUEUE_POSITIONS)}
    # the API numbers the queue as placement orders it: bob's job first
    assert [entry.job_id for entry in view] == [late, *flood[2:]]
    assert positions == listed == {entry.job_id: entry.position for entry in view}
    assert positions[late] == 1
    finish(db, flood[0])
    assert placed_jobs(db, settings) == [late]  # not alice's third
    finish(db, flood[1])
    assert placed_jobs(db, settings) == [flood[2]]


def test_a_running_jobs_quota_keeps_jobs_queued_with_the_reason(
    db: Database, tmp_path: Path
) -> None:
    settings = settings_for(tmp_path, quota_running_jobs=1)
    add_node(db, 4)
    first, second = add_job(db, "alice"), add_job(db, "alice")
    bobs = add_job(db, "bob")
    assert placed_jobs(db, settings) == [first, bobs]
    with db.session() as session:
        [entry] = queue_view(session, quotas=Limits.defaults(settings))
    assert entry.job_id == second
    assert entry.reason == "waiting for its owner's quota running_jobs: 1 of 1 job(s) placed"
    with db.session() as session:  # an admin raises alice's own quota: it starts
        user = get_user(session, "alice")
        assert user is not None
        set_quotas(session, user, {"running_jobs": 2})
    assert placed_jobs(db, settings) == [second]
