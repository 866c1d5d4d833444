"""Node agents and the scheduler together: real Celery workers (`trainyard node` subprocesses),
the scheduler loop in a thread, a private redis-server (and a second one for parameter-server
shards) and a SQLite file.

One agent ("node-1", 4 slots) serves the whole module so its fork server imports torch once;
the lost-node test starts and kills a second one.
"""

from __future__ import annotations

import os
import signal
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import redis
from sqlalchemy import select

from contract.allocation import REDIS_PASSWORD, AllocationState
from contract.codec import decode
from contract.keys import Keys
from contract.settings import Settings, with_user
from harness.service_cluster import Cluster, stop_process
from scheduler.celery_app import node_queue
from scheduler.cli.redis_server import RedisServer
from scheduler.daemon.loop import run_scheduler
from scheduler.store.database import Database, migrate
from scheduler.store.models import CheckpointRecord, Metric, Node
from scheduler.store.states import JobState, NodeState

pytestmark = pytest.mark.slow

# Long enough that no stall of a busy 2-core machine trips it (a heartbeat stalled for more
# than 6 s restarted a job under load): the lost-node test kills its agent outright and waits
# the timeout out, rather than hoping a live agent is quick.
NODE_TIMEOUT = 30.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> Iterator[Cluster]:
    data_dir = tmp_path_factory.mktemp("agent-data")
    ps_server = RedisServer(tmp_path_factory.mktemp("ps-redis"), persist=False, password="ps-pw")
    settings = Settings(
        data_dir=data_dir,
        redis_url=redis_url,
        redis_ps_urls=ps_server.start(),
        redis_prefix=f"t{uuid.uuid4().hex[:8]}",
        heartbeat_seconds=0.5,
        node_timeout_seconds=NODE_TIMEOUT,
        schedule_seconds=0.1,
    )
    migrate(settings.sql_url())
    db = Database(settings.sql_url())
    client = redis.Redis.from_url(redis_url)
    found = Cluster(settings, db, client, Keys(settings.redis_prefix), {}, data_dir)
    found.start_agent("node-1", slots=4)
    stop = threading.Event()
    scheduler = threading.Thread(target=run_scheduler, args=(settings, stop), daemon=True)
    scheduler.start()
    try:
        yield found
    finally:
        stop.set()
        scheduler.join(timeout=30)
        for process in found.agents.values():
            stop_process(process)
        db.dispose()
        client.close()
        ps_server.stop()


@pytest.fixture(autouse=True)
def nothing_left_running(cluster: Cluster) -> Iterator[None]:
    """A test that fails midway leaves its jobs running; they end here, not in the next test."""
    yield
    for job_id in cluster.cancel_unfinished():
        cluster.wait_for(
            f"job {job_id}, left running, to end",
            lambda j=job_id: JobState(cluster.job(j).state).terminal,
            timeout=30,
        )


def test_a_job_runs_queued_scheduled_running_succeeded(cluster: Cluster) -> None:
    job_id = cluster.submit(train_steps=40, disp_freq=10)
    cluster.wait_state(job_id, JobState.SUCCEEDED, JobState.FAILED)
    job = cluster.job(job_id)
    assert job.state == JobState.SUCCEEDED, job.error
    assert [state for state, _ in cluster.events(job_id)] == [
        "QUEUED", "SCHEDULED", "RUNNING", "SUCCEEDED",
    ]  # fmt: skip
    assert cluster.events(job_id)[1][1] == "placed on node-1 (1)"
    assert job.step == 40 and job.started_at is not None and job.ended_at is not None
    assert 0.0 < job.summary["test/accuracy"] <= 1.0
    assert job.best_metric == job.summary["test/accuracy"]
    with cluster.db.session() as session:
        losses = session.scalars(
            select(Metric.step).where(Metric.job_id == job_id, Metric.name == "train/loss")
        ).all()
        [checkpoint] = session.scalars(
            select(CheckpointRecord).where(CheckpointRecord.job_id == job_id)
        ).all()
    assert sorted(losses) == [10, 20, 30, 40]
    run_dir = cluster.settings.artifacts() / "jobs" / str(job_id)
    assert checkpoint.step == 40
    assert Path(checkpoint.path) == run_dir / "checkpoints" / "step-00000040.safetensors"
    assert Path(checkpoint.path).stat().st_size == checkpoint.size
    assert (run_dir / "metrics.jsonl").exists()
    [(alloc, node)] = cluster.allocations(job_id)
    assert (alloc.state, alloc.exit_code, node) == (AllocationState.DONE, 0, "node-1")
    assert cluster.slots_used("node-1") == 0


