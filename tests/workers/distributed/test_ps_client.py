"""The client-shard protocol in one process: shards serve from threads, clients push and pull
against a real Redis. Quick checks of what the multi-process tests cannot force: a worker held
back by SSP, and shards spread over several Redis servers."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import torch

from dsl.topology import Topology
from scheduler.cli.redis_server import RedisServer
from tests.conftest import compile_with_data
from workers.distributed.ps.client import PSClient
from workers.distributed.ps.journal import SNAPSHOT_EVERY
from workers.distributed.ps.plan import Connections, PSKeys, PSPlan
from workers.distributed.ps.shard import ShardReport, ShardServer, run_shard

torch.set_num_threads(1)

JOB = {
    "name": "ps-client",
    "data": {
        "source": "synthetic",
        "task": "classification",
        "num_samples": 64,
        "num_features": 12,
        "num_classes": 3,
        "batch_size": 8,
    },
    "neuralnet": {
        "layers": [
            {"name": "data", "type": "input"},
            {"name": "fc1", "type": "dense", "srclayers": ["data"], "units": 64},
            {"name": "fc2", "type": "dense", "srclayers": ["fc1"], "units": 3},
            {"name": "loss", "type": "softmax_loss", "srclayers": ["fc2"]},
        ]
    },
    "updater": {"type": "sgd", "momentum": 0.9, "lr": {"base": 0.1}},
    "train_steps": 100,
}


class Shards:
    """Every shard of a topology, each serving from a thread."""

    def __init__(
        self,
        topology: Topology,
        redis_url: str,
        ps_urls: list[str],
        scope: str,
        job_doc: dict[str, Any] = JOB,
    ):
        job, _ = compile_with_data(job_doc, cache_dir=Path("."))
        self.reports: list[ShardReport] = []
        self.threads = [
            threading.Thread(
                target=lambda sg=sg, s=s: self.reports.append(
                    run_shard(redis_url, scope, sg, s, job.spec, topology, ps_urls=ps_urls)
                ),
                daemon=True,
            )
            for sg in range(topology.nserver_groups)
            for s in range(topology.nservers_per_group)
        ]
        for thread in self.threads:
            thread.start()

    def join(self) -> None:
        for thread in self.threads:
            thread.join(timeout=20)
        assert not any(thread.is_alive() for thread in self.threads)


def _client(
    topology: Topology, group: int, connections: Connections, scope: str, staleness: int | None
) -> PSClient:
    job, _ = compile_with_data(JOB, cache_dir=Path("."))
    for p in job.net.named_params().values():
        p.grad = torch.full_like(p, 0.01)
    return PSClient(
        job.net,
        plan=PSPlan.from_topology(topology),
        connections=connections,
        keys=PSKeys(scope),
        group=group,
        rank=0,
        staleness=staleness,
    )


@pytest.fixture
def scope() -> Iterator[str]:
    yield f"test:{uuid.uuid4().hex[:8]}"


def test_ssp_holds_a_worker_that_runs_too_far_ahead(redis_url: str, scope: str) -> None:
    topology = Topology("downpour", 2, 1, 1, 1, True, 1, 0)
    shards = Shards(topology, redis_url, [], scope)
    connections = Connections(redis_url)
    fast = _client(topology, 0, connections, scope, staleness=1)
    slow = _client(topology, 1, Connections(redis_url), scope, staleness=1)
    fast.connect()
    slow.connect()
    fast.step(0)  # one step ahead: allowed
    assert fast.stats.staleness == 1
    second = threading.Thread(target=fast.step, args=(1,))
    second.start()
    second.join(timeout=1.0)
    assert second.is_alive(), "two steps ahead of the slowest with staleness 1 must wait"
    slow.step(0)
    second.join(timeout=10)
    assert not second.is_alive()
    assert fast.stats.staleness == 1
    # Each step was applied once, on one shared copy.
    assert fast.stats.version == 3
    fast.finish()
    slow.finish()
    shards.join()
    assert [r.updates for r in shards.reports] == [3]


def test_shards_spread_over_several_redis_servers(
    redis_url: str, scope: str, tmp_path: Path
) -> None:
    second = RedisServer(tmp_path / "redis2", persist=False)
    second_url = second.start()
    try:
        urls = [redis_url, second_url]
        topology = Topology("sandblaster", 1, 1, 1, 2, True, 1, 0)
        shards = Shards(topology, redis_url, urls, scope)
        client = _client(topology, 0, Connections(redis_url, urls), scope, staleness=None)
        client.connect()
        before = {n: p.detach().clone() for n, p in client.params.items()}
        for step in range(3):
            client.step(step)
        assert client.versions == {0: 3, 1: 3}
        assert all(not torch.equal(before[n], p) for n, p in client.params.items())
        keys = PSKeys(scope)
        first, other = redis.Redis.from_url(redis_url), redis.Redis.from_url(second_url)
        assert first.exists(keys.params(0, 0)) and not first.exists(keys.params(0, 1))
        assert other.exists(keys.params(0, 1)) and not other.exists(keys.params(0, 0))
        client.finish()
        shards.join()
    finally:
        second.stop()


def test_a_replacement_shard_replays_the_updates_since_the_snapshot(
    redis_url: str, scope: str
) -> None:
    topology = Topology("sandblaster", 1, 1, 1, 1, True, 1, 0)
    plan = PSPlan.from_topology(topology)
    keys = PSKeys(scope)
    job, _ = compile_with_data(JOB, cache_dir=Path("."))
    client = _client(topology, 0, Connections(redis_url), scope, staleness=None)
    client.connect()
    slice_map = client.slice_map
    stop = threading.Event()
    first = ShardServer(Connections(redis_url), keys, plan, 0, 0, slice_map, job.spec)
    first.load(timeout=10)
    serving = threading.Thread(target=first.serve, args=(stop.is_set,), daemon=True)
    serving.start()
    steps = SNAPSHOT_EVERY + 3
    for step in range(steps):
        client.step(step)
    stop.set()
    serving.join(timeout=10)
    assert redis.Redis.from_url(redis_url).llen(keys.log(0, 0)) == 3

    # The replacement starts from the snapshot and applies the 3 logged updates again: the
    # parameters (checked bit for bit in load) and the momentum of its predecessor.
    second = ShardServer(Connections(redis_url), keys, plan, 0, 0, slice_map, job.spec)
    second.load(timeout=10)
    assert second.version == steps
    expected = first.updater.state_tensors()
    assert expected
    for name, tensor in second.updater.state_tensors().items():
        assert torch.equal(tensor, expected[name]), name
