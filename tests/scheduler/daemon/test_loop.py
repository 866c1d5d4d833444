"""The scheduler loop's steps on both SQL backends: node sync, lost nodes, placement, dispatch."""

from __future__ import annotations

import uuid
from dataclasses import replace
from pathlib import Path

import pytest
import redis
from sqlalchemy import select

from contract.allocation import DISPATCHED, AllocationState, not_started
from contract.keys import Keys
from contract.nodes import NodeRegistration
from contract.settings import Settings
from contract.stream import StateRecord
from dsl.run_kinds import PREDICTION
from dsl.topology import Topology
from scheduler.daemon.dispatch import undispatched
from scheduler.daemon.key_sweep import KeySweeper
from scheduler.daemon.nodes import NodeTracker, mark_lost, sync_nodes
from scheduler.daemon.placing import PlanMemo, replace_processes, schedule_once
from scheduler.ingest.batch import apply_state
from scheduler.placement.cluster import node_capacities, queue_view
from scheduler.recovery.actions import requeue
from scheduler.recovery.policy import MAX_SHARD_REPLACEMENTS
from scheduler.store.database import Database
from scheduler.store.jobs import NewJob, create_job
from scheduler.store.models import Allocation, Job, JobEvent, Node, Prediction
from scheduler.store.predictions import prediction_task
from scheduler.store.states import JobState, NodeState
from scheduler.store.users import create_user, get_user

ROOT = Path(__file__).resolve().parents[3]

TIMEOUT = 3.0


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(data_dir=tmp_path, redis_prefix=f"t{uuid.uuid4().hex[:8]}")


def registration(
    slots: int, beat: float = 1.0, gpus: int = 0, name: str = "n1"
) -> NodeRegistration:
    return NodeRegistration(queue=f"q.{name}", slots=slots, gpus=gpus, heartbeat=beat)


def add_job(db: Database, workers: int = 1, *, priority: int = 0, servers: int = 0) -> int:
    topology = {
        "framework": "local" if not servers else "sandblaster",
        "nworker_groups": 1,
        "nworkers_per_group": workers,
        "nserver_groups": 1 if servers else 0,
        "nservers_per_group": servers,
        "server_worker_separate": bool(servers),
        "slots_per_worker": 1,
        "gpus_per_worker": 0,
    }
    with db.session() as session:
        owner = get_user(session, "bob") or create_user(session, "bob")
        job = create_job(
            session,
            owner,
            NewJob(
                name=f"job-{workers}",
                spec_yaml="",
                overrides={},
                spec={"name": f"job-{workers}", "train_steps": 5},
                topology=topology,
                framework="local",
                train_steps=5,
                priority=priority,
            ),
        )
        return job.id


def state(db: Database, job_id: int) -> str:
    with db.session() as session:
        job = session.get(Job, job_id)
        assert job is not None
        return job.state


def test_nodes_join_go_silent_and_come_back(db: Database) -> None:
    tracker = NodeTracker()
    with db.session() as session:
        assert sync_nodes(session, {"n1": registration(4)}, tracker, TIMEOUT, now=0.0) == []
    with db.session() as session:
        [node] = session.scalars(select(Node)).all()
        assert (node.name, node.slots, node.queue, node.state) == ("n1", 4, "q.n1", "ALIVE")
    with db.session() as session:  # the same heartbeat, but within the timeout
        sync_nodes(session, {"n1": registration(4)}, tracker, TIMEOUT, now=2.5)
        assert session.scalars(select(Node.state)).one() == NodeState.ALIVE
    with db.session() as session:
        sync_nodes(session, {"n1": registration(4)}, tracker, TIMEOUT, now=3.5)
        assert session.scalars(select(Node.state)).one() == NodeState.LOST
    with db.session() as session:  # a new heartbeat: alive again
        sync_nodes(session, {"n1": registration(4, beat=9.0)}, tracker, TIMEOUT, now=4.0)
        assert session.scalars(select(Node.state)).one() == NodeState.ALIVE
    with db.session() as session:  # gone from Redis (expired, or Redis restarted empty) ...
        sync_nodes(session, {}, tracker, TIMEOUT, now=4.1)
        assert session.scalars(select(Node.state)).one() == NodeState.ALIVE
    with db.session() as session:  # ... lost when it stays gone for the timeout
        sync_nodes(session, {}, tracker, TIMEOUT, now=4.1 + TIMEOUT + 0.1)
        assert session.scalars(select(Node.state)).one() == NodeState.LOST
    with db.session() as session:
        assert [n.alive for n in node_capacities(session)] == [False]


