"""A host cut off mid-job: its link goes down, its node is marked lost within the heartbeat
timeout, the job is placed again on the hosts left and resumes from its restart point; when the
link comes back the node rejoins, what still ran there is stopped, and it takes new work."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from scripts.testhosts import TIMINGS, Cluster
from sdk.client import Client, Job
from tests.hosts.conftest import NODES, alive_nodes, placed_on

pytestmark = pytest.mark.hosts

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
TIMEOUT = 240.0
NODE_TIMEOUT = float(TIMINGS["TRAINYARD_NODE_TIMEOUT_SECONDS"])
ALLREDUCE = {
    "train_steps": 1500,
    "disp_freq": 50,
    "test.freq": 0,
    "checkpoint.freq": 0,
    "cluster.framework": "allreduce",
    "cluster.nworkers_per_group": 2,
}


def node_state(client: Client, name: str) -> str:
    return next(node.state for node in client.cluster().nodes if node.name == name)


def test_a_host_cut_off_mid_job_is_lost_its_job_resumes_elsewhere_and_it_rejoins(
    hosts: Cluster, client: Client
) -> None:
    job = client.submit(EXAMPLES / "digits_mlp.yaml", overrides=ALLREDUCE)
    assert isinstance(job, Job)
    # Past a restart point (one a second here), with both workers placed on two hosts.
    hosts.wait_for("the job well under way", lambda: job.refresh().step >= 300)
    first = set(placed_on(client, job).values())
    assert len(first) == 2
    victim = hosts.network.hosts[sorted(first)[-1]]
    before = job.step

    hosts.network.set_link(victim, up=False)
    cut = time.monotonic()
    hosts.wait_for(f"{victim.name} lost", lambda: node_state(client, victim.name) == "LOST")
    assert time.monotonic() - cut <= NODE_TIMEOUT + 5.0
    hosts.wait_for("the job placed again", lambda: len(placed_on(client, job)) == 2)
    assert victim.name not in placed_on(client, job).values()

    job.wait(timeout=TIMEOUT, poll=0.5)
    events = [event.reason for event in job.client.job(job.id).events()]
    assert job.state == "SUCCEEDED", events
    restarts = [r for r in events if r.startswith(f"node lost: {victim.name}")]
    assert len(restarts) == 1, events
    # It resumed from a restart point: the steps trained again are fewer than those done.
    resumed = int(restarts[0].split(" from step ")[1].split(" ")[0])
    assert 0 < resumed <= before
    assert not [r for r in events if "exited" in r], events  # no restart was wasted

    hosts.network.set_link(victim, up=True)
    hosts.wait_for(f"{victim.name} back", lambda: alive_nodes(client) == set(NODES))
    # What ran there while it was cut off is stopped: its agent and one warm standby remain.
    hosts.wait_for(
        f"the old worker on {victim.name} stopped", lambda: len(hosts.network.pids(victim)) <= 2
    )
    # And it takes new work: a job that needs all three hosts.
    spread = client.submit(
        EXAMPLES / "digits_mlp.yaml",
        overrides={
            **ALLREDUCE,
            **{"train_steps": 60, "cluster.nworkers_per_group": 3, "data.batch_size": 63},
        },
    )
    assert isinstance(spread, Job)
    hosts.wait_for("the new job on every host", lambda: len(placed_on(client, spread)) == 3)
    assert set(placed_on(client, spread).values()) == set(NODES)
    spread.wait(timeout=TIMEOUT, poll=0.5)
    assert spread.state == "SUCCEEDED", spread.error
