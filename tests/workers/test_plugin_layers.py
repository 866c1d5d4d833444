"""A plugin's layer and updater (docs/plugins.md's rmsnorm and signsgd) through the trainer's
hard paths: a run killed with SIGKILL mid-run resumes from its checkpoint to the parameters of
an uninterrupted run, and a net split by feature over an all-reduce group keeps the plugin
layer whole between the split layers and ends with the local trainer's parameters."""

from __future__ import annotations

import copy
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from contract.rundir import CHECKPOINTS
from dsl.plugins import load_plugins, unloaded_after
from harness.local_cluster import launch_local
from tests.conftest import ROOT, clean_env, compile_with_data
from workers.checkpoint import load_checkpoint, resolve_checkpoint
from workers.distributed.partition import layer_mode
from workers.trainer import Trainer, TrainOptions

torch.set_num_threads(1)

PLUGIN = ROOT / "tests" / "fixtures" / "plugin_dist" / "trainyard_rmsnorm.py"
TOL = {"atol": 2e-5, "rtol": 1e-4}

# Wide enough (a few ms a step on a core) for a SIGKILL to land between two checkpoints.
JOB: dict[str, Any] = {
    "name": "rmsnorm-restart",
    "seed": 11,
    "data": {"source": "synthetic", "task": "classification", "num_samples": 512,
             "num_features": 64, "num_classes": 4, "batch_size": 32, "test_fraction": 0.25},
    "neuralnet": {"layers": [
        {"name": "data", "type": "input"},
        {"name": "fc1", "type": "dense", "srclayers": ["data"], "units": 256},
        {"name": "norm", "type": "rmsnorm", "srclayers": ["fc1"], "eps": 1e-5},
        {"name": "act", "type": "relu", "srclayers": ["norm"]},
        {"name": "fc2", "type": "dense", "srclayers": ["act"], "units": 256},
        {"name": "out", "type": "dense", "srclayers": ["fc2"]},
        {"name": "loss", "type": "softmax_loss", "srclayers": ["out"]},
    ]},
    "updater": {"type": "signsgd", "momentum": 0.5, "lr": {"base": 0.001}},
    "train_steps": 600,
    "disp_freq": 100,
    "test": {"freq": 0},
    "checkpoint": {"freq": 50, "keep": 2},
}  # fmt: skip


@pytest.mark.slow
def test_a_plugin_job_killed_mid_run_resumes_to_the_uninterrupted_parameters(
    tmp_path: Path, data_dir: Path
) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(JOB))
    env = clean_env(TRAINYARD_DATA_DIR=str(data_dir), TRAINYARD_PLUGINS=str(PLUGIN))

    def trainyard_train(run_dir: Path, *extra: str) -> subprocess.Popen[bytes]:
        command = [sys.executable, "-m", "scheduler", "train", str(path), "--json"]
        return subprocess.Popen(
            [*command, "--run-dir", str(run_dir), *extra],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )

    # The uninterrupted run and the one to kill, side by side (a core each).
    whole = trainyard_train(tmp_path / "whole")
    killed_dir = tmp_path / "killed"
    killed = trainyard_train(killed_dir)
    target = killed_dir / CHECKPOINTS / "step-00000100.safetensors"
    deadline = time.monotonic() + 120
    while not target.exists():
        assert killed.poll() is None, killed.communicate()[1].decode()[-2000:]
        assert time.monotonic() < deadline
        time.sleep(0.005)
    os.kill(killed.pid, signal.SIGKILL)
    assert killed.wait(timeout=60) == -signal.SIGKILL
    killed.communicate()
    kept = load_checkpoint(resolve_checkpoint(killed_dir))
    assert 100 <= kept.step < JOB["train_steps"]  # killed mid-run
    assert "norm/scale" in kept.params  # the plugin layer's parameter is in the restart point

    out, err = whole.communicate(timeout=300)
    assert whole.returncode == 0, err.decode()[-2000:]
    assert json.loads(out)["steps"] == JOB["train_steps"]
    resumed = trainyard_train(killed_dir, "--resume")
    out, err = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, err.decode()[-2000:]
    assert json.loads(out)["steps"] == JOB["train_steps"]
    log = (killed_dir / "train.log").read_text()
    assert f"resumed from step-{kept.step:08d}.safetensors at step {kept.step}" in log

    a = load_checkpoint(resolve_checkpoint(tmp_path / "whole"))
    b = load_checkpoint(resolve_checkpoint(killed_dir))
    assert a.params.keys() == b.params.keys() and a.updater.keys() == b.updater.keys()
    assert all(torch.equal(a.params[k], b.params[k]) for k in a.params)
    # signsgd's momentum buffers came back too: they are part of the equal end state
    assert any("momentum" in k for k in a.updater)
    assert all(torch.equal(a.updater[k], b.updater[k]) for k in a.updater)
    assert not torch.equal(a.params["norm/scale"], torch.ones_like(a.params["norm/scale"]))


SPLIT: dict[str, Any] = {
    "name": "rmsnorm-feature-split",
    "seed": 5,
    "data": {"source": "synthetic", "task": "classification", "num_samples": 400,
             "num_features": 24, "num_classes": 4, "batch_size": 16, "test_fraction": 0.25},
    "neuralnet": {"partition_dim": 1, "layers": [
        {"name": "data", "type": "input"},
        {"name": "fc1", "type": "dense", "srclayers": ["data"], "units": 32},
        {"name": "norm", "type": "rmsnorm", "srclayers": ["fc1"], "eps": 1e-5},
        {"name": "act", "type": "tanh", "srclayers": ["norm"]},
        {"name": "fc2", "type": "dense", "srclayers": ["act"]},
        {"name": "loss", "type": "softmax_loss", "srclayers": ["fc2"]},
    ]},
    "updater": {"type": "sgd", "momentum": 0.9, "lr": {"base": 0.05}},
    "train_steps": 8,
    "disp_freq": 4,
    "test": {"freq": 0},
}  # fmt: skip


@pytest.mark.slow
def test_a_plugin_layer_runs_whole_between_layers_split_by_feature(
    redis_url: str, cache_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Splitting by feature applies to the layer types that register a splitter (dense,
    convolutions); a plugin layer has none, so under `partition_dim: 1` it runs whole on every
    worker (the net gathers fc1's slices before it), and the two workers end with the local
    trainer's parameters, the plugin layer's scale included."""
    monkeypatch.setenv("TRAINYARD_PLUGINS", str(PLUGIN))
    with unloaded_after():
        load_plugins()
        compiled, data = compile_with_data(copy.deepcopy(SPLIT), cache_dir=cache_dir)
        modes = {c.config.name: layer_mode(c.config, 1) for c in compiled.net.compiled}
        assert modes["fc1"] == modes["fc2"] == "feature" and modes["norm"] == "replicated"
        run = launch_local(
            yaml.safe_dump(SPLIT), None, redis_url, tmp_path / "group", cache_dir=cache_dir,
            overrides={"cluster.framework": "allreduce", "cluster.nworkers_per_group": 2},
        )  # fmt: skip
        assert run.summary["status"] == "succeeded", run.summary
        assert set(run.workers) == {(0, 0), (0, 1)}
        local = Trainer(compiled, data, TrainOptions(tmp_path / "local"))
        local.run()
    group = load_checkpoint(resolve_checkpoint(tmp_path / "group"))
    expected = local.net.named_params()
    assert set(group.params) == set(expected) and "norm/scale" in expected
    for name, param in expected.items():
        torch.testing.assert_close(group.params[name], param.detach(), **TOL, msg=name)
    assert not torch.equal(expected["norm/scale"].detach(), torch.ones(32))
