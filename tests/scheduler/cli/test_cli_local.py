"""The local CLI commands: `trainyard validate` and `trainyard train`, in process."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from typer.testing import CliRunner, Result

from scheduler.cli.main import app
from workers.checkpoint import load_checkpoint, resolve_checkpoint
from workers.metrics import read_metrics

ROOT = Path(__file__).resolve().parents[3]
DIGITS_MLP = ROOT / "examples" / "digits_mlp.yaml"

TINY_JOB = """\
# A small digits classifier: a few hundred milliseconds a run.
name: tiny
seed: 4
data: {source: digits, batch_size: 32}
neuralnet:
  layers:
    - {name: data, type: input}
    - {name: fc1, type: dense, srclayers: [data], units: 32}
    - {name: relu1, type: relu, srclayers: [fc1]}
    - {name: drop1, type: dropout, srclayers: [relu1], ratio: 0.1}
    - {name: fc2, type: dense, srclayers: [drop1], units: 10}
    - {name: loss, type: softmax_loss, srclayers: [fc2]}
updater:
  type: nesterov
  momentum: 0.9
  lr: {base: 0.05, schedule: fixed_step, steps: [30], values: [0.01]}
train_steps: 50
disp_freq: 10
test: {freq: 20}
checkpoint: {freq: 20, keep: 2}
"""

BROKEN_JOB = """\
# a source that is not a layer
name: broken
data: {source: digits, batch_size: 32}
neuralnet:
  layers:
    - {name: data, type: input}
    - {name: fc1, type: dense, srclayers: [dat], units: 10}
    - {name: loss, type: softmax_loss, srclayers: [fc1]}