def test_placement_is_whole_jobs_in_queue_order(db: Database, settings: Settings) -> None:
    with db.session() as session:
        sync_nodes(session, {"n1": registration(2)}, NodeTracker(), TIMEOUT, now=0.0)
    small, pair, last = add_job(db, 1), add_job(db, 2), add_job(db, 1)
    with db.session() as session:
        [item] = schedule_once(session, settings)
    assert state(db, small) == JobState.SCHEDULED
    assert (state(db, pair), state(db, last)) == (JobState.QUEUED, JobState.QUEUED)
    info = item.info
    assert (item.queue, info.job_id, info.role, info.world, info.node) == (
        "q.n1", small, "worker", 1, "n1",
    )  # fmt: skip
    assert info.run_dir == settings.artifacts() / "jobs" / str(small)
    assert info.spec == {"name": "job-1", "train_steps": 5}  # the stored execution spec
    with db.session() as session:
        view = {entry.job_id: entry for entry in queue_view(session)}
        assert view[pair].position == 1 and "waiting for free resources" in view[pair].reason
        assert view[last].reason == f"waiting behind job {pair}"
        assert node_capacities(session)[0].slots_used == 1
        # The pair cannot start while the small job holds a slot, and the last job waits.
        assert schedule_once(session, settings) == []
    with db.session() as session:
        alloc = session.scalars(select(Allocation).where(Allocation.job_id == small)).one()
        alloc.state = AllocationState.DONE
    with db.session() as session:
        placed = schedule_once(session, settings)
    assert sorted(i.info.rank for i in placed) == [0, 1]
    assert state(db, pair) == JobState.SCHEDULED and state(db, last) == JobState.QUEUED


def test_higher_priority_goes_first(db: Database, settings: Settings) -> None:
    with db.session() as session:
        sync_nodes(session, {"n1": registration(1)}, NodeTracker(), TIMEOUT, now=0.0)
    first, urgent = add_job(db, 1), add_job(db, 1, priority=5)
    with db.session() as session:
        [item] = schedule_once(session, settings)
    assert item.info.job_id == urgent
    assert state(db, first) == JobState.QUEUED


def test_a_cancelled_queued_job_is_not_placed(db: Database, settings: Settings) -> None:
    with db.session() as session:
        sync_nodes(session, {"n1": registration(1)}, NodeTracker(), TIMEOUT, now=0.0)
    job_id = add_job(db, 1)
    with db.session() as session:
        job = session.get(Job, job_id)
        assert job is not None
        job.cancel_requested = True
    with db.session() as session:
        assert schedule_once(session, settings) == []
    assert state(db, job_id) == JobState.CANCELLED


def test_a_lost_node_restarts_its_job_until_max_restarts_then_fails_it(
    db: Database, settings: Settings
) -> None:
    tracker = NodeTracker()
    with db.session() as session:
        nodes = {"n1": registration(2), "n2": registration(2, name="n2")}
        sync_nodes(session, nodes, tracker, TIMEOUT, now=0.0)
    job_id = add_job(db, 2)
    set_max_restarts(db, job_id, 1)
    with db.session() as session:
        schedule_once(session, settings)
    with db.session() as session:
        first = session.scalars(select(Allocation.id).where(Allocation.job_id == job_id)).all()
        node = session.scalars(select(Node).where(Node.name == "n1")).one()
        stops = mark_lost(session, node, "node lost: n1 sent no heartbeat for 3s")
    assert sorted(stops) == sorted(first)
    assert state(db, job_id) == JobState.QUEUED
    with db.session() as session:
        allocs = session.scalars(select(Allocation).where(Allocation.job_id == job_id)).all()
        assert {a.state for a in allocs} == {AllocationState.FAILED}
        assert len(schedule_once(session, settings)) == 2  # both workers, on n2
    with db.session() as session:
        live = session.scalars(
            select(Allocation).where(
                Allocation.job_id == job_id, Allocation.state == AllocationState.PENDING
            )
        ).all()
        assert {a.node_id for a in live} == {
            session.scalars(select(Node.id).where(Node.name == "n2")).one()
        }
        node = session.scalars(select(Node).where(Node.name == "n2")).one()
        mark_lost(session, node, "node lost: n2 sent no heartbeat for 3s")
    with db.session() as session:
        job = session.get(Job, job_id)
        assert job is not None and job.state == JobState.FAILED
        assert job.error == (
            "node lost: n2 sent no heartbeat for 3s (no restarts left: cluster.max_restarts is 1)"
        )
        assert (job.restarts, job.attempt) == (1, 1)
        events = session.execute(
            select(JobEvent.state, JobEvent.reason)
            .where(JobEvent.job_id == job_id)
            .order_by(JobEvent.id)
        ).all()
    assert [state for state, _ in events] == [
        "QUEUED",
        "SCHEDULED",
        "QUEUED",
        "SCHEDULED",
        "FAILED",
    ]
    assert events[2].reason == (
        "node lost: n1 sent no heartbeat for 3s; restart 1 of 1 from step 0"
    )