def test_cancel_stops_a_running_job_within_seconds(cluster: Cluster) -> None:
    job_id = cluster.submit(train_steps=10_000_000, disp_freq=10)
    cluster.wait_for("the job's first metrics", lambda: cluster.job(job_id).step > 0)
    [(alloc, _)] = cluster.allocations(job_id)
    pid = cluster.pid(alloc.id)
    assert psutil.pid_exists(pid)
    assert cluster.slots_used("node-1") == 1
    cluster.cancel(job_id)
    cluster.wait_state(job_id, JobState.CANCELLED, timeout=60)  # no wall time asserted
    assert cluster.events(job_id)[-1] == ("CANCELLED", "cancelled by the user")
    cluster.wait_for("the process to be gone", lambda: not psutil.pid_exists(pid), timeout=60)
    cluster.wait_for("its slot to be free", lambda: cluster.slots_used("node-1") == 0, 60)
    [(alloc, _)] = cluster.allocations(job_id)
    assert alloc.state == AllocationState.CANCELLED


def test_a_training_process_holds_only_its_own_jobs_redis_rights(cluster: Cluster) -> None:
    """Two jobs train side by side, the first with a parameter-server shard on the second
    Redis. A training process is connected to both Redis servers as its job's own user
    (CLIENT LIST, matched by the process's own sockets), inherited no Redis or database login
    of its agent, and with its credentials reaches its own job's keys only: not the other
    job's, not the node registry, not the Celery queue, not the scheduler's keys. The user is
    deleted from both once the job has ended."""
    keys, client = cluster.keys, cluster.client
    ps_client = redis.Redis.from_url(str(cluster.settings.redis_ps_urls))
    first = cluster.submit(train_steps=10_000_000, disp_freq=10, **HYBRID)
    other = cluster.submit(train_steps=10_000_000, disp_freq=10)
    for job_id in (first, other):
        cluster.wait_for("the job's first metrics", lambda j=job_id: cluster.job(j).step > 0)
    alloc, node = next((a, n) for a, n in cluster.allocations(first) if a.role == "worker")
    [(other_alloc, _)] = cluster.allocations(other)
    pid = cluster.pid(alloc.id)
    environ = Path(f"/proc/{pid}/environ").read_bytes()
    assert b"REDIS_URL=" not in environ and b"DATABASE_URL=" not in environ
    assert b"REDIS_PS_URLS=" not in environ and b"ps-pw" not in environ
    assert str(cluster.settings.redis_url).encode() not in environ
    # Every connection the process holds to either Redis is logged in as its job's user.
    ports = {
        c.laddr.port for c in psutil.Process(pid).net_connections("tcp") if c.raddr and c.laddr
    }
    for server in (client, ps_client):
        users = {
            entry["user"]
            for entry in server.client_list()
            if int(entry["addr"].rsplit(":", 1)[1]) in ports
        }
        assert users == {keys.job_user(first)}

    password = decode(client.hgetall(keys.allocation(alloc.id)))[REDIS_PASSWORD]
    url = with_user(str(cluster.settings.redis_url), keys.job_user(first), password)
    tenant = redis.Redis.from_url(url)
    assert tenant.xlen(keys.job_stream(first)) > 0  # its own stream: read and written
    assert tenant.hget(keys.allocation(alloc.id), "job_id") == str(first).encode()
    denied = {
        "read another job's stream": lambda: tenant.xrange(keys.job_stream(other)),
        "write another job's stream": lambda: tenant.xadd(keys.job_stream(other), {"k": "v"}),
        "read another job's allocation": lambda: tenant.hgetall(keys.allocation(other_alloc.id)),
        "cancel another job": lambda: tenant.set(keys.cancel(other), "1"),
        "forge its own allocation": lambda: tenant.hset(keys.allocation(alloc.id), "stop", "1"),
        "register a node": lambda: tenant.hset(keys.node("evil"), "slots", "64"),
        "join the node set": lambda: tenant.sadd(keys.nodes, "evil"),
        "read the node's queue": lambda: tenant.lrange(node_queue(cluster.settings, node), 0, -1),
        "read the ingest set": lambda: tenant.smembers(keys.streams_with_data),
        "take the scheduler lease": lambda: tenant.set(keys.scheduler_lease, "me"),
        "list the keys": lambda: tenant.scan(0),
        "manage users": lambda: tenant.execute_command("ACL", "LIST"),
        "announce": lambda: tenant.publish(keys.announcements, "job 1"),
    }
    allowed = []
    for what, attempt in denied.items():
        try:
            attempt()
            allowed.append(what)
        except redis.exceptions.NoPermissionError:
            continue
    assert allowed == []
    tenant.close()
    # On the parameter-server Redis: its own job's shard keys, no other job's, no listing.
    shard_keys = list(ps_client.scan_iter(match=keys.ps_pattern(first)))
    ps_url = with_user(str(cluster.settings.redis_ps_urls), keys.job_user(first), password)
    with redis.Redis.from_url(ps_url) as tenant_ps:
        # Reached without NoPermissionError; a shard may have replaced a key (its snapshot)
        # since the scan, so not every key need still exist.
        assert shard_keys and tenant_ps.exists(*shard_keys) > 0
        forged = f"{keys.job_scope(other)}:ps:slices"
        for attempt in (
            lambda: tenant_ps.get(forged),
            lambda: tenant_ps.set(forged, "forged"),
            lambda: tenant_ps.scan(0),
        ):
            with pytest.raises(redis.exceptions.NoPermissionError):
                attempt()

    for job_id in (first, other):
        cluster.cancel(job_id)
        cluster.wait_state(job_id, JobState.CANCELLED, timeout=15)
    for job_id in (first, other):
        cluster.wait_for(
            "the ended job's Redis user to be deleted",
            lambda j=job_id: client.execute_command("ACL", "GETUSER", keys.job_user(j)) is None,
            timeout=30,
        )
    assert ps_client.execute_command("ACL", "GETUSER", keys.job_user(first)) is None
    ps_client.close()
    cluster.wait_for("the slots to be free", lambda: cluster.slots_used("node-1") == 0, 10)


