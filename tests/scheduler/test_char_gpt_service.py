"""The char GPT through the whole service (`trainyard submit` on a real stack: its own Redis,
SQLite, scheduler and node agent): the job, its 2-stage pipeline and its 4-trial sweep, each
shortened to a few steps."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.trainyard.test_cli_client import run, submitted_id

if TYPE_CHECKING:
    from conftest import RunningStack

pytestmark = pytest.mark.slow

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
STEPS = 12
SHORT = {
    "train_steps": STEPS,
    "disp_freq": 6,
    "validate.freq": 6,
    "validate.steps": 2,
    "test.steps": 2,
}
SETS = [item for key, value in SHORT.items() for item in ("--set", f"{key}={value}")]


def _shown(stack: RunningStack, job_id: int) -> dict[str, object]:
    shown = run(stack, "show", str(job_id), "--json")
    assert shown.exit_code == 0, shown.output
    job: dict[str, object] = json.loads(shown.stdout)
    return job


@pytest.mark.parametrize(
    ("example", "stages"), [("char_gpt.yaml", 1), ("char_gpt_pipeline.yaml", 2)]
)
def test_the_char_gpt_trains_through_the_service(
    stack: RunningStack, example: str, stages: int
) -> None:
    result = run(stack, "submit", str(EXAMPLES / example), *SETS, "--follow")
    assert result.exit_code == 0, result.output
    job = _shown(stack, submitted_id(result))
    assert job["state"] == "SUCCEEDED" and job["step"] == STEPS
    assert job["topology"]["stages"] == stages  # type: ignore[index]
    summary = job["summary"]
    assert isinstance(summary, dict) and summary["val/loss"] < 4.5 and summary["test/loss"] < 4.5


def test_the_char_gpt_sweep_runs_its_four_trials(stack: RunningStack) -> None:
    result = run(stack, "submit", str(EXAMPLES / "char_gpt_sweep.yaml"), *SETS, "--follow")
    assert result.exit_code == 0, result.output
    found = re.search(r"submitted sweep (\d+) \(char-gpt-sweep\): RUNNING, 4 trials", result.stdout)
    assert found, result.output
    assert re.search(r"best: trial \d \(job \d+\) val/loss \d\.\d+", result.stdout), result.stdout
    sweep = int(found.group(1))
    jobs = json.loads(run(stack, "jobs", "--json").stdout)
    trials = [j for j in jobs if j["sweep_id"] == sweep]
    assert len(trials) == 4 and all(j["state"] == "SUCCEEDED" for j in trials)
    best = run(stack, "sweep", "best", str(sweep), "--json")
    assert best.exit_code == 0, best.output
    params = json.loads(best.stdout)["params"]
    assert set(params) == {"updater.lr.base", "neuralnet.layers.block.layers.fc.units"}
    assert params["neuralnet.layers.block.layers.fc.units"] in (64, 128, 256)