def test_allocations_not_dispatched_are_sent_again(
    db: Database, settings: Settings, redis_url: str
) -> None:
    client = redis.Redis.from_url(redis_url)
    keys = Keys(settings.redis_prefix)
    with db.session() as session:
        sync_nodes(session, {"n1": registration(1)}, NodeTracker(), TIMEOUT, now=0.0)
    add_job(db, 1)
    with db.session() as session:
        [item] = schedule_once(session, settings)  # ... and the scheduler stopped here
    with db.session() as session:
        [again] = undispatched(session, settings, client)
    assert again.allocation_id == item.allocation_id and again.info == item.info
    client.hset(keys.allocation(item.allocation_id), mapping={"job_id": str(item.info.job_id)})
    client.hset(keys.allocation(item.allocation_id), DISPATCHED, "1000.0")
    with db.session() as session:  # sent, and not claimed yet: within the node timeout
        assert undispatched(session, settings, client, now=1001.0) == []
        # Not claimed long after it was sent (the message was lost): sent again.
        late = 1000.0 + settings.node_timeout_seconds + 1
        assert [d.allocation_id for d in undispatched(session, settings, client, now=late)] == [
            item.allocation_id
        ]
    client.delete(keys.allocation(item.allocation_id))
    client.close()


def report(db: Database, job_id: int, alloc_id: int, state: AllocationState, code: int) -> None:
    """What the ingester does with a process's state record from the job's stream."""
    with db.session() as session:
        job = session.get(Job, job_id)
        assert job is not None
        apply_state(session, job, StateRecord(alloc_id, state, f"exit code {code}", code))


def live_server(db: Database, job_id: int) -> Allocation:
    with db.session() as session:
        return session.scalars(
            select(Allocation)
            .where(Allocation.job_id == job_id, Allocation.role == "server")
            .order_by(Allocation.id.desc())
        ).first()  # type: ignore[return-value]


def set_max_restarts(db: Database, job_id: int, limit: int) -> None:
    with db.session() as session:
        job = session.get(Job, job_id)
        assert job is not None
        job.spec = {**job.spec, "cluster": {**job.spec.get("cluster", {}), "max_restarts": limit}}


def test_a_dead_shard_is_placed_again_then_the_job_fails(db: Database, settings: Settings) -> None:
    with db.session() as session:
        sync_nodes(session, {"n1": registration(3)}, NodeTracker(), TIMEOUT, now=0.0)
    job_id = add_job(db, 2, servers=1)
    set_max_restarts(db, job_id, 0)  # no restart of the whole job after the shard's
    other = add_job(db, 1)
    with db.session() as session:
        placed = schedule_once(session, settings)
    assert sorted(item.info.role for item in placed) == ["server", "worker", "worker"]
    assert state(db, other) == JobState.QUEUED  # 3 slots: the gang of 3 took them all
    for item in placed:
        report(db, job_id, item.allocation_id, AllocationState.RUNNING, 0)
    assert state(db, job_id) == JobState.RUNNING

    for attempt in range(1, MAX_SHARD_REPLACEMENTS + 1):
        dead = live_server(db, job_id)
        report(db, job_id, dead.id, AllocationState.FAILED, -9)
        assert state(db, job_id) == JobState.RUNNING  # the workers wait for the shard
        with db.session() as session:
            [again] = replace_processes(session, settings)
            # The shard's slot is free again, so nothing else took it: the queued job still
            # waits, and the shard goes back where it was, same group and rank.
            assert schedule_once(session, settings) == []
        assert (again.info.role, again.info.group, again.info.rank) == ("server", 0, 0)
        assert again.info.node == "n1" and again.allocation_id != dead.id
        with db.session() as session:
            assert replace_processes(session, settings) == []  # placed once, not every pass
            reasons = session.scalars(
                select(JobEvent.reason).where(JobEvent.job_id == job_id).order_by(JobEvent.id)
            ).all()
        assert reasons[-1] == (
            "server 0/0 on n1 failed: exit code -9; it is placed again and continues from Redis"
        ), attempt
        report(db, job_id, again.allocation_id, AllocationState.RUNNING, 0)

    report(db, job_id, live_server(db, job_id).id, AllocationState.FAILED, -9)
    with db.session() as session:
        job = session.get(Job, job_id)
        assert job is not None and job.state == JobState.FAILED
        assert job.error == "exit code -9"
        assert replace_processes(session, settings) == []