def test_a_failing_job_ends_failed_with_the_reason(cluster: Cluster) -> None:
    broken = cluster.logs / "broken.npz"
    broken.write_bytes(b"not a zip archive")
    job_id = cluster.submit(train_steps=20, data={"source": "npz", "path": str(broken)})
    cluster.wait_state(job_id, JobState.FAILED, JobState.SUCCEEDED)
    job = cluster.job(job_id)
    assert job.state == JobState.FAILED
    assert job.error is not None and "cannot read" in job.error and str(broken) in job.error
    assert cluster.events(job_id)[-1][1].startswith("worker 0/0 on node-1 failed: ")
    [(alloc, _)] = cluster.allocations(job_id)
    assert (alloc.state, alloc.exit_code) == (AllocationState.FAILED, 2)
    assert cluster.slots_used("node-1") == 0


# All-reduce inside each of two groups, a shared shard between the groups.
HYBRID = {
    "cluster.framework": "allreduce",
    "cluster.nworker_groups": 2,
    "cluster.nworkers_per_group": 1,
    "cluster.nserver_groups": 1,
    "cluster.nservers_per_group": 1,
    "cluster.server_worker_separate": True,
}


@pytest.mark.parametrize(
    ("overrides", "processes"),
    [
        ({"cluster.framework": "allreduce"}, [("worker", 0, 0), ("worker", 0, 1)]),
        (
            {"cluster.framework": "hogwild"},
            [("server", 0, 0), ("server", 1, 0), ("worker", 0, 0), ("worker", 1, 0)],
        ),
        (  # hybrid: all-reduce inside each group, a shared shard between the groups
            {
                "cluster.framework": "allreduce",
                "cluster.nworker_groups": 2,
                "cluster.nworkers_per_group": 1,
                "cluster.nserver_groups": 1,
                "cluster.nservers_per_group": 1,
                "cluster.server_worker_separate": True,
            },
            [("server", 0, 0), ("worker", 0, 0), ("worker", 1, 0)],
        ),
    ],
    ids=["allreduce", "hogwild", "hybrid"],
)
def test_every_framework_runs_through_the_service(
    cluster: Cluster, overrides: dict[str, object], processes: list[tuple[str, int, int]]
) -> None:
    job_id = cluster.submit(train_steps=20, disp_freq=10, **overrides)
    cluster.wait_state(job_id, JobState.FAILED, JobState.SUCCEEDED)
    job = cluster.job(job_id)
    assert job.state == JobState.SUCCEEDED, job.error
    placed = sorted((a.role, a.group, a.rank) for a, _ in cluster.allocations(job_id))
    assert placed == processes
    with cluster.db.session() as session:
        reported = session.execute(
            select(Metric.group, Metric.rank).where(Metric.job_id == job_id).distinct()
        ).all()
    # Metrics per worker group, each with its rank inside the group (at least rank 0).
    workers = {(group, rank) for role, group, rank in processes if role == "worker"}
    shown = {(group, rank) for group, rank in reported}
    assert shown <= workers and {(g, 0) for g, _ in workers} <= shown, shown
    cluster.wait_for(
        "every allocation to end",
        lambda: not any(AllocationState(a.state).active for a, _ in cluster.allocations(job_id)),
    )


