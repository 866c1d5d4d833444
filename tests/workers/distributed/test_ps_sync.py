"""Sandblaster is exact: two workers pushing to two shards end where the local trainer ends on
the combined batch. Real processes, a real Redis."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from harness.local_cluster import launch_local
from tests.conftest import EXAMPLES, compile_with_data
from workers.checkpoint import load_checkpoint, resolve_checkpoint
from workers.metrics import read_metrics
from workers.trainer import Trainer, TrainOptions

torch.set_num_threads(1)

JOB = EXAMPLES / "mnist1d_cnn.yaml"  # clips by global norm, biases have lr_scale 2, wd_scale 0
STEPS = 30
COMMON = {"train_steps": STEPS, "disp_freq": 10, "test.freq": 0, "checkpoint.freq": 0}


def _local_params(cache_dir: Path, run_dir: Path) -> dict[str, torch.Tensor]:
    job, data = compile_with_data(JOB.read_text(), cache_dir=cache_dir, overrides=COMMON)
    Trainer(job, data, TrainOptions(run_dir=run_dir)).run()
    return load_checkpoint(resolve_checkpoint(run_dir)).params


@pytest.mark.slow
def test_sandblaster_matches_the_local_trainer_on_the_combined_batch(
    redis_url: str, cache_dir: Path, tmp_path: Path
) -> None:
    run = launch_local(
        JOB,
        None,
        redis_url,
        tmp_path / "ps",
        cache_dir=cache_dir,
        overrides={
            **COMMON,
            "cluster.framework": "sandblaster",
            "cluster.nworkers_per_group": 2,
            "cluster.nservers_per_group": 2,
        },
        timeout=240,
    )
    assert run.summary["status"] == "succeeded" and run.summary["steps"] == STEPS
    local = _local_params(cache_dir, tmp_path / "local")
    distributed = load_checkpoint(resolve_checkpoint(tmp_path / "ps")).params
    assert distributed.keys() == local.keys()
    for name, tensor in local.items():
        torch.testing.assert_close(distributed[name], tensor, rtol=1e-4, atol=2e-5, msg=name)
    # Both workers hold the same parameters: one update per step, version == step.
    accuracy = {key: summary["metrics"]["test/accuracy"] for key, summary in run.workers.items()}
    assert accuracy[(0, 0)] == accuracy[(0, 1)]
    versions = [
        r["ps/version"]
        for r in read_metrics(tmp_path / "ps" / "workers" / "g0r1")
        if "ps/version" in r
    ]
    assert versions == [10.0, 20.0, 30.0]
