"""Jobs whose processes are on different test hosts (tests/hosts/conftest.py), in one module so
that one set of hosts serves them all, the disruptive ones last:
- node agents join over the bridge;
- an allreduce group's two workers meet across hosts and end with the local trainer's
  parameters; a downpour job's workers talk to a server shard on another host through a Redis
  on a third; a pipeline's two stages pass activations between hosts;
- a host that cannot reach the parameter-server Redis says so and gets no job that needs it;
- a host cut off mid-job is lost within the heartbeat timeout, its job resumes elsewhere from
  its restart point, and the host rejoins and takes new work."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

from harness.local_cluster import launch_local
from scripts.testhosts import REDIS_PORT, TIMINGS, Cluster
from tests.conftest import compile_with_data
from tests.hosts.conftest import NODES, alive_nodes, placed_on, run_dir
from trainyard import Client, Job
from workers.checkpoint import load_checkpoint, resolve_checkpoint
from workers.trainer import Trainer, TrainOptions

pytestmark = pytest.mark.hosts


EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
STEPS = 120
SHORT = {"train_steps": STEPS, "disp_freq": 20, "test.freq": STEPS, "checkpoint.freq": STEPS}
TIMEOUT = 240.0


def test_node_agents_on_three_hosts_join_with_their_slots(hosts: Cluster, client: Client) -> None:
    nodes = {node.name: node for node in client.cluster().nodes}
    assert set(nodes) == set(NODES)
    assert all(node.state == "ALIVE" and node.slots == 1 for node in nodes.values())


def test_an_allreduce_group_across_hosts_ends_with_the_local_trainers_parameters(
    hosts: Cluster, client: Client, cache_dir: Path, tmp_path: Path
) -> None:
    overrides = {"cluster.framework": "allreduce", "cluster.nworkers_per_group": 2}
    job = client.submit(EXAMPLES / "digits_mlp.yaml", overrides={**SHORT, **overrides})
    assert isinstance(job, Job)
    hosts.wait_for("both workers placed", lambda: len(placed_on(client, job)) == 2)
    workers = placed_on(client, job)
    assert len(set(workers.values())) == 2, workers  # one slot per host: two hosts
    job.wait(timeout=TIMEOUT, poll=0.5)
    assert job.state == "SUCCEEDED", job.error

    torch.set_num_threads(1)
    text = (EXAMPLES / "digits_mlp.yaml").read_text()
    local, data = compile_with_data(text, cache_dir=cache_dir, overrides={**SHORT, **overrides})
    Trainer(local, data, TrainOptions(tmp_path / "local")).run()
    ours = load_checkpoint(resolve_checkpoint(run_dir(hosts, job)))
    theirs = load_checkpoint(resolve_checkpoint(tmp_path / "local"))
    assert ours.step == theirs.step == STEPS
    for name, tensor in theirs.params.items():
        torch.testing.assert_close(ours.params[name], tensor, atol=2e-5, rtol=1e-4, msg=name)


def unsplit_accuracy(example: str, cache_dir: Path, run: Path, **overrides: object) -> float:
    """Test accuracy of the same job trained by the local trainer in this process."""
    torch.set_num_threads(1)
    text = (EXAMPLES / example).read_text()
    job, data = compile_with_data(text, cache_dir=cache_dir, overrides={**SHORT, **overrides})
    return float(Trainer(job, data, TrainOptions(run)).run().metrics["test/accuracy"])


def test_downpour_workers_reach_server_shards_on_another_host(
    hosts: Cluster, client: Client, cache_dir: Path, redis_url: str, tmp_path: Path
) -> None:
    overrides = {
        **SHORT,
        **{"train_steps": 200, "test.freq": 200, "checkpoint.freq": 0},
        **{"cluster.framework": "downpour", "cluster.nworker_groups": 2},
        # Momentum on top of stale gradients makes this net's asynchronous training erratic.
        **{"updater.momentum": 0.0, "updater.lr.base": 0.1},
    }
    job = client.submit(EXAMPLES / "digits_mlp.yaml", overrides=overrides)
    assert isinstance(job, Job)
    hosts.wait_for("three processes placed", lambda: len(placed_on(client, job)) == 3)
    placed = placed_on(client, job)
    workers = {node for (role, _, _), node in placed.items() if role == "worker"}
    servers = {node for (role, _, _), node in placed.items() if role == "server"}
    assert len(workers) == 2 and len(servers) == 1 and not workers & servers, placed
    job.wait(timeout=TIMEOUT, poll=0.5)
    assert job.state == "SUCCEEDED", job.error
    # The same job with every process on this one machine; asynchronous groups are not
    # bit-exact, so the two learn alike rather than identically.
    one_host = launch_local(
        EXAMPLES / "digits_mlp.yaml",
        None,
        redis_url,
        tmp_path / "one-host",
        cache_dir=cache_dir,
        overrides=overrides,
    )
    assert job.summary["test/accuracy"] == pytest.approx(
        one_host.summary["metrics"]["test/accuracy"], abs=0.05
    )


def test_a_pipelines_stages_on_two_hosts_train_as_the_unsplit_net(
    hosts: Cluster, client: Client, cache_dir: Path, tmp_path: Path
) -> None:
    job = client.submit(EXAMPLES / "digits_cnn_pipeline.yaml", overrides=SHORT)
    assert isinstance(job, Job)
    hosts.wait_for("both stages placed", lambda: len(placed_on(client, job)) == 2)
    assert len(set(placed_on(client, job).values())) == 2
    job.wait(timeout=TIMEOUT, poll=0.5)
    assert job.state == "SUCCEEDED", job.error
    local = unsplit_accuracy("digits_cnn.yaml", cache_dir, tmp_path / "local")
    assert job.summary["test/accuracy"] == pytest.approx(local, abs=0.01)


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
    job.wait(timeout=TIMEOUT, poll=0.5)
    assert job.state == "SUCCEEDED", job.error


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
    hosts.wait_for(
        "the job past a restart point", lambda: any("restart point" in line for line in job.logs())
    )
    first = set(placed_on(client, job).values())
    assert len(first) == 2
    victim = hosts.network.hosts[sorted(first)[-1]]

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
    # It resumed from a restart point, not from the start. (That point may be later than the
    # last step reported: a worker cut off trains on until its peer's absence stops it, and
    # saves restart points to the shared disk, but its reports no longer reach Redis.)
    resumed = int(restarts[0].split(" from step ")[1].split(" ")[0])
    assert 0 < resumed < ALLREDUCE["train_steps"]
    assert not [r for r in events if "exited" in r], events  # no restart was wasted

    hosts.network.set_link(victim, up=True)
    hosts.wait_for(f"{victim.name} back", lambda: alive_nodes(client) == set(NODES))
    # What ran there while it was cut off is stopped: its agent and its fork server remain.
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