def test_a_distributed_job_is_placed_whole_and_a_killed_shard_placed_again(
    cluster: Cluster,
) -> None:
    job_id = cluster.submit(train_steps=400, disp_freq=10, **{"cluster.framework": "sandblaster"})
    cluster.wait_for("the job's first steps", lambda: cluster.job(job_id).step >= 20)
    placed = sorted((a.role, a.group, a.rank, node) for a, node in cluster.allocations(job_id))
    assert placed == [
        ("server", 0, 0, "node-1"), ("worker", 0, 0, "node-1"), ("worker", 0, 1, "node-1"),
    ]  # fmt: skip
    [(server, node)] = [(a, n) for a, n in cluster.allocations(job_id) if a.role == "server"]
    pid = cluster.pid(server.id)
    os.killpg(pid, signal.SIGKILL)
    cluster.wait_state(job_id, JobState.FAILED, JobState.SUCCEEDED)
    job = cluster.job(job_id)
    assert job.state == JobState.SUCCEEDED, job.error
    assert job.step == 400
    # Every process of the gang ends and gives its slot back.
    cluster.wait_for(
        "every allocation to end",
        lambda: not any(AllocationState(a.state).active for a, _ in cluster.allocations(job_id)),
    )
    assert cluster.slots_used("node-1") == 0
    servers = [
        (a.state, a.exit_code, n) for a, n in cluster.allocations(job_id) if a.role == "server"
    ]
    # The replacement ends by itself once the workers are done, or is stopped when the job ends
    # (the ingester sets the job's cancel key for processes still running then).
    [killed, replacement] = servers
    assert killed == (AllocationState.FAILED, -9, node)
    assert replacement[0] in (AllocationState.DONE, AllocationState.CANCELLED)
    assert replacement[2] == node
    notes = [reason for state, reason in cluster.events(job_id) if state == JobState.RUNNING]
    assert any(
        reason.startswith("server 0/0 on node-1 failed: ")
        and reason.endswith("; it is placed again and continues from Redis")
        for reason in notes
    ), notes
    # Its parameter-server keys go once every process has stopped.
    pattern = cluster.keys.ps_pattern(job_id)
    cluster.wait_for(
        "the job's parameter-server keys to be deleted",
        lambda: not list(cluster.client.scan_iter(match=pattern)),
        timeout=30,
    )


def test_a_silent_node_is_lost_and_its_job_placed_again(cluster: Cluster) -> None:
    agent = cluster.start_agent("node-2", slots=1)

    def node2_alive() -> bool:
        with cluster.db.session() as session:
            node = session.scalar(select(Node).where(Node.name == "node-2"))
            return node is not None and node.state == NodeState.ALIVE

    cluster.wait_for("node-2 to join", node2_alive)
    # Best fit: a one-slot job goes to the one-slot node.
    job_id = cluster.submit(train_steps=10_000_000, disp_freq=10)
    cluster.wait_for("the job's first metrics on node-2", lambda: cluster.job(job_id).step > 0)
    [(first, node)] = cluster.allocations(job_id)
    assert node == "node-2"
    pid = cluster.pid(first.id)
    os.killpg(agent.pid, signal.SIGKILL)  # the agent dies without a word; its worker lives on
    agent.wait()
    cluster.wait_for("node-2 to be lost", lambda: not node2_alive(), timeout=NODE_TIMEOUT + 60)
    cluster.wait_for(
        "the job to run again on node-1",
        lambda: any(n == "node-1" for _, n in cluster.allocations(job_id)),
        timeout=60,
    )
    reasons = [reason for state, reason in cluster.events(job_id) if state == "QUEUED"]
    assert reasons[-1].startswith("node lost: node-2 sent no heartbeat")
    assert cluster.allocations(job_id)[0][0].state == AllocationState.FAILED
    # The orphaned worker process notices its allocation was stopped and exits.
    cluster.wait_for("the orphan to exit", lambda: not psutil.pid_exists(pid), timeout=60)
    cluster.cancel(job_id)
    cluster.wait_state(job_id, JobState.CANCELLED, timeout=60)
    cluster.wait_for("node-1 to be free", lambda: cluster.slots_used("node-1") == 0, 60)