def test_a_job_being_cancelled_whose_node_is_lost_ends_cancelled(
    db: Database, settings: Settings
) -> None:
    with db.session() as session:
        sync_nodes(session, {"n1": registration(2)}, NodeTracker(), TIMEOUT, now=0.0)
    job_id = add_job(db, 2)
    with db.session() as session:
        schedule_once(session, settings)
        job = session.get(Job, job_id)
        assert job is not None
        job.cancel_requested = True
    with db.session() as session:
        node = session.scalars(select(Node).where(Node.name == "n1")).one()
        stops = mark_lost(session, node, "node lost: n1 sent no heartbeat for 3s")
    assert len(stops) == 2
    with db.session() as session:
        job = session.get(Job, job_id)
        assert job is not None and job.state == JobState.CANCELLED and job.error is None
        allocs = session.scalars(select(Allocation).where(Allocation.job_id == job_id)).all()
        assert {a.state for a in allocs} == {AllocationState.FAILED}


def test_a_dead_shard_waits_for_room_and_is_not_replaced_when_cancelling(
    db: Database, settings: Settings
) -> None:
    tracker = NodeTracker()
    with db.session() as session:
        sync_nodes(session, {"n1": registration(3)}, tracker, TIMEOUT, now=0.0)
    job_id = add_job(db, 2, servers=1)
    with db.session() as session:
        placed = schedule_once(session, settings)
    for item in placed:
        report(db, job_id, item.allocation_id, AllocationState.RUNNING, 0)
    with db.session() as session:  # n1 disappears from the cluster's view, n2 joins, full
        node = session.scalars(select(Node).where(Node.name == "n1")).one()
        node.state = NodeState.LOST
        sync_nodes(session, {"n2": registration(0, name="n2")}, tracker, TIMEOUT, now=0.0)
    report(db, job_id, live_server(db, job_id).id, AllocationState.FAILED, -9)
    with db.session() as session:
        assert replace_processes(session, settings) == []  # nowhere to go: waits
        sync_nodes(session, {"n2": registration(1, name="n2")}, tracker, TIMEOUT, now=0.0)
    with db.session() as session:
        [again] = replace_processes(session, settings)
    assert again.info.node == "n2"
    report(db, job_id, again.allocation_id, AllocationState.RUNNING, 0)
    with db.session() as session:
        job = session.get(Job, job_id)
        assert job is not None
        job.cancel_requested = True
    report(db, job_id, again.allocation_id, AllocationState.FAILED, -9)
    assert state(db, job_id) == JobState.FAILED


def test_ended_jobs_lose_their_parameter_server_keys_once_their_processes_stop(
    db: Database, settings: Settings, redis_url: str
) -> None:
    client = redis.Redis.from_url(redis_url)
    keys = Keys(settings.redis_prefix)
    with db.session() as session:
        sync_nodes(session, {"n1": registration(3)}, NodeTracker(), TIMEOUT, now=0.0)
    job_id = add_job(db, 2, servers=1)
    with db.session() as session:
        placed = schedule_once(session, settings)
    ps_keys = [f"{keys.job_scope(job_id)}:ps:sg0:s0:params", f"{keys.job_scope(job_id)}:ps:slices"]
    kept = [keys.job_stream(job_id), keys.job_scope(job_id + 1_000_000) + ":ps:slices"]
    for key in ps_keys + kept:
        client.set(key, b"x")
    sweeper = KeySweeper([client], keys)
    workers = [item for item in placed if item.info.role == "worker"]
    server = next(item for item in placed if item.info.role == "server")
    for item in workers:
        report(db, job_id, item.allocation_id, AllocationState.DONE, 0)
    assert state(db, job_id) == JobState.SUCCEEDED
    with db.session() as session:
        assert sweeper.ended_jobs(session) == []  # its shard has not stopped yet
    report(db, job_id, server.allocation_id, AllocationState.DONE, 0)
    with db.session() as session:
        ended = sweeper.ended_jobs(session)
    assert ended == [job_id]
    assert sweeper.sweep(ended) == 2
    assert client.exists(*ps_keys) == 0 and client.exists(*kept) == 2
    with db.session() as session:
        assert sweeper.ended_jobs(session) == []  # once
    client.delete(*kept)
    client.close()


