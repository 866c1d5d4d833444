"""Each worker process confined to what its allocation grants, with real processes: a node agent
(`trainyard node`, announcing two fake GPUs and 1400 MB for its 2 slots), the scheduler loop
in a thread, a private redis-server and a SQLite file.

A job whose worker passes its memory limit is killed alone by its memory cgroup (or refused
the allocation under RLIMIT_DATA where the machine has no cgroup to give), fails at once with
the limit and the step in its error (not restarted as if its machine were lost), and its
neighbour on the same node trains to the end; each worker sees only the GPU placement gave it.
Which of the two limits did it is checked apart: where this machine lets a process make memory
cgroups (probed here by hand, not through scheduler/agent/confine.py), the agent must have used
one, and the kernel's own record of the agent's cgroups (their peak charge, and on v2 the
oom_kill count) is read back; only where it does not may the worker have limited itself.
"""

from __future__ import annotations

import contextlib
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from sqlalchemy import select

from contract.allocation import ExitCode
from contract.keys import Keys
from contract.settings import Settings
from harness.service_cluster import Cluster, stop_process
from scheduler.daemon.loop import run_scheduler
from scheduler.store.database import Database, migrate
from scheduler.store.models import LogLine
from scheduler.store.states import JobState

pytestmark = pytest.mark.slow

CGROUP_ROOT = Path("/sys/fs/cgroup")
MB = 2**20


def own_cgroup(pid: int | str = "self") -> dict[str, str]:
    """A process's cgroup per controller ("" for v2's unified hierarchy)."""
    found = {}
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        for controller in controllers.split(","):
            found[controller] = path.lstrip("/")
    return found


def memory_cgroups_here() -> int | None:
    """The version of memory cgroup (1 or 2) that this process can make below its own with a
    limit, as a node agent would; None where it cannot."""
    own = own_cgroup()
    if "memory" in own and (CGROUP_ROOT / "memory").is_dir():
        probe = CGROUP_ROOT / "memory" / own["memory"] / f"probe-{uuid.uuid4().hex[:8]}"
        try:
            probe.mkdir()
            (probe / "memory.limit_in_bytes").write_text(str(64 * MB))
            return 1
        except OSError:
            return None
        finally:
            with contextlib.suppress(OSError):
                probe.rmdir()
    if "" in own and (CGROUP_ROOT / "cgroup.controllers").is_file():
        base = CGROUP_ROOT / own[""]
        probe = base / f"probe-{uuid.uuid4().hex[:8]}"
        try:
            if "memory" not in (base / "cgroup.subtree_control").read_text().split():
                (base / "cgroup.subtree_control").write_text("+memory")
            probe.mkdir()
            (probe / "memory.max").write_text(str(64 * MB))
            return 2
        except OSError:
            return None
        finally:
            with contextlib.suppress(OSError):
                probe.rmdir()
    return None


def agent_cgroups(agent_pid: int, node: str) -> Path:
    """The folder of cgroups the node agent `agent_pid` made below its own."""
    own = own_cgroup(agent_pid)
    if "memory" in own and (CGROUP_ROOT / "memory").is_dir():
        base = CGROUP_ROOT / "memory" / own["memory"]
    else:
        base = CGROUP_ROOT / own[""]
    return base / f"trainyard-{node}-{agent_pid}"


