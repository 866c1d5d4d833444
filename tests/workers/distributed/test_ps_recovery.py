"""A server shard killed mid-run (SIGKILL) is started again and continues where it stopped:
the job finishes with the parameters of an uninterrupted run."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import redis
import torch

from bench.local_cluster import LocalCluster, prepare_launch
from tests.conftest import EXAMPLES, compile_with_data
from workers.checkpoint import load_checkpoint, resolve_checkpoint
from workers.distributed.ps.plan import PSKeys
from workers.trainer import Trainer, TrainOptions

torch.set_num_threads(1)

JOB = EXAMPLES / "mnist1d_cnn.yaml"
STEPS = 40
COMMON = {"train_steps": STEPS, "disp_freq": 10, "test.freq": 0, "checkpoint.freq": 0}


def _shard_version(client: redis.Redis, keys: PSKeys) -> int:
    raw = client.hget(keys.state(0, 0), "version")
    return int(raw) if raw is not None else 0  # type: ignore[arg-type]


@pytest.mark.slow
def test_a_killed_shard_is_replaced_and_the_job_finishes_exactly(
    redis_url: str, cache_dir: Path, tmp_path: Path
) -> None:
    config = prepare_launch(
        JOB,
        None,
        redis_url,
        tmp_path / "ps",
        cache_dir=cache_dir,
        overrides={**COMMON, "cluster.framework": "sandblaster"},
    )
    keys = PSKeys(config.scope)
    client = redis.Redis.from_url(redis_url)
    cluster = LocalCluster(config)
    cluster.start()
    try:
        deadline = time.monotonic() + 180
        while _shard_version(client, keys) < 10:
            assert time.monotonic() < deadline, "the shard never reached version 10"
            time.sleep(0.02)
        cluster.kill(("server", 0, 0))
        killed_at = _shard_version(client, keys)
        run = cluster.wait(timeout=240)
    finally:
        cluster.stop()
    assert killed_at < STEPS
    assert run.restarts == 1
    assert run.summary["status"] == "succeeded" and run.summary["steps"] == STEPS
    # One update per step across both shard processes: nothing lost, nothing applied twice.
    assert _shard_version(client, keys) == STEPS
    log = (tmp_path / "ps" / "logs" / "server-g0r0.log").read_text()
    assert "resumed at version" in log

    # The replacement loaded the parameters and the momentum of its predecessor: the result is
    # the uninterrupted run's.
    job, data = compile_with_data(JOB.read_text(), cache_dir=cache_dir, overrides=COMMON)
    Trainer(job, data, TrainOptions(run_dir=tmp_path / "local")).run()
    local = load_checkpoint(resolve_checkpoint(tmp_path / "local")).params
    distributed = load_checkpoint(resolve_checkpoint(tmp_path / "ps")).params
    for name, tensor in local.items():
        torch.testing.assert_close(distributed[name], tensor, rtol=1e-4, atol=2e-5, msg=name)
