"""The test hosts of scripts/testhosts.py as a fixture: network namespaces on a private bridge,
the broker Redis, API server and scheduler on `head`, a node agent on each of `node-1`..`node-3`
(one slot each, so a job of two workers spans two hosts) and a parameter-server Redis on `ps-1`.

Tests that use them are marked `hosts`; where this machine cannot make namespaces (not root,
no iproute2) they are skipped with the reason. `pytest -m hosts` runs them alone."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from scripts.testhosts import Cluster, running_cluster, unavailable
from trainyard import Client, Job

NODES = ("node-1", "node-2", "node-3")


@pytest.fixture(scope="session")
def needs_namespaces() -> None:
    """Skip, saying why, where this machine cannot make test hosts."""
    reason = unavailable()
    if reason:
        pytest.skip(reason)


@pytest.fixture(scope="module")
def hosts(tmp_path_factory: pytest.TempPathFactory, needs_namespaces: None) -> Iterator[Cluster]:
    with running_cluster(tmp_path_factory.mktemp("hosts"), nodes=3, slots=1, ps_hosts=1) as cluster:
        with Client(cluster.url, cluster.token) as client:
            cluster.wait_for("three nodes alive", lambda: alive_nodes(client) == set(NODES))
        yield cluster


@pytest.fixture(scope="module")
def client(hosts: Cluster) -> Iterator[Client]:
    with Client(hosts.url, hosts.token) as found:
        yield found


def alive_nodes(client: Client) -> set[str]:
    return {node.name for node in client.cluster().nodes if node.state == "ALIVE"}


def placed_on(client: Client, job: Job) -> dict[tuple[str, int, int], str]:
    """(role, group, rank) -> node of the job's running processes (GET /cluster)."""
    for running in client.cluster().running:
        if running.job_id == job.id:
            return {(a.role, a.group, a.rank): a.node for a in running.allocations}
    return {}


def run_dir(hosts: Cluster, job: Job) -> Path:
    return hosts.data_dir / "artifacts" / "jobs" / str(job.id)
