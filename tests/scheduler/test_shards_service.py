"""A sharded dataset trained by allreduce on 2 workers through the session's real stack: each
worker streams its own disjoint part of the shards, and the checkpoints record the stream."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml
from safetensors import safe_open

from contract.rundir import CHECKPOINTS, checkpoint_path, job_run_dir
from tests.conftest import RunningStack
from tests.trainyard.test_cli_client import run, submitted_id
from workers.data import STREAM_KEY

pytestmark = pytest.mark.slow


def test_allreduce_on_two_workers_streams_disjoint_shards(
    stack: RunningStack, tmp_path: Path
) -> None:
    folder = tmp_path / "shards"
    folder.mkdir()
    rng = np.random.default_rng(0)
    centres = rng.normal(scale=3, size=(3, 8))
    for index in range(7):
        y = rng.integers(0, 3, size=96)
        x = (centres[y] + rng.normal(size=(96, 8))).astype(np.float32)
        np.save(folder / f"{index:05d}.x.npy", x)
        np.save(folder / f"{index:05d}.y.npy", y)
    document = {
        "name": "shards-allreduce",
        "seed": 0,
        "data": {"source": "shards", "path": str(folder), "batch_size": 32, "shuffle_buffer": 64},
        "neuralnet": {
            "layers": [
                {"name": "data", "type": "input"},
                {"name": "fc1", "type": "dense", "srclayers": ["data"], "units": 16},
                {"name": "relu", "type": "relu", "srclayers": ["fc1"]},
                {"name": "fc2", "type": "dense", "srclayers": ["relu"], "units": 3},
                {"name": "loss", "type": "softmax_loss", "srclayers": ["fc2"]},
            ]
        },
        "train_one_batch": {"alg": "bp"},
        "updater": {"type": "sgd", "momentum": 0.9, "lr": {"base": 0.05}},
        "train_steps": 40,  # 2 epochs of 18 steps (6 x 96 samples, 2 workers x 16 a step)
        "disp_freq": 10,
        "test": {"freq": 0, "steps": 0},
        "checkpoint": {"freq": 20, "keep": 3},
        "cluster": {"framework": "allreduce", "nworkers_per_group": 2},
    }
    job_file = tmp_path / "job.yaml"
    job_file.write_text(yaml.safe_dump(document))
    result = run(stack, "submit", str(job_file), "--follow")
    assert result.exit_code == 0, result.output
    assert "SUCCEEDED" in result.stdout
    job_id = submitted_id(result)
    checkpoints = job_run_dir(stack.data_dir / "artifacts", job_id) / CHECKPOINTS
    with safe_open(str(checkpoint_path(checkpoints, 20)), framework="numpy") as handle:
        stream = json.loads(handle.metadata()[STREAM_KEY])
    # Step 20 is step 2 of the second epoch; each worker 32 samples into its own range.
    assert stream["epoch"] == 1 and stream["position"] == 2
    assert stream["world"] == 2 and stream["positions"] == [32, 32]
    assert sorted(stream["shard_order"]) == [f"{i:05d}" for i in range(6)]
    shown = json.loads(run(stack, "show", str(job_id), "--json").stdout)
    assert shown["summary"]["test/accuracy"] > 0.8
