"""Faults injected into a running service by killing real processes (SIGKILL) and stopping a
node agent (SIGTERM): every job still ends SUCCEEDED, from its restart point, with each step's
metrics counted once.

The scheduler and the node agents are processes of their own here, so each can be killed and
started again. One cluster, over the module's own redis-server, serves every test: the test
that restarts Redis empty comes last and checks that the cluster still runs a new job.
docs/reliability.md tabulates what these tests inject.
"""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Iterator

import psutil
import pytest
from sqlalchemy import func, select

from contract.allocation import AllocationState
from harness.service_cluster import Cluster, start_cluster, stop_cluster, stop_process
from scheduler.cli.redis_server import RedisServer
from scheduler.store.models import Metric
from scheduler.store.states import JobState

pytestmark = pytest.mark.slow

STEPS = 2000  # about 6-10 s of training on a 2-core machine
# Faults that strike as soon as the first restart point is saved (about 1 s in) still need the
# job to be running when the test looks: a quiet machine with a warm fork server trained 1000 steps
# in under 3 s, and the restart points went with the job's end before the test saw one.
SHORT = STEPS
EVERY = 50  # disp_freq: train/loss is reported at each multiple


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """The module's own redis-server, so that the last test can restart it empty."""
    server = RedisServer(tmp_path_factory.mktemp("fault-redis"), persist=False, password="pw")
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def cluster(
    tmp_path_factory: pytest.TempPathFactory, redis_server: RedisServer
) -> Iterator[Cluster]:
    found = start_cluster(tmp_path_factory.mktemp("fault-data"), redis_server.url)
    yield found
    stop_cluster(found)


def submit(cluster: Cluster, steps: int, **overrides: object) -> int:
    return cluster.submit(train_steps=steps, disp_freq=EVERY, **overrides)


def start_agent_unless_running(cluster: Cluster, name: str) -> None:
    """A second node agent, started by whichever test needs it first."""
    running = cluster.agents.get(name)
    if running is None or running.poll() is not None:
        cluster.start_agent(name, slots=2)


def running_with_a_restart_point(cluster: Cluster, job_id: int) -> None:
    """Wait until the job has trained a while and saved a restart point."""
    restart = cluster.settings.artifacts() / "jobs" / str(job_id) / "restart"
    cluster.wait_for(
        f"job {job_id} to train and save a restart point",
        lambda: cluster.job(job_id).step >= 4 * EVERY and any(restart.glob("step-*.safetensors")),
    )


def assert_succeeded_once_per_step(cluster: Cluster, job_id: int, steps: int) -> None:
    cluster.wait_state(job_id, JobState.SUCCEEDED, JobState.FAILED, timeout=240)
    job = cluster.job(job_id)
    assert job.state == JobState.SUCCEEDED, (job.error, cluster.events(job_id))
    assert sorted(cluster.metric_steps(job_id, "train/loss")) == list(
        range(EVERY, steps + 1, EVERY)
    ), "a step missing or counted twice"
    run_dir = cluster.settings.artifacts() / "jobs" / str(job_id)
    cluster.wait_for("its restart points to be deleted", lambda: not (run_dir / "restart").exists())


def restart_from(cluster: Cluster, job_id: int, pattern: str) -> int:
    """The step of the (only) QUEUED event after the first whose reason matches `pattern`."""
    reasons = [reason for state, reason in cluster.events(job_id) if state == "QUEUED"][1:]
    assert len(reasons) == 1, reasons
    match = re.fullmatch(pattern, reasons[0])
    assert match is not None, reasons[0]
    return int(match.group("step"))


def test_a_killed_worker_restarts_from_its_restart_point(cluster: Cluster) -> None:
    job_id = submit(cluster, SHORT)
    running_with_a_restart_point(cluster, job_id)
    [(alloc, _)] = cluster.allocations(job_id)
    os.kill(cluster.pid(alloc.id), signal.SIGKILL)
    assert_succeeded_once_per_step(cluster, job_id, SHORT)
    step = restart_from(
        cluster,
        job_id,
        r"worker 0/0 on node-1 exited -9 \(killed by SIGKILL, perhaps out of memory; peak "
        r"memory \d+ MB\); restart 1 of 3 from step (?P<step>\d+)( \(\d+ steps to train again\))?",
    )
    assert step > 0
    assert cluster.job(job_id).restarts == 1


@pytest.mark.parametrize("framework", ["allreduce", "localsgd"])
def test_a_killed_worker_of_a_synchronous_group_restarts_the_gang(
    cluster: Cluster, framework: str
) -> None:
    gang = {"cluster.framework": framework, "cluster.nworkers_per_group": 2}
    job_id = submit(cluster, SHORT, **gang)
    running_with_a_restart_point(cluster, job_id)
    first = cluster.allocations(job_id)
    rank1 = next(alloc for alloc, _ in first if alloc.rank == 1)
    os.kill(cluster.pid(rank1.id), signal.SIGKILL)
    assert_succeeded_once_per_step(cluster, job_id, SHORT)
    restart_from(cluster, job_id, r"worker 0/1 on node-1 exited -9 .*from step (?P<step>\d+).*")
    allocations = cluster.allocations(job_id)
    assert len(allocations) == 4  # both workers, twice
    assert [a.state for a, _ in allocations[:2]] == [AllocationState.FAILED] * 2