updater: {type: sgd, lr: {base: 0.1, schedule: fixed}}
train_steps: 10
"""

CLOCK_KEYS = ("time", "samples_per_sec")


@pytest.fixture(autouse=True)
def _data_dir(cli_env: Path) -> None:
    """Every command here finds its data cache through TRAINYARD_DATA_DIR."""


def invoke(*args: str | Path) -> Result:
    # Wide enough that rich never wraps a table row or an error line (one quotes tmp_path,
    # which an xdist worker's basetemp lengthens past 200 columns).
    return CliRunner().invoke(app, [str(a) for a in args], env={"COLUMNS": "400"})


def write_job(tmp_path: Path, text: str = TINY_JOB, name: str = "job.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def train_json(*args: str | Path) -> dict[str, Any]:
    result = invoke("train", *args, "--json")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert len(lines) == 1, result.stdout  # the progress display goes to stderr
    payload: dict[str, Any] = json.loads(lines[0])
    return payload


def params_of(run_dir: Path) -> dict[str, torch.Tensor]:
    return load_checkpoint(resolve_checkpoint(run_dir)).params


def test_validate_prints_the_layer_table_and_totals() -> None:
    result = invoke("validate", DIGITS_MLP)
    assert result.exit_code == 0, result.output
    rows = {
        cells[0]: cells[1:]
        for line in result.stdout.splitlines()
        if len(cells := [c.strip() for c in line.strip("│┃ ").split("│")]) == 6
    }
    assert rows["fc1"] == ["innerproduct", "data", "(256,)", "16,640", "0"]
    assert rows["tanh1"] == ["stanh", "fc1", "(256,)", "0", "0"]
    assert rows["fc3"] == ["innerproduct", "tanh2", "(10,)", "1,290", "0"]
    assert rows["loss"] == ["softmax_loss", "fc3", "()", "0", "0"]
    assert rows["data"] == ["input", "-", "(1, 8, 8)", "0", "0"]
    assert "digits-mlp: 7 layers" in result.stdout
    assert "total parameters: 50,826" in result.stdout
    assert "algorithm: bp" in result.stdout and "updater: sgd" in result.stdout
    topology = "topology: local: 1 worker group(s) x 1 worker(s); 1 process(es), 1 slot(s)"
    assert topology in result.stdout
    # 50,826 parameters, their gradients and momentum; 1797 digits; the runtime's 400 MB.
    words = " ".join(result.stdout.split())  # the console wraps long lines
    assert "memory per worker: about 402 MB (parameters 1, gradients 1, updater state 1," in words


PIPELINED = ("--set", "pipeline.stages=3", "--set", "pipeline.microbatches=8")


def table_rows(stdout: str, cells: int) -> dict[str, list[str]]:
    """The rows of the printed tables with `cells` columns, by their first cell."""
    return {
        row[0]: row[1:]
        for line in stdout.splitlines()
        if len(row := [c.strip() for c in line.strip("│┃ ").split("│")]) == cells
    }


def test_validate_shows_the_pipeline_stages() -> None:
    result = invoke("validate", DIGITS_MLP, *PIPELINED)
    assert result.exit_code == 0, result.output
    assert "pipeline: 3 stages x 8 micro-batches, 1f1b (estimated costs)" in result.stdout
    # The estimates follow from the shapes alone: fc2 (256 x 128) is the heaviest layer.
    assert table_rows(result.stdout, 5) == {
        "0": ["data, fc1, tanh1", "16,640", "0.136", "0.05"],
        "1": ["fc2", "32,896", "0.252", "0.02"],
        "2": ["tanh2, fc3, loss", "1,290", "0.015", "0.01"],
    }
    assert (
        "bubble: 20.0%   ideal speed-up: 2.40x   balance: 53.3%   expected speed-up: 1.28x"
        in result.stdout
    )
    assert "topology: local: 1 worker group(s) x 3 worker(s)" in result.stdout


def test_validate_profile_cuts_by_measured_costs() -> None:
    result = invoke("validate", DIGITS_MLP, *PIPELINED, "--profile")
    assert result.exit_code == 0, result.output
    assert "pipeline: 3 stages x 8 micro-batches, 1f1b (measured costs)" in result.stdout
    stages = table_rows(result.stdout, 5)
    assert sorted(stages) == ["0", "1", "2"]
    layers = [name for row in stages.values() for name in row[0].split(", ")]
    assert layers == ["data", "fc1", "tanh1", "fc2", "tanh2", "fc3", "loss"]
    assert all(float(row[2]) > 0 for row in stages.values())
    assert "bubble: 20.0%   ideal speed-up: 2.40x" in result.stdout

    unpipelined = invoke("validate", DIGITS_MLP, "--profile")
    assert unpipelined.exit_code == 2
    assert "the job has no pipeline section" in unpipelined.stderr


def test_a_stage_memory_cap_no_cut_fits_is_located(tmp_path: Path) -> None:
    path = write_job(
        tmp_path,
        TINY_JOB + "pipeline: {stages: 2, microbatches: 4, max_stage_memory_mb: 0.001}\n",
    )
    result = invoke("validate", path)
    assert result.exit_code == 1
    assert (
        f"{path}:21:40: pipeline.max_stage_memory_mb: no cut of the net into 2 stages keeps "
        "every stage's activations within 0.001 MB"
    ) in result.stderr
    assert "hint: raise max_stage_memory_mb to" in result.stderr
    assert "nothing was run" in result.stderr and result.stdout == ""


def test_set_overrides_a_layer_by_name() -> None:
    result = invoke("validate", DIGITS_MLP, "--set", "neuralnet.layers.fc1.units=32")
    assert result.exit_code == 0, result.output
    # fc1 64*32+32, fc2 32*128+128, fc3 128*10+10
    assert "total parameters: 7,594" in result.stdout
    assert "(32,)" in result.stdout and "2,080" in result.stdout


def test_validate_shows_located_errors(tmp_path: Path) -> None:
    path = write_job(tmp_path, BROKEN_JOB)
    result = invoke("validate", path)
    assert result.exit_code == 1
    assert result.stdout == ""
    assert f"{path}:7:44: neuralnet.layers[1].srclayers[0]: layer 'fc1' names source 'dat'" in (
        result.stderr
    )
    assert "did you mean 'data'?" in result.stderr
    assert "nothing was run" in result.stderr
    assert "Traceback" not in result.output


def test_errors_from_overrides_and_data_are_reported_not_raised(tmp_path: Path) -> None:
    malformed = invoke("validate", DIGITS_MLP, "--set", "train_steps")
    assert malformed.exit_code == 1
    assert "an override must look like key.path=value" in malformed.stderr
    unknown = invoke("validate", DIGITS_MLP, "--set", "neuralnet.layers.fc9.units=3")
    assert unknown.exit_code == 1 and "no item named or numbered 'fc9'" in unknown.stderr
    too_big = invoke("train", DIGITS_MLP, "--set", "data.batch_size=5000")
    assert too_big.exit_code == 1
    assert f"{DIGITS_MLP}:5:" in too_big.stderr
    assert "batch_size 5000 is larger than the 1438 training samples" in too_big.stderr
    assert too_big.exception is None or isinstance(too_big.exception, SystemExit)


@pytest.mark.parametrize("command", ["validate", "train"])
def test_a_missing_job_file_is_a_clear_error(command: str, tmp_path: Path) -> None:
    for target in (tmp_path / "nope.yaml", tmp_path):
        result = invoke(command, target)
        assert result.exit_code == 2
        assert f"cannot read {target}" in result.stderr
        assert "Traceback" not in result.output
        assert isinstance(result.exception, SystemExit)


def test_train_json_writes_the_run_directory(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    summary = train_json(write_job(tmp_path), "--run-dir", run_dir)
    assert summary["run_dir"] == str(run_dir)
    assert summary["status"] == "succeeded" and summary["steps"] == 50
    assert summary["wall_time"] > 0
    assert {"train/loss", "train/accuracy", "test/loss", "test/accuracy"} <= set(summary["metrics"])
    saved = json.loads((run_dir / "summary.json").read_text())
    assert saved == {k: v for k, v in summary.items() if k != "run_dir"}

    records = read_metrics(run_dir)
    assert [r["step"] for r in records if "train/loss" in r] == [10, 20, 30, 40, 50]
    assert [r["step"] for r in records if "test/loss" in r] == [20, 40, 50]
    assert [r["lr"] for r in records if "lr" in r] == pytest.approx([0.05] * 3 + [0.01] * 2)
    assert all(r["samples_per_sec"] > 0 for r in records if "train/loss" in r)
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == [
        "step-00000040.safetensors",
        "step-00000050.safetensors",
    ]
    assert len(list((run_dir / "tensorboard").glob("events.out.tfevents.*"))) == 1
    assert not list(run_dir.rglob("*.tmp"))


def test_train_is_reproducible_and_resumes_exactly(tmp_path: Path) -> None:
    job = write_job(tmp_path)
    train_json(job, "--run-dir", tmp_path / "a")
    train_json(job, "--run-dir", tmp_path / "b")

    def values(run_dir: Path) -> list[dict[str, Any]]:
        return [{k: v for k, v in r.items() if k not in CLOCK_KEYS} for r in read_metrics(run_dir)]

    assert values(tmp_path / "a") == values(tmp_path / "b")
    a, b = params_of(tmp_path / "a"), params_of(tmp_path / "b")
    assert all(torch.equal(a[k], b[k]) for k in a)

    # Stopped after 27 steps (a checkpoint at 20, the last at 27), then resumed to 50.
    parts = tmp_path / "parts"
    first = train_json(job, "--run-dir", parts, "--set", "train_steps=27")
    assert first["steps"] == 27
    resumed = train_json(job, "--run-dir", parts, "--resume")
    assert resumed["steps"] == 50 and resumed["status"] == "succeeded"
    assert "resumed from step-00000027.safetensors at step 27" in (parts / "train.log").read_text()
    c = params_of(parts)
    assert all(torch.equal(a[k], c[k]) for k in a)
    steps = [r["step"] for r in read_metrics(parts) if "train/loss" in r]
    assert steps == [10, 20, 27, 30, 40, 50]  # appended, not replaced


def test_a_fresh_run_replaces_the_previous_outputs(tmp_path: Path) -> None:
    job, run_dir = write_job(tmp_path), tmp_path / "run"
    train_json(job, "--run-dir", run_dir)
    train_json(job, "--run-dir", run_dir, "--set", "train_steps=10", "--set", "test.freq=0")
    assert [r["step"] for r in read_metrics(run_dir)] == [10, 10]
    assert [p.name for p in (run_dir / "checkpoints").iterdir()] == ["step-00000010.safetensors"]
    assert len(list((run_dir / "tensorboard").iterdir())) == 1  # the first run's file went


def test_a_missing_init_from_checkpoint_is_a_clear_error(tmp_path: Path) -> None:
    result = invoke(
        "train",
        write_job(tmp_path),
        "--run-dir",
        tmp_path / "run",
        "--set",
        "checkpoint.init_from=../pretrained",
    )
    assert result.exit_code == 2
    assert "checkpoint.init_from: no checkpoint found at" in result.stderr
    assert "pretrained" in result.stderr
    assert "Traceback" not in result.output


def test_an_invalid_job_trains_nothing(tmp_path: Path) -> None:
    result = invoke("train", write_job(tmp_path, BROKEN_JOB), "--run-dir", tmp_path / "run")
    assert result.exit_code == 1 and "nothing was run" in result.stderr
    assert not (tmp_path / "run").exists()


def test_a_distributed_job_is_sent_to_the_service(tmp_path: Path) -> None:
    result = invoke(
        "train",
        write_job(tmp_path),
        "--run-dir",
        tmp_path / "run",
        "--set",
        "cluster.framework=allreduce",
    )
    assert result.exit_code == 2
    assert "cluster.framework 'allreduce' needs the service" in result.stderr
    assert "trainyard submit" in result.stderr


SEARCH = """\
search:
  metric: test/accuracy
  mode: max
  max_trials: 4
  space:
    updater.lr.base: {loguniform: [0.01, 0.1]}
    neuralnet.layers.fc1.units: {choice: [16, 0]}
