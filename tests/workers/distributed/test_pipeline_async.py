"""Asynchronous pipeline replicas (workers/parallel.py's `_pipeline_through_servers`) with real
stage and shard processes over a real Redis: one pipeline through the shards is exactly the
unsplit job (clipping by the whole net's norm included); each stage of each pipeline pushes and
pulls only its own layers, on shards that hold one stage's slices each, under hogwild and SSP
(downpour with staleness). examples/digits_cnn_pipeline_downpour.yaml through the service, to
the unsplit job's accuracy, is tests/scheduler/test_pipeline_service.py; a killed stage
restarting with its pipeline alone is tests/scheduler/test_faults.py."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import redis
import torch
import yaml

from harness.local_cluster import LocalCluster, launch_local, prepare_launch
from tests.conftest import compile_with_data
from tests.workers.distributed.test_pipeline_training import MLP
from workers.checkpoint import load_checkpoint, resolve_checkpoint
from workers.context import worker_dir
from workers.distributed.ps.plan import Connections, PSKeys, clear_ps_keys
from workers.distributed.ps.slicing import SliceMap
from workers.distributed.ps.wire import decode_frames
from workers.metrics import read_metrics
from workers.trainer import Trainer, TrainOptions

torch.set_num_threads(1)

pytestmark = pytest.mark.slow  # six processes start: a minute on a busy 2-core machine

STAGES = [["data", "fc1", "act1", "fc2"], ["act2", "fc3", "loss", "acc"]]


def test_one_pipeline_through_the_shards_ends_with_the_unsplit_parameters(
    redis_url: str, cache_dir: Path, tmp_path: Path
) -> None:
    """A downpour pipeline alone makes one update per step, the local trainer's: its stages
    clip by the whole net's norm before they push (MLP clips at 1.0, warms its rate up, decays
    weights), and each shard's updater applies its stage's layers' step."""
    job = copy.deepcopy(MLP)
    job["pipeline"] = {"stages": STAGES, "microbatches": 2}
    job["cluster"] = {"framework": "downpour", "nworker_groups": 1}
    run = launch_local(yaml.safe_dump(job), None, redis_url, tmp_path / "pp", cache_dir=cache_dir)
    assert run.summary["status"] == "succeeded", run.summary
    assert set(run.workers) == {(0, 0), (0, 1)}
    compiled, data = compile_with_data(MLP, cache_dir=cache_dir)
    local = Trainer(compiled, data, TrainOptions(tmp_path / "local"))
    local.run()
    saved = load_checkpoint(resolve_checkpoint(tmp_path / "pp")).params
    expected = local.net.named_params()
    assert saved.keys() == expected.keys()
    for name, param in expected.items():
        torch.testing.assert_close(saved[name], param.detach(), atol=2e-5, rtol=1e-4, msg=name)


@pytest.mark.parametrize(
    ("cluster", "server_groups"),
    [({"framework": "hogwild", "sync_freq": 5}, 2), ({"framework": "downpour", "staleness": 1}, 1)],
    ids=["hogwild", "ssp"],
)
def test_asynchronous_pipelines_push_and_pull_their_own_stages_layers(
    cluster: dict[str, Any],
    server_groups: int,
    redis_url: str,
    cache_dir: Path,
    tmp_path: Path,
) -> None:
    job = copy.deepcopy(MLP)
    job |= {"train_steps": 20, "pipeline": {"stages": STAGES, "microbatches": 2}}
    job["cluster"] = cluster
    config = prepare_launch(yaml.safe_dump(job), None, redis_url, tmp_path, cache_dir=cache_dir)
    cluster_run = LocalCluster(config)
    cluster_run.start()
    run = cluster_run.wait(600)
    assert run.summary["status"] == "succeeded", run.summary
    assert set(run.workers) == {(0, 0), (0, 1), (1, 0), (1, 1)}
    for (group, stage), worker in run.workers.items():
        assert worker["steps"] == 20
        records = read_metrics(worker_dir(tmp_path, group, stage))
        versions = [r["ps/version"] for r in records if "ps/version" in r]
        assert versions and versions[-1] > 0  # every stage pulled updated parameters
        if "staleness" in cluster:
            assert all(r["ps/staleness"] <= 1 for r in records if "ps/staleness" in r)
    # Each shard holds the slices of one stage's layers: stage 0's fc1 and fc2 on shard 0,
    # stage 1's fc3 on shard 1, in every server group.
    client = redis.Redis.from_url(redis_url)
    keys = PSKeys(config.scope)
    slice_map = SliceMap.from_json(client.get(keys.slice_map))  # type: ignore[arg-type]
    for server_group in range(server_groups):
        held = []
        for shard in (0, 1):
            blob = client.get(keys.params(server_group, shard))
            assert blob is not None
            frames = decode_frames(blob)
            held.append({slice_map.slices[f.slice_id].param.split("/")[0] for f in frames})
            assert frames[0].version > 0  # updated by its stage's pushes
        assert held == [{"fc1", "fc2"}, {"fc3"}]
    client.close()
    connections = Connections(redis_url)
    clear_ps_keys(connections, keys)
    connections.close()