def test_a_killed_agent_reconciles_its_orphans_when_it_starts_again(cluster: Cluster) -> None:
    # Long enough that the orphan still trains when the new agent has started (seconds).
    steps = 3 * STEPS
    job_id = submit(cluster, steps)
    running_with_a_restart_point(cluster, job_id)
    [(alloc, _)] = cluster.allocations(job_id)
    orphan = cluster.pid(alloc.id)
    agent = cluster.agents["node-1"]
    os.kill(agent.pid, signal.SIGKILL)  # the agent only: its worker lives on, unsupervised
    agent.wait()
    assert psutil.pid_exists(orphan)
    cluster.start_agent("node-1", slots=2)
    cluster.wait_for("the orphan to be stopped", lambda: not psutil.pid_exists(orphan))
    assert_succeeded_once_per_step(cluster, job_id, steps)
    restart_from(
        cluster,
        job_id,
        rf"worker 0/0 on node-1 the node agent on node-1 restarted; its process {orphan} was "
        r"stopped; restart 1 of 3 from step (?P<step>\d+).*",
    )


def test_a_stopping_agent_drains_its_job_to_another_node(cluster: Cluster) -> None:
    start_agent_unless_running(cluster, "node-2")
    job_id = submit(cluster, SHORT)
    running_with_a_restart_point(cluster, job_id)
    [(_, node)] = cluster.allocations(job_id)
    stop_process(cluster.agents[node])  # SIGTERM, as `docker compose stop` does
    assert_succeeded_once_per_step(cluster, job_id, SHORT)
    step = restart_from(
        cluster,
        job_id,
        rf"worker 0/0 on {node}: the node agent on {node} stopped; placed again from step "
        r"(?P<step>\d+)",  # the drain saved a restart point at the step it stopped
    )
    assert step > 0
    assert cluster.job(job_id).restarts == 0  # a drain is no failure
    [first, second] = cluster.allocations(job_id)
    assert first[0].state == AllocationState.DRAINED and second[1] != node
    cluster.start_agent(node, slots=2)


def test_a_killed_scheduler_loses_no_job_and_starts_none_twice(cluster: Cluster) -> None:
    standby = cluster.start_scheduler("scheduler-2")  # waits: the first holds the lease
    running = submit(cluster, STEPS)
    running_with_a_restart_point(cluster, running)
    log = cluster.logs / "scheduler-2.log"
    cluster.wait_for(
        "the second scheduler to wait", lambda: "holds the lease; waiting" in log.read_text()
    )
    os.killpg(cluster.agents["scheduler"].pid, signal.SIGKILL)
    queued = submit(cluster, STEPS)  # while no scheduler acts
    cluster.wait_for(
        "the second scheduler to take over", lambda: "holds the lease\n" in log.read_text()
    )
    for job_id in (running, queued):
        assert_succeeded_once_per_step(cluster, job_id, STEPS)
        assert len(cluster.allocations(job_id)) == 1  # tracked again, never started twice
        assert cluster.job(job_id).restarts == 0
    cluster.agents["scheduler"] = standby


def test_a_killed_worker_of_an_asynchronous_job_restarts_alone(cluster: Cluster) -> None:
    start_agent_unless_running(cluster, "node-2")  # downpour: 2 worker groups and a shard
    job_id = submit(cluster, SHORT, **{"cluster.framework": "downpour"})
    running_with_a_restart_point(cluster, job_id)
    cluster.wait_for("the second worker group to report", lambda: group_step(cluster, job_id) > 0)
    first = cluster.allocations(job_id)
    victim = next(a for a, _ in first if a.role == "worker" and a.group == 1)
    os.kill(cluster.pid(victim.id), signal.SIGKILL)
    cluster.wait_state(job_id, JobState.SUCCEEDED, JobState.FAILED, timeout=240)
    job = cluster.job(job_id)
    assert job.state == JobState.SUCCEEDED, (job.error, cluster.events(job_id))
    assert job.restarts == 1 and job.attempt == 0  # the job was never placed again
    [reason] = [r for _, r in cluster.events(job_id) if "this worker alone" in r]
    step = int(re.search(r"from its step (\d+)", reason).group(1))  # type: ignore[union-attr]
    assert step > 0
    after = cluster.allocations(job_id)
    assert len(after) == len(first) + 1  # one new process: the others trained on
    [(replacement, _)] = [(a, n) for a, n in after if a.id not in {b.id for b, _ in first}]
    assert (replacement.role, replacement.group, replacement.rank) == ("worker", 1, 0)
    with cluster.db.session() as session:
        steps = session.scalars(
            select(Metric.step).where(
                Metric.job_id == job_id, Metric.name == "train/loss", Metric.group == 1
            )
        ).all()
    # The restarted worker went on: every step of the second group reported once, none
    # missing (a kill between its ps figures and its training figures of one step once left
    # that step's train/loss missing for good).
    assert sorted(steps) == list(range(EVERY, SHORT + 1, EVERY))


