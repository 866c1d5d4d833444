"""The scheduler and a node that cannot reach a parameter-server Redis, on both SQL backends:
a real agent's registration (its check against the session's Redis and a closed port) read
from Redis and synced into SQL; jobs with server shards are not placed there, and say why."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import select

from contract.allocation import AllocationState
from contract.keys import Keys
from contract.nodes import NodeRegistration
from contract.settings import Settings
from contract.stream import StateRecord
from dsl.schema import ClusterConfig
from dsl.topology import resolve_topology
from scheduler.agent.node_agent import Agent, create_agent
from scheduler.cli.redis_server import free_port
from scheduler.daemon.nodes import NodeTracker, read_nodes, sync_nodes
from scheduler.daemon.placing import replace_processes, schedule_once
from scheduler.ingest.batch import apply_state
from scheduler.placement.cluster import queue_view
from scheduler.store.database import Database
from scheduler.store.jobs import NewJob, create_job
from scheduler.store.models import Allocation, Job, Node
from scheduler.store.states import JobState
from scheduler.store.users import create_user, get_user

TIMEOUT = 3.0


@pytest.fixture
def settings(tmp_path: Path, redis_url: str) -> Settings:
    closed = f"redis://:ps-secret@127.0.0.1:{free_port()}/0"
    return Settings(
        data_dir=tmp_path,
        redis_url=redis_url,
        redis_ps_urls=f"{redis_url},{closed}",
        redis_prefix=f"t{uuid.uuid4().hex[:8]}",
        node_name="node-2",
        node_slots=5,
        node_gpus=0,
    )


@pytest.fixture
def agent(settings: Settings) -> Iterator[Agent]:
    made = create_agent(settings)
    yield made
    made.client.close()


def add_job(db: Database, framework: str) -> int:
    topology = resolve_topology(ClusterConfig.model_validate({"framework": framework})).to_dict()
    with db.session() as session:
        owner = get_user(session, "bob") or create_user(session, "bob")
        new = NewJob(
            name=framework,
            spec_yaml="",
            overrides={},
            spec={"name": framework, "train_steps": 5},
            topology=topology,
            framework=framework,
            train_steps=5,
        )
        return create_job(session, owner, new).id


def sync(db: Database, reported: dict[str, dict[str, str]], tracker: NodeTracker, now: float):
    with db.session() as session:
        assert sync_nodes(session, reported, tracker, TIMEOUT, now=now) == []


def job(db: Database, job_id: int) -> Job:
    with db.session() as session:
        found = session.get(Job, job_id)
        assert found is not None
        return found


def test_a_ps_job_is_not_placed_where_its_redis_is_out_of_reach_and_says_why(
    db: Database, settings: Settings, agent: Agent
) -> None:
    keys, tracker = Keys(settings.redis_prefix), NodeTracker()
    closed = settings.ps_urls()[1].split("@")[1].removesuffix("/0")
    agent.check_ps()
    agent.heartbeat()
    sync(db, read_nodes(agent.client, keys), tracker, now=0.0)
    with db.session() as session:
        node = session.scalars(select(Node)).one()
        assert node.ps_unreachable == [f"{closed}: connection refused"]
    sandblaster, allreduce = add_job(db, "sandblaster"), add_job(db, "allreduce")
    with db.session() as session:
        placed = schedule_once(session, settings)
    # The allreduce job, behind it in the queue, is placed on the node all the same.
    assert {item.info.job_id for item in placed} == {allreduce}
    assert {item.info.node for item in placed} == {"node-2"}
    reason = (
        "needs 2 worker(s) + 1 server shard(s): 3 slot(s); the cluster cannot fit it even when "
        f"idle (0 node(s), 0 slot(s), 0 GPU(s)); node-2 cannot reach parameter-server Redis "
        f"{closed}: connection refused"
    )
    assert job(db, sandblaster).state == JobState.QUEUED
    assert job(db, sandblaster).pending_reason == reason
    assert "ps-secret" not in reason
    with db.session() as session:  # GET /cluster's queue gives the scheduler's reason
        assert [entry.reason for entry in queue_view(session)] == [reason]

    # The agent reaches every server again: its next check and heartbeat, the next pass.
    agent.settings = settings.model_copy(update={"redis_ps_urls": settings.redis_url})
    agent.check_ps()
    agent.heartbeat()
    sync(db, read_nodes(agent.client, keys), tracker, now=1.0)
    with db.session() as session:
        assert session.scalars(select(Node)).one().ps_unreachable is None
        placed = schedule_once(session, settings)
    assert sorted(item.info.role for item in placed) == ["server", "worker", "worker"]
    assert {item.info.node for item in placed} == {"node-2"}
    assert job(db, sandblaster).state == JobState.SCHEDULED
    assert job(db, sandblaster).pending_reason is None


def registration(name: str, slots: int, beat: float, unreachable: str = "") -> NodeRegistration:
    return NodeRegistration(
        queue=f"q.{name}",
        slots=slots,
        gpus=0,
        heartbeat=beat,
        ps_unreachable=tuple(unreachable.splitlines()),
    )


def test_a_dead_shard_is_not_placed_again_where_its_redis_is_out_of_reach(
    db: Database, settings: Settings
) -> None:
    tracker = NodeTracker()
    sync(db, {"n1": registration("n1", 3, beat=1.0)}, tracker, now=0.0)
    job_id = add_job(db, "sandblaster")
    with db.session() as session:
        placed = schedule_once(session, settings)
    assert len(placed) == 3
    with db.session() as session:
        running = session.get_one(Job, job_id)
        for item in placed:
            state = StateRecord(item.allocation_id, AllocationState.RUNNING, "on n1", None)
            apply_state(session, running, state)
    down = "10.0.0.3:6379: connection refused"
    sync(db, {"n1": registration("n1", 3, beat=2.0, unreachable=down)}, tracker, now=1.0)
    with db.session() as session:
        server = session.scalars(
            select(Allocation).where(Allocation.job_id == job_id, Allocation.role == "server")
        ).one()
        failed = StateRecord(server.id, AllocationState.FAILED, "exit code -9", -9)
        apply_state(session, session.get_one(Job, job_id), failed)
    with db.session() as session:  # n1 has the shard's slot free, but not its Redis
        assert replace_processes(session, settings) == []
    reported = {
        "n1": registration("n1", 3, beat=3.0, unreachable=down),
        "n2": registration("n2", 1, beat=1.0),
    }
    sync(db, reported, tracker, now=2.0)
    with db.session() as session:
        [again] = replace_processes(session, settings)
    assert (again.info.role, again.info.node) == ("server", "n2")