"""


def test_validate_checks_a_sweeps_space_and_train_refuses_a_sweep(tmp_path: Path) -> None:
    bad = write_job(tmp_path, TINY_JOB + SEARCH)
    result = invoke("validate", bad)
    assert result.exit_code == 1
    assert f"{bad}:27:5: search.space.neuralnet.layers.fc1.units: choice value 0" in result.stderr
    good = write_job(tmp_path, TINY_JOB + SEARCH.replace("[16, 0]", "[16, 32]"), "good.yaml")
    result = invoke("validate", good)
    assert result.exit_code == 0, result.output
    assert "sweep: tpe over updater.lr.base, neuralnet.layers.fc1.units: 4 trial(s)" in (
        result.stdout
    )
    result = invoke("train", good, "--run-dir", tmp_path / "run")
    assert result.exit_code == 2 and "trainyard submit" in result.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")
def test_cuda_without_a_device_is_a_clear_error(tmp_path: Path) -> None:
    result = invoke("train", write_job(tmp_path), "--device", "cuda")
    assert result.exit_code == 2
    assert "--device cuda: torch sees no CUDA device here" in result.stderr


def test_fp16_on_a_cpu_is_a_clear_error(tmp_path: Path) -> None:
    job = write_job(tmp_path)
    result = invoke("train", job, "--set", "precision=fp16")
    assert result.exit_code == 1  # refused at validation: the job asks for no GPU
    assert "precision fp16 is for GPUs" in result.stderr
    gpu = ("--set", "cluster.resources.gpus_per_worker=1")
    result = invoke("train", job, "--set", "precision=fp16", *gpu, "--run-dir", tmp_path / "r")
    assert result.exit_code == 2
    assert "precision fp16 is for GPUs, and this worker trains on cpu" in result.stderr


def test_schema_prints_the_job_language() -> None:
    result = invoke("schema")
    assert result.exit_code == 0
    schema = json.loads(result.stdout)
    assert schema["title"] == "Trainyard job"
    assert {"name", "data", "neuralnet", "updater", "train_steps"} <= set(schema["required"])


def test_a_bad_setting_is_named_without_a_traceback(tmp_path: Path) -> None:
    """Settings come from the environment; the command says which one is wrong, and why."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith(("TRAINYARD_", "REDIS_"))}
    env.update(TRAINYARD_DATA_DIR=str(tmp_path), DATABASE_URL="mysql://u@db-host/trainyard")
    done = subprocess.run(
        [sys.executable, "-m", "scheduler", "api", "--port", "0"],
        cwd=ROOT,
        env={**env, "COLUMNS": "200"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert "bad setting DATABASE_URL: DATABASE_URL names 'mysql'" in done.stderr
    assert "PostgreSQL" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "trainyard.db").exists()