def test_a_killed_stage_of_an_asynchronous_pipeline_restarts_with_its_pipeline_alone(
    cluster: Cluster,
) -> None:
    """Two downpour pipelines of two stages (6 processes with the shards): a SIGKILLed stage
    of the second pipeline restarts with that pipeline's other stage, from the shards'
    parameters, while the first pipeline trains on untouched."""
    for node in ("node-2", "node-3"):
        start_agent_unless_running(cluster, node)
    steps = 600  # a pipelined step (two stage processes, push and pull) takes tens of ms
    overrides = {"cluster.framework": "downpour", "pipeline.stages": 2}
    job_id = submit(cluster, steps, **overrides, **{"pipeline.microbatches": 2})
    running_with_a_restart_point(cluster, job_id)
    cluster.wait_for("the second pipeline to report", lambda: group_step(cluster, job_id) > 0)
    first = cluster.allocations(job_id)
    victim = next(a for a, _ in first if (a.role, a.group, a.rank) == ("worker", 1, 1))
    os.kill(cluster.pid(victim.id), signal.SIGKILL)
    cluster.wait_state(job_id, JobState.SUCCEEDED, JobState.FAILED, timeout=240)
    job = cluster.job(job_id)
    assert job.state == JobState.SUCCEEDED, (job.error, cluster.events(job_id))
    assert job.restarts == 1 and job.attempt == 0  # the job was never placed again
    [reason] = [r for _, r in cluster.events(job_id) if "pipeline 1 alone, its 2 stages" in r]
    assert int(re.search(r"from its step (\d+)", reason).group(1)) > 0  # type: ignore[union-attr]
    after = cluster.allocations(job_id)
    new = [a for a, _ in after if a.id not in {b.id for b, _ in first}]
    assert sorted((a.role, a.group, a.rank) for a in new) == [("worker", 1, 0), ("worker", 1, 1)]
    with cluster.db.session() as session:
        rows = session.execute(
            select(Metric.group, Metric.rank, Metric.step).where(
                Metric.job_id == job_id, Metric.name == "train/loss"
            )
        ).all()
    # Every stage of both pipelines reported every step once, none missing.
    for place in [(0, 0), (0, 1), (1, 0), (1, 1)]:
        reported = sorted(step for group, rank, step in rows if (group, rank) == place)
        assert reported == list(range(EVERY, steps + 1, EVERY)), place


def group_step(cluster: Cluster, job_id: int) -> int:
    with cluster.db.session() as session:
        step = session.scalar(
            select(func.max(Metric.step)).where(Metric.job_id == job_id, Metric.group == 1)
        )
    return int(step or 0)


def test_a_checkpoint_that_cannot_be_written_fails_with_the_reason_alone(
    cluster: Cluster,
) -> None:
    job_id = cluster.submit(train_steps=40, disp_freq=10, **{"cluster.max_restarts": 0})
    blocked = cluster.settings.artifacts() / "jobs" / str(job_id) / "checkpoints"
    blocked.parent.mkdir(parents=True, exist_ok=True)
    blocked.write_text("a file where the checkpoints directory should be")
    cluster.wait_state(job_id, JobState.FAILED, JobState.SUCCEEDED)
    error = cluster.job(job_id).error or ""
    assert (
        f"cannot write checkpoint step-00000040.safetensors to {blocked}: File exists; the "
        "earlier checkpoints are unchanged"
    ) in error
    assert "Traceback" not in error


def test_redis_restarted_empty_the_job_resumes_from_its_restart_point(
    cluster: Cluster, redis_server: RedisServer
) -> None:
    """Last: every process of the module's cluster lives through it, and runs a new job after."""
    job_id = submit(cluster, STEPS)
    running_with_a_restart_point(cluster, job_id)
    redis_server.stop()
    time.sleep(3.0)  # long enough that the job's process fails to report, not a blip
    redis_server.start()  # the same address and password, and nothing in it (no persistence)
    assert_succeeded_once_per_step(cluster, job_id, STEPS)
    assert cluster.job(job_id).restarts >= 1
    # The agents and the scheduler came through: a new job runs as usual.
    second = cluster.submit(train_steps=40, disp_freq=10)
    cluster.wait_state(second, JobState.SUCCEEDED, JobState.FAILED)
    assert cluster.job(second).state == JobState.SUCCEEDED
