"""Model selection while training: validation figures, the objective's best step, the
checkpoint keep_best keeps, early stopping (also across a SIGKILL and in an allreduce job)."""

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
import yaml

from contract.rundir import CHECKPOINTS, list_checkpoints
from contract.stream import EventRecord, MetricRecord
from dsl.objective import Objective
from dsl.schema import EarlyStopConfig
from harness.local_cluster import launch_local
from tests.conftest import ROOT, clean_env, compile_with_data
from workers.checkpoint import load_checkpoint
from workers.metrics import Emitted, JsonlSink
from workers.selection import META_KEY, Selection, better
from workers.trainer import Summary, Trainer, TrainOptions

ACCURACY = Objective(metric="val/accuracy", mode="max")
LOSS = Objective(metric="val/loss", mode="min")


def plateau_job(**changes: Any) -> dict[str, Any]:
    """A digits MLP that learns for 60 steps, then (its rate 1e-9) stands still: its validation
    accuracy plateaus."""
    job: dict[str, Any] = {
        "name": "plateau",
        "seed": 4,
        "data": {"source": "digits", "batch_size": 32, "validation_fraction": 0.2},
        "neuralnet": {
            "layers": [
                {"name": "data", "type": "input"},
                {"name": "fc1", "type": "dense", "srclayers": ["data"], "units": 32},
                {"name": "relu1", "type": "relu", "srclayers": ["fc1"]},
                {"name": "fc2", "type": "dense", "srclayers": ["relu1"], "units": 10},
                {"name": "loss", "type": "softmax_loss", "srclayers": ["fc2"]},
            ]
        },
        "updater": {
            "type": "sgd",
            "momentum": 0.9,
            "lr": {"base": 0.05, "schedule": "fixed_step", "steps": [60], "values": [1e-9]},
        },
        "train_steps": 400,
        "disp_freq": 20,
        "validate": {"freq": 10},
        "early_stop": {"patience": 4},
        "checkpoint": {"freq": 0, "keep": 1},
    }
    for key, value in changes.items():
        if value is None:
            job.pop(key)
        else:
            job[key] = value
    return job


class Recorder:
    def __init__(self) -> None:
        self.metrics: list[MetricRecord] = []
        self.events: list[EventRecord] = []
        self.checkpoints: list[tuple[int, bool]] = []

    def emit(self, record: Emitted) -> None:
        if isinstance(record, MetricRecord):
            self.metrics.append(record)
        elif isinstance(record, EventRecord):
            self.events.append(record)

    def log(self, line: str) -> None:
        return None

    def checkpoint(self, step: int, path: Path, *, best: bool = False) -> None:
        self.checkpoints.append((step, best))

    def close(self) -> None:
        return None

    def series(self, name: str) -> list[tuple[int, float]]:
        return [(r.step, r.values[name]) for r in self.metrics if name in r.values]


def train(job: dict[str, Any], run_dir: Path, cache_dir: Path) -> tuple[Summary, Recorder]:
    compiled, data = compile_with_data(job, cache_dir=cache_dir)
    recorder, sink = Recorder(), JsonlSink(run_dir)
    try:
        trainer = Trainer(compiled, data, TrainOptions(run_dir=run_dir), sinks=[sink, recorder])
        return trainer.run(), recorder
    finally:
        sink.close()


def expected_stop(series: list[tuple[int, float]], patience: int) -> tuple[int, int]:
    """Where early stopping with `patience` (and min_delta 0) stops on a maximised series,
    worked out again here: (the stop step, the best step)."""
    best, best_step, stale = None, 0, 0
    for step, value in series:
        if best is None or value > best:
            best, best_step, stale = value, step, 0
        else:
            stale += 1
        if stale == patience:
            return step, best_step
    raise AssertionError("the series never stops improving for long enough")


def test_better_counts_only_an_improvement_beyond_min_delta() -> None:
    assert better("max", 0.5, None) and better("min", 0.5, None)
    assert better("max", 0.6, 0.5) and not better("max", 0.5, 0.5)
    assert not better("max", 0.55, 0.5, by=0.1) and better("max", 0.61, 0.5, by=0.1)
    assert better("min", 0.4, 0.5) and not better("min", 0.45, 0.5, by=0.1)
    assert not better("max", float("nan"), None) and not better("min", float("inf"), 1.0)