def test_a_row_without_a_topology_is_placed_from_its_spec(db: Database, settings: Settings) -> None:
    """Rows stored before jobs kept their resolved topology: the queue view and the scheduler
    resolve it from the stored spec (here an allreduce group of 2 workers)."""
    import yaml

    spec = yaml.safe_load((ROOT / "examples" / "mnist1d_allreduce.yaml").read_text())
    with db.session() as session:
        sync_nodes(session, {"n1": registration(1)}, NodeTracker(), TIMEOUT, now=0.0)
    job_id = add_job(db)
    with db.session() as session:
        job = session.get_one(Job, job_id)
        job.spec, job.topology = spec, {}
    with db.session() as session:
        [entry] = queue_view(session)
        assert (entry.job_id, entry.slots) == (job_id, 2)
        assert "needs 2 worker(s)" in entry.reason  # and the one node has 1 slot
        sync_nodes(session, {"n1": registration(2)}, NodeTracker(), TIMEOUT, now=0.0)
    with db.session() as session:
        placed = schedule_once(session, settings)
    assert sorted(item.info.rank for item in placed) == [0, 1]


def test_a_node_whose_plugin_failed_holds_no_job_until_its_agent_loads_it(
    db: Database, settings: Settings
) -> None:
    broken = "plugin broken (/p/broken.py) failed to load: RuntimeError: no"
    failed = replace(registration(2), plugin_error=broken)
    with db.session() as session:
        sync_nodes(session, {"n1": failed}, NodeTracker(), TIMEOUT, now=0.0)
    job_id = add_job(db, 1)
    with db.session() as session:
        assert schedule_once(session, settings) == []
        [node] = node_capacities(session)
        assert node.alive and node.plugin_error == broken
    with db.session() as session:
        job = session.get(Job, job_id)
        assert job is not None and job.state == JobState.QUEUED
        assert job.pending_reason is not None
        assert job.pending_reason.endswith(f"; n1 takes no jobs: {broken}"), job.pending_reason
    with db.session() as session:  # its agent restarted with the plugin fixed
        sync_nodes(session, {"n1": registration(2, beat=2.0)}, NodeTracker(), TIMEOUT, now=0.0)
        assert session.scalars(select(Node.plugin_error)).one() is None
        assert len(schedule_once(session, settings)) == 1
    assert state(db, job_id) == JobState.SCHEDULED


def test_a_pass_with_nothing_changed_plans_nothing(db: Database, settings: Settings) -> None:
    with db.session() as session:
        sync_nodes(session, {"n1": registration(1)}, NodeTracker(), TIMEOUT, now=0.0)
    first, second = add_job(db), add_job(db)
    memo = PlanMemo()
    with db.session() as session:
        assert len(schedule_once(session, settings, memo)) == 1  # the first takes the slot
    assert memo.fresh and memo.decision is not None
    assert memo.decision.waiting == {
        second: "waiting for free resources: needs 1 worker(s): 1 slot(s)"
    }
    with db.session() as session:
        assert schedule_once(session, settings, memo) == []
    assert memo.fresh  # the first job left the queue: planned again, the second still waits
    with db.session() as session:
        assert schedule_once(session, settings, memo) == []
    assert not memo.fresh  # nothing changed: nothing planned
    with db.session() as session:  # the first job's process ends: its slot is free
        [alloc] = session.scalars(select(Allocation).where(Allocation.job_id == first)).all()
        alloc.state = AllocationState.DONE
    with db.session() as session:
        [item] = schedule_once(session, settings, memo)
    assert memo.fresh and item.info.job_id == second