def kernel_record(folder: Path) -> tuple[int, int | None]:
    """The most memory the kernel ever charged to `folder` and the cgroups below it, and the
    processes it killed there for a limit (v2's hierarchical memory.events; v1 counts those
    only in the killed process's own cgroup, gone with it: None)."""
    if (folder / "memory.max_usage_in_bytes").exists():
        return int((folder / "memory.max_usage_in_bytes").read_text()), None
    events = dict(line.split() for line in (folder / "memory.events").read_text().splitlines())
    return int((folder / "memory.peak").read_text()), int(events["oom_kill"])


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> Iterator[Cluster]:
    data_dir = tmp_path_factory.mktemp("confine-data")
    settings = Settings(
        data_dir=data_dir,
        redis_url=redis_url,
        redis_prefix=f"c{uuid.uuid4().hex[:8]}",
        heartbeat_seconds=0.5,
        # No node is lost here: long enough that no stall of a busy machine trips it.
        node_timeout_seconds=120.0,
        schedule_seconds=0.1,
    )
    migrate(settings.sql_url())
    found = Cluster(
        settings,
        Database(settings.sql_url()),
        redis.Redis.from_url(redis_url),
        Keys(settings.redis_prefix),
        {},
        data_dir,
        vital=("node-m",),
    )
    env = found.environment(
        TRAINYARD_NODE_NAME="node-m",
        TRAINYARD_NODE_SLOTS="2",
        TRAINYARD_NODE_GPUS="2",
        TRAINYARD_NODE_MEMORY_MB="1400",
    )
    found.spawn("node-m", "node", env)
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
        found.db.dispose()
        found.client.close()


def log_lines(cluster: Cluster, job_id: int) -> list[str]:
    with cluster.db.session() as session:
        return list(session.scalars(select(LogLine.line).where(LogLine.job_id == job_id)))


def test_a_worker_past_its_memory_limit_dies_alone_and_its_neighbour_finishes(
    cluster: Cluster,
) -> None:
    one_gpu = {"cluster.resources.gpus_per_worker": 1}
    neighbour = cluster.submit(train_steps=3000, disp_freq=10, **one_gpu)
    cluster.wait_for("the neighbour's first metrics", lambda: cluster.job(neighbour).step > 0)
    # As if the estimate were wrong: a step's activations take 1024 x 200,000 floats (800 MB)
    # and its limit is 300 MB (this path skips the submission's checks).
    hog = cluster.submit(
        train_steps=50,
        **one_gpu,
        **{
            "cluster.resources.memory_mb": 300,
            "data.batch_size": 1024,
            "neuralnet.layers.1.units": 200_000,
        },
    )
    cluster.wait_state(hog, JobState.FAILED, JobState.SUCCEEDED)
    job = cluster.job(hog)
    assert job.state == JobState.FAILED
    assert job.error is not None
    assert job.error.startswith("worker 0/0 on node-m exceeded its 300 MB limit at step 0;")
    assert "raise cluster.resources.memory_mb" in job.error
    assert job.restarts == 0 and job.attempt == 0  # failed, not placed again
    [(alloc, _)] = cluster.allocations(hog)
    assert alloc.exit_code == ExitCode.OUT_OF_MEMORY
    assert cluster.job(neighbour).state == JobState.RUNNING  # on the same node all along

    # Which limit killed it: the cgroup wherever the machine lets the agent make one.
    [confined] = [line for line in log_lines(cluster, hog) if "memory limit 300 MB" in line]
    version = memory_cgroups_here()
    if version is None:
        assert confined.endswith("memory limit 300 MB (RLIMIT_DATA)"), confined
    else:
        assert confined.endswith("memory limit 300 MB (its memory cgroup)"), confined
        peak, kills = kernel_record(agent_cgroups(cluster.agents["node-m"].pid, "node-m"))
        assert peak >= 280 * MB, f"the kernel charged the agent's cgroups {peak / MB:.0f} MB"
        assert kills is None or kills >= 1

    cluster.wait_state(neighbour, JobState.SUCCEEDED, JobState.FAILED)
    assert cluster.job(neighbour).state == JobState.SUCCEEDED, cluster.job(neighbour).error
    assert cluster.agents["node-m"].poll() is None  # the agent lived through it

    # Each worker was given its own GPU, and its environment named that one alone.
    devices = {job_id: cluster.allocations(job_id)[0][0].devices for job_id in (neighbour, hog)}
    assert sorted(map(tuple, devices.values())) == [(0,), (1,)]  # type: ignore[arg-type]
    for job_id, (index,) in devices.items():  # type: ignore[misc]
        said = [line for line in log_lines(cluster, job_id) if "CUDA_VISIBLE_DEVICES" in line]
        assert said and said[0].startswith(f"worker 0/0: CUDA_VISIBLE_DEVICES={index}; "), said