def test_the_best_is_the_best_value_while_patience_counts_from_min_delta() -> None:
    selection = Selection()
    stop = EarlyStopConfig(patience=2, min_delta=0.05)
    assert selection.observe(LOSS, 10, 1.0, 0.05)
    assert selection.observe(LOSS, 20, 0.98, 0.05)  # a new best, but no improvement by 0.05
    assert (selection.best, selection.best_step, selection.stale) == (0.98, 20, 1)
    assert not selection.exhausted(stop)
    assert not selection.observe(LOSS, 30, 0.99, 0.05)
    assert selection.exhausted(stop) and not selection.exhausted(None)
    assert selection.stop_message(LOSS, 30, stop) == (
        "stopped early at step 30: val/loss has not improved by 0.05 for 2 validations "
        "(best 0.98 at step 20)"
    )
    again = Selection.from_meta(selection.to_meta())
    assert again == selection and Selection.from_meta(None) == Selection()


def test_a_plateau_stops_at_the_right_validation(tmp_path: Path, cache_dir: Path) -> None:
    full, whole = train(plateau_job(early_stop=None), tmp_path / "full", cache_dir)
    series = whole.series("val/accuracy")
    assert [step for step, _ in series] == list(range(10, 401, 10))  # every 10 and the end
    stop, best = expected_stop(series, patience=4)
    assert stop < 400 and full.stopped_early is None and full.steps == 400

    summary, recorder = train(plateau_job(), tmp_path / "stopped", cache_dir)
    assert (summary.status, summary.steps) == ("succeeded", stop)
    assert summary.best is not None and (summary.best.metric, summary.best.step) == (
        "val/accuracy",
        best,
    )
    message = (
        f"stopped early at step {stop}: val/accuracy has not improved by 0.0 for 4 "
        f"validations (best {dict(series)[best]:.4g} at step {best})"
    )
    assert summary.stopped_early == message
    assert [(e.step, e.message) for e in recorder.events] == [(stop, message)]
    # It validates once at the stop, then tests and saves its last checkpoint there.
    assert recorder.series("val/accuracy")[-1][0] == stop
    assert [step for step, _ in recorder.series("test/accuracy")] == [stop]
    assert [step for step, _ in list_checkpoints(tmp_path / "stopped" / CHECKPOINTS)] == [stop]
    saved = json.loads((tmp_path / "stopped" / "summary.json").read_text())
    assert saved["stopped_early"] == message and saved["best"]["step"] == best


def test_keep_best_keeps_the_best_step_through_pruning(tmp_path: Path, cache_dir: Path) -> None:
    job = plateau_job(early_stop=None, train_steps=120)
    job["checkpoint"] = {"freq": 20, "keep": 1, "keep_best": True}
    job["updater"]["lr"] = {"base": 0.05}  # keeps moving: bests come and go
    summary, recorder = train(job, tmp_path, cache_dir)
    series = recorder.series("val/accuracy")
    best = max(series, key=lambda point: (point[1], -point[0]))[0]  # the first best value
    assert summary.best is not None and summary.best.step == best
    kept = [step for step, _ in list_checkpoints(tmp_path / CHECKPOINTS)]
    assert kept == sorted({best, 120})  # the latest (keep: 1) and the best
    assert summary.best.checkpoint == str(tmp_path / CHECKPOINTS / f"step-{best:08d}.safetensors")
    # Each new best was saved (or, saved anyway, marked) as it was found.
    improvements = [s for i, (s, v) in enumerate(series) if all(v > w for _, w in series[:i])]
    assert [s for s, flagged in recorder.checkpoints if flagged] == improvements
    state = Selection.from_meta(
        load_checkpoint(tmp_path / CHECKPOINTS / f"step-{best:08d}.safetensors").meta[META_KEY]
    )
    assert state.best_step == best


def test_the_objective_on_the_test_split_is_selected_at_tests(
    tmp_path: Path, cache_dir: Path
) -> None:
    job = plateau_job(early_stop=None, validate=None, train_steps=60)
    job["data"] = {"source": "digits", "batch_size": 32}
    job["test"] = {"freq": 20}
    job["checkpoint"] = {"freq": 0, "keep": 1, "keep_best": True}
    summary, recorder = train(job, tmp_path, cache_dir)
    series = recorder.series("test/accuracy")
    assert [step for step, _ in series] == [20, 40, 60] and not recorder.series("val/accuracy")
    assert summary.best is not None and summary.best.metric == "test/accuracy"
    assert summary.best.value == max(value for _, value in series)


