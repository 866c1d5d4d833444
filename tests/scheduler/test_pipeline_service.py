"""Pipelined examples through the whole service: `trainyard submit` on a real stack (its own
Redis, SQLite, scheduler and a node agent of 4 slots) places every stage, and the job ends
SUCCEEDED with the unsplit job's accuracy (the same batches, so the same parameters)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import torch

from tests.conftest import compile_with_data
from tests.trainyard.test_cli_client import run, submitted_id
from trainyard import Client
from workers.trainer import Trainer, TrainOptions

if TYPE_CHECKING:
    from conftest import RunningStack

pytestmark = pytest.mark.slow

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
STEPS = 200
SHORT = {"train_steps": STEPS, "disp_freq": 50, "test.freq": 0}


@pytest.fixture(scope="module")
def four_slots(stack_factory: Callable[..., RunningStack]) -> RunningStack:
    return stack_factory(env={"TRAINYARD_NODE_SLOTS": "4"})


@pytest.fixture(scope="module")
def unsplit_accuracy(cache_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> float:
    torch.set_num_threads(1)
    text = (EXAMPLES / "digits_cnn.yaml").read_text()
    job, data = compile_with_data(text, cache_dir=cache_dir, overrides=SHORT)
    summary = Trainer(job, data, TrainOptions(tmp_path_factory.mktemp("unsplit"))).run()
    return summary.metrics["test/accuracy"]


@pytest.mark.parametrize(
    ("example", "extra", "workers"),
    [
        ("digits_cnn_pipeline.yaml", {}, {(0, 0), (0, 1)}),
        ("digits_cnn_pipeline.yaml", {"pipeline.schedule": "gpipe"}, {(0, 0), (0, 1)}),
        ("digits_cnn_pipeline_replicas.yaml", {}, {(0, 0), (0, 1), (1, 0), (1, 1)}),
        ("digits_cnn_pipeline_zbv.yaml", {}, {(0, 0), (0, 1)}),
    ],
    ids=["1f1b", "gpipe", "replicas", "zbv"],
)
def test_a_pipelined_example_trains_through_the_service(
    four_slots: RunningStack,
    unsplit_accuracy: float,
    example: str,
    extra: dict[str, str],
    workers: set[tuple[int, int]],
) -> None:
    sets = [
        item for key, value in {**SHORT, **extra}.items() for item in ("--set", f"{key}={value}")
    ]
    result = run(four_slots, "submit", str(EXAMPLES / example), *sets, "--follow")
    assert result.exit_code == 0, result.output
    job_id = submitted_id(result)
    shown = run(four_slots, "show", str(job_id), "--json")
    assert shown.exit_code == 0, shown.output
    job = json.loads(shown.stdout)
    assert job["state"] == "SUCCEEDED" and job["step"] == STEPS
    assert job["topology"]["stages"] == 2
    assert job["summary"]["test/accuracy"] == pytest.approx(unsplit_accuracy, abs=0.01)
    # Every stage of every pipeline ran and reported, each with its own busy fraction.
    with Client(four_slots.url, four_slots.token) as client:
        series = client.get_json(f"/jobs/{job_id}/metrics", name="train/pipeline/busy")["series"]
    busy = {(s["group"], s["rank"]) for s in series}
    assert busy == workers
