"""Jobs whose processes are on different test hosts: node agents join over the bridge, an
allreduce group's two workers meet across hosts and end with the local trainer's parameters, a
downpour job's workers talk to server shards on other hosts through a Redis on a third, and a
pipeline's two stages pass activations between hosts."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from bench.local_cluster import launch_local
from scripts.testhosts import Cluster
from sdk.client import Client, Job
from tests.conftest import compile_with_data
from tests.hosts.conftest import NODES, placed_on, run_dir
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