def test_a_job_placed_again_before_the_next_pass_is_placed_by_it(
    db: Database, settings: Settings
) -> None:
    """A process that fails at once (its agent cannot claim it) puts its job back in the queue
    before the next pass: queue, nodes and shares are then what the pass that placed it saw,
    and the job must still be placed again, not wait for something else to change."""
    with db.session() as session:
        sync_nodes(session, {"n1": registration(2)}, NodeTracker(), TIMEOUT, now=0.0)
    job_id = add_job(db)
    memo = PlanMemo()
    with db.session() as session:
        [first] = schedule_once(session, settings, memo)
    with db.session() as session:  # what the ingester does with the agent's "did not start"
        job = session.get(Job, job_id)
        assert job is not None
        requeue(session, job, "worker 0/0 on n1 did not start", artifacts=None)
    with db.session() as session:
        [again] = schedule_once(session, settings, memo)
    assert again.info.job_id == job_id and again.allocation_id != first.allocation_id
    assert state(db, job_id) == JobState.SCHEDULED


def test_a_job_whose_process_did_not_start_on_a_node_is_placed_on_another(
    db: Database, settings: Settings
) -> None:
    """Its agent on n1 reports the process did not start (`not_started`): the job is placed
    again (a counted restart), on n2, and remembers n1; a later failure of another kind adds
    nothing to what it avoids."""
    with db.session() as session:
        both = {"n1": registration(1, name="n1"), "n2": registration(1, name="n2")}
        sync_nodes(session, both, NodeTracker(), TIMEOUT, now=0.0)
    job_id = add_job(db)
    with db.session() as session:
        [first] = schedule_once(session, settings)
    assert first.queue == "q.n1"  # the first node by name, when nothing is avoided
    said = not_started("its node agent on n1 could not claim it", PermissionError("no"))
    with db.session() as session:
        job = session.get(Job, job_id)
        assert job is not None
        apply_state(session, job, StateRecord(first.allocation_id, AllocationState.FAILED, said))
    with db.session() as session:
        [again] = schedule_once(session, settings)
        job = session.get(Job, job_id)
        assert job is not None and job.avoided_nodes == ["n1"] and job.restarts == 1
    assert again.queue == "q.n2"
    report(db, job_id, again.allocation_id, AllocationState.FAILED, 1)  # it ran, and failed
    with db.session() as session:
        job = session.get(Job, job_id)
        assert job is not None and job.avoided_nodes == ["n1"]


def test_a_prediction_runs_workers_are_handed_its_task_and_one_that_fails_restarts_alone(
    db: Database, settings: Settings
) -> None:
    """A job of kind prediction (as scheduler/admission/predict.py queues it): each worker's
    allocation record carries the kind and the task kept in the run's own row; a worker that
    fails is placed again alone, to score its shard again, while the other scores on."""
    with db.session() as session:
        sync_nodes(session, {"n1": registration(2)}, NodeTracker(), TIMEOUT, now=0.0)
        owner = create_user(session, "carol")
        topology = Topology("", 1, 2, 0, 0, False, 1, 0).to_dict()  # no framework: 2 workers
        new = NewJob("predict-m", "", {}, {"name": "m"}, topology, "", 0)
        run = create_job(session, owner, replace(new, kind=PREDICTION.name, objective=""))
        row = Prediction(
            owner_id=owner.id,
            run_job_id=run.id,
            dataset="many",
            rows=9,
            step=40,
            workers=2,
            checkpoint="/c.safetensors",
            dataset_file="/d.npz",
            dataset_format="npz",
            sample_key="x",
            batch_size=8,
        )
        session.add(row)
        session.flush()
        task = prediction_task(session, run.id)
        run_id = run.id
    with db.session() as session:
        placed = schedule_once(session, settings)
    assert sorted(item.info.rank for item in placed) == [0, 1]
    for item in placed:
        assert (item.info.kind, item.info.framework) == (PREDICTION.name, "")
        assert item.info.prediction == task.to_dict() and task.rows == 9
        report(db, run_id, item.allocation_id, AllocationState.RUNNING, 0)
    failed = placed[1]
    report(db, run_id, failed.allocation_id, AllocationState.FAILED, -9)
    assert state(db, run_id) == JobState.RUNNING  # the other worker scores on
    with db.session() as session:
        [again] = replace_processes(session, settings)
        reason = session.scalars(
            select(JobEvent.reason).where(JobEvent.job_id == run_id).order_by(JobEvent.id.desc())
        ).first()
    assert (again.info.rank, again.info.prediction) == (failed.info.rank, task.to_dict())
    assert reason is not None and reason.endswith("scoring its shard again"), reason