# A net slow enough (about 10 ms a step on a core) for a SIGKILL to land mid-run.
WIDE = [
    {"name": "data", "type": "input"},
    {"name": "fc1", "type": "dense", "srclayers": ["data"], "units": 512},
    {"name": "relu1", "type": "relu", "srclayers": ["fc1"]},
    {"name": "fc2", "type": "dense", "srclayers": ["relu1"], "units": 512},
    {"name": "relu2", "type": "relu", "srclayers": ["fc2"]},
    {"name": "fc3", "type": "dense", "srclayers": ["relu2"], "units": 10},
    {"name": "loss", "type": "softmax_loss", "srclayers": ["fc3"]},
]


@pytest.mark.slow
def test_early_stopping_survives_a_sigkill_and_resume(tmp_path: Path, data_dir: Path) -> None:
    """Killed after the plateau began (validations without an improvement already counted),
    the resumed run stops at the step and with the best an uninterrupted one does."""
    job = plateau_job(train_steps=2000)
    job["neuralnet"]["layers"] = WIDE
    job["early_stop"] = {"patience": 40}
    job["checkpoint"] = {"freq": 50, "keep": 2}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    env = clean_env(TRAINYARD_DATA_DIR=str(data_dir))

    def trainyard_train(run_dir: Path, *extra: str) -> subprocess.Popen[bytes]:
        command = [sys.executable, "-m", "scheduler", "train", str(path), "--json"]
        return subprocess.Popen(
            [*command, "--run-dir", str(run_dir), *extra],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )

    whole = trainyard_train(tmp_path / "whole")
    out, _ = whole.communicate(timeout=600)
    uninterrupted = json.loads(out)
    stop = uninterrupted["steps"]
    assert uninterrupted["stopped_early"] and 250 < stop < 2000

    killed_dir = tmp_path / "killed"
    killed = trainyard_train(killed_dir)
    target = killed_dir / CHECKPOINTS / "step-00000250.safetensors"  # after the plateau began
    deadline = time.monotonic() + 300
    while not target.exists():
        assert killed.poll() is None, "the run ended before it could be killed"
        assert time.monotonic() < deadline
        time.sleep(0.01)
    os.kill(killed.pid, signal.SIGKILL)
    assert killed.wait(timeout=60) == -signal.SIGKILL
    saved = Selection.from_meta(
        load_checkpoint(list_checkpoints(killed_dir / CHECKPOINTS)[-1][1]).meta[META_KEY]
    )
    assert saved.stale > 0 and saved.best_step is not None

    resumed = trainyard_train(killed_dir, "--resume")
    out, _ = resumed.communicate(timeout=600)
    after = json.loads(out)
    assert after["steps"] == stop and after["stopped_early"] == uninterrupted["stopped_early"]
    assert after["best"]["step"] == uninterrupted["best"]["step"]


@pytest.mark.slow
def test_every_worker_of_an_allreduce_job_stops_at_one_step(
    redis_url: str, cache_dir: Path, tmp_path: Path
) -> None:
    """Two workers with the net split by feature (evaluating, and saving, are collectives):
    they stop at the step the local trainer stops at, and rank 0 keeps the best."""
    job = copy.deepcopy(plateau_job())
    job["neuralnet"]["partition_dim"] = 1
    job["checkpoint"] = {"freq": 0, "keep": 1, "keep_best": True}
    local, _ = train(job, tmp_path / "local", cache_dir)
    overrides = {"cluster.framework": "allreduce", "cluster.nworkers_per_group": 2}
    run = launch_local(
        yaml.safe_dump(job), None, redis_url, tmp_path / "run", cache_dir=cache_dir,
        overrides=overrides,
    )  # fmt: skip
    assert set(run.workers) == {(0, 0), (0, 1)}
    steps = {worker["steps"] for worker in run.workers.values()}
    assert steps == {local.steps} and local.stopped_early is not None
    assert all(worker["stopped_early"] for worker in run.workers.values())
    assert local.best is not None and run.summary["best"]["step"] == local.best.step
    kept = [step for step, _ in list_checkpoints(tmp_path / "run" / CHECKPOINTS)]
    assert kept == sorted({local.best.step, local.steps})
    assert run.summary["metrics"]["val/accuracy"] == pytest.approx(local.metrics["val/accuracy"])
