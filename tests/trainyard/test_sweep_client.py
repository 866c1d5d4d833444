"""Sweeps end to end: the CLI and the SDK against the session's real stack (`trainyard up`: API,
scheduler with its sweep thread, a node agent with 2 slots, Redis, SQLite). Trials train the
digits MLP for 40 steps, validated on a tenth of the training samples, which the sweep selects
on."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.trainyard.test_cli_client import run
from trainyard import Client, Job, JobSpecRejected
from trainyard.sweeps import Sweep

if TYPE_CHECKING:
    from conftest import RunningStack

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
BASE = (
    (ROOT / "examples" / "digits_mlp.yaml")
    .read_text()
    .replace("train_steps: 2000", "train_steps: 40")
    .replace("test: {freq: 500}", "validate: {freq: 20}")
    .replace("disp_freq: 100", "disp_freq: 10")
    .replace("test_fraction: 0.2}", "test_fraction: 0.2, validation_fraction: 0.1}")
)
SEARCH = """
search:
  algorithm: random
  max_trials: 3
  max_parallel: 2
  seed: 1
  space:
    updater.lr.base: {loguniform: [0.01, 0.2]}
    neuralnet.layers.fc1.units: {choice: [32, 64]}
"""


@pytest.fixture(scope="module")
def client(stack: RunningStack) -> Client:
    return Client(stack.url, stack.token)


@pytest.fixture(scope="module")
def followed(stack: RunningStack, tmp_path_factory: pytest.TempPathFactory) -> int:
    """A 3-trial sweep submitted and followed to its end with the CLI."""
    path = tmp_path_factory.mktemp("sweep") / "sweep.yaml"
    path.write_text(BASE + SEARCH)
    result = run(stack, "submit", str(path), "--follow")
    assert result.exit_code == 0, result.output
    found = re.search(r"submitted sweep (\d+) \(digits-mlp\): RUNNING, 3 trials", result.stdout)
    assert found, result.output
    # Chosen by its validation accuracy, shown with its test accuracy beside it.
    best = r"best: trial \d \(job \d+\) val/accuracy 0\.\d+ \(test/accuracy 0\.\d+\)"
    assert re.search(best, result.stdout), result.stdout
    assert "warning" not in result.output
    assert "updater.lr.base" in result.stdout  # the live table's last frame
    return int(found.group(1))


def test_cli_lists_shows_and_answers_the_best_trial(stack: RunningStack, followed: int) -> None:
    listed = run(stack, "sweep", "list", "--json")
    assert listed.exit_code == 0, listed.output
    [mine] = [s for s in json.loads(listed.stdout) if s["id"] == followed]
    assert (mine["state"], mine["trials_ended"], mine["trial_count"]) == ("SUCCEEDED", 3, 3)
    shown = run(stack, "sweep", "show", str(followed))
    assert shown.exit_code == 0 and "SUCCEEDED" in shown.stdout, shown.output
    assert re.search(r"its test/accuracy: 0\.\d+ \(the test split", shown.stdout), shown.stdout
    best = run(stack, "sweep", "best", str(followed), "--json")
    assert best.exit_code == 0, best.output
    answer = json.loads(best.stdout)
    assert {"job_id", "params", "value"} <= set(answer)
    assert set(answer["params"]) == {"updater.lr.base", "neuralnet.layers.fc1.units"}
    jobs = json.loads(run(stack, "jobs", "--json").stdout)
    trials = {j["id"]: j for j in jobs if j["sweep_id"] == followed}
    assert sorted(j["trial_number"] for j in trials.values()) == [0, 1, 2]
    assert answer["metric"] == "val/accuracy"
    assert trials[answer["job_id"]]["summary"]["val/accuracy"] == answer["value"]
    assert answer["value"] == max(j["summary"]["val/accuracy"] for j in trials.values())
    assert all(j["objective"] == "val/accuracy" for j in trials.values())


def test_sdk_reads_a_finished_sweep(client: Client, followed: int) -> None:
    sweep = client.sweep(followed)
    assert sweep.done and sweep.state == "SUCCEEDED"
    trials = sweep.trials()
    assert [t.number for t in trials] == [0, 1, 2] and all(t.state == "SUCCEEDED" for t in trials)
    for trial in trials:
        assert 0.01 <= trial.params["updater.lr.base"] <= 0.2
        assert trial.params["neuralnet.layers.fc1.units"] in (32, 64)
    best = sweep.best()
    assert best is not None and best.value == max(t.value or 0.0 for t in trials)
    job = sweep.best_job()
    assert job is not None and job.id == best.job_id and job.info.sweep_id == followed
    assert followed in {s.id for s in client.sweeps()}
    found = sweep.importance()
    assert (found.metric, found.evaluator, found.trials) == ("val/accuracy", "fanova", 3)
    detail = sweep.detail()
    assert detail.best_test is not None and detail.best_test.metric == "test/accuracy"
    assert detail.best_test.value == job.summary["test/accuracy"]
    assert set(found.importances) == {"updater.lr.base", "neuralnet.layers.fc1.units"}


def test_cli_prints_the_parameter_importance(stack: RunningStack, followed: int) -> None:
    result = run(stack, "sweep", "importance", str(followed), "--json")
    assert result.exit_code == 0, result.output
    answer = json.loads(result.stdout)
    assert answer["trials"] == 3 and abs(sum(answer["importances"].values()) - 1.0) < 1e-6
    table = run(stack, "sweep", "importance", str(followed))
    assert table.exit_code == 0 and "importance for val/accuracy (fanova, 3 trials)" in (
        table.stdout
    )


def test_sdk_submits_a_sweep_and_cancels_it(client: Client) -> None:
    long = BASE.replace("train_steps: 40", "train_steps: 10000000")
    sweep = client.submit(long + SEARCH)
    assert isinstance(sweep, Sweep) and sweep.state == "RUNNING"
    job = client.submit(long)  # a document without search is still a job
    assert isinstance(job, Job)
    job.cancel()
    deadline = time.monotonic() + 60
    while len(sweep.trials()) < 2:  # max_parallel
        assert time.monotonic() < deadline, sweep
        time.sleep(0.2)
    sweep.cancel()
    ended = sweep.wait(timeout=60, poll=0.2)
    assert ended.state == "CANCELLED"
    trials = ended.trials()
    assert len(trials) == 2 and all(t.state == "CANCELLED" for t in trials)


def test_selecting_on_the_test_split_is_warned_at_submission(
    client: Client, stack: RunningStack, tmp_path: Path
) -> None:
    path = tmp_path / "on-test.yaml"
    path.write_text(
        BASE.replace("train_steps: 40", "train_steps: 10000000")
        + SEARCH.replace("search:\n", "search:\n  metric: test/accuracy\n")
    )
    result = run(stack, "submit", str(path))
    assert result.exit_code == 0, result.output
    assert (
        "warning the sweep selects on test/accuracy: selecting on the test split biases the "
        "best trial's score; add data.validation_fraction and use val/..."
    ) in " ".join(result.stderr.split())
    found = re.search(r"submitted sweep (\d+)", result.stdout)
    assert found, result.output
    sweep = client.sweep(int(found.group(1)))
    assert sweep.warnings == sweep.detail().warnings and len(sweep.warnings) == 1
    deadline = time.monotonic() + 60
    while len(sweep.trials()) < 2:  # its first pass done: none is created after the cancel
        assert time.monotonic() < deadline, sweep
        time.sleep(0.2)
    assert sweep.cancel().wait(timeout=60, poll=0.2).state == "CANCELLED"


def test_an_invalid_space_is_rejected_with_located_errors(
    client: Client, stack: RunningStack, tmp_path: Path
) -> None:
    bad = BASE + SEARCH.replace("[32, 64]", "[32, 0]")
    with pytest.raises(JobSpecRejected) as info:
        client.submit(bad)
    [issue] = info.value.errors
    assert issue.path == "search.space.neuralnet.layers.fc1.units" and issue.line is not None
    path = tmp_path / "bad.yaml"
    path.write_text(bad)
    result = run(stack, "submit", str(path))
    assert result.exit_code == 1
    assert re.search(rf"{re.escape(str(path))}:\d+:5: search.space", result.stderr), result.stderr
    missing = run(stack, "sweep", "best", "987654")
    assert missing.exit_code == 1 and "404" in missing.stderr
