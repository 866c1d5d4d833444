"""A host that cannot reach a parameter-server Redis: its agent says so in GET /cluster, a job
that needs the shards is not placed there and its waiting reason names the host and the
address, and once the route is back the job is placed and trains."""

from __future__ import annotations

from pathlib import Path

import pytest

from scripts.testhosts import REDIS_PORT, Cluster
from sdk.client import Client, Job
from tests.hosts.conftest import placed_on

pytestmark = pytest.mark.hosts

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
DOWNPOUR = {
    "train_steps": 100,
    "disp_freq": 20,
    "test.freq": 0,
    "checkpoint.freq": 0,
    "cluster.framework": "downpour",
    "cluster.nworker_groups": 2,
}


def unreachable(client: Client, node: str) -> list[str]:
    return next(n.ps_unreachable for n in client.cluster().nodes if n.name == node)


def queue_reason(client: Client, job: Job) -> str:
    return next((q.reason for q in client.cluster().queue if q.job_id == job.id), "")


def test_a_host_without_a_route_to_the_shards_redis_gets_no_shard_job(
    hosts: Cluster, client: Client
) -> None:
    node, ps = hosts.network.hosts["node-3"], hosts.network.hosts["ps-1"]
    hosts.network.block(node, ps.address)
    try:
        hosts.wait_for("node-3's report", lambda: bool(unreachable(client, "node-3")))
        (line,) = unreachable(client, "node-3")
        assert line.startswith(f"{ps.address}:{REDIS_PORT}")
        assert "hosts-secret" not in line
        # Two workers and a shard need all three one-slot hosts: the job waits, and says why.
        job = client.submit(EXAMPLES / "digits_mlp.yaml", overrides=DOWNPOUR)
        assert isinstance(job, Job)
        hosts.wait_for("a waiting reason", lambda: "cannot reach" in queue_reason(client, job))
        reason = queue_reason(client, job)
        assert f"node-3 cannot reach parameter-server Redis {ps.address}:{REDIS_PORT}" in reason
        assert job.refresh().state == "QUEUED" and not placed_on(client, job)
    finally:
        hosts.network.unblock(node, ps.address)
    hosts.wait_for("node-3 reaching the shards", lambda: not unreachable(client, "node-3"))
    job.wait(timeout=240, poll=0.5)
    assert job.state == "SUCCEEDED", job.error
