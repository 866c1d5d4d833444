"""Pipelined jobs with real stage processes (gloo, met through a real Redis): after N steps
their parameters are those of the unpipelined job on the same batches, for both schedules,
with and without rematerialisation, 2 and 3 stages, skip connections and cuts that carry two
tensors; replicas under all-reduce equal the local trainer on the combined batch; their
checkpoints are the unpipelined job's, both ways."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from dsl.planner import plan_pipeline
from dsl.plugins import load_plugins, unloaded_after
from harness.local_cluster import LocalRun, launch_local
from tests.conftest import compile_with_data
from workers.checkpoint import load_checkpoint, resolve_checkpoint
from workers.context import worker_dir
from workers.distributed.stages import stage_flows
from workers.metrics import read_metrics
from workers.trainer import Trainer, TrainOptions

# Several training processes per test: in `make test`, not `make check`.
pytestmark = pytest.mark.slow

torch.set_num_threads(1)

TOL = {"atol": 2e-5, "rtol": 1e-4}
EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
PLUGIN = Path(__file__).resolve().parents[2] / "fixtures" / "plugin_dist" / "trainyard_rmsnorm.py"

MLP: dict[str, Any] = {
    "name": "pipeline-mlp",
    "seed": 5,
    "data": {"source": "synthetic", "task": "classification", "num_samples": 400,
             "num_features": 24, "num_classes": 4, "batch_size": 16, "test_fraction": 0.25},
    "neuralnet": {"layers": [
        {"name": "data", "type": "input"},
        {"name": "fc1", "type": "dense", "srclayers": ["data"], "units": 64},
        {"name": "act1", "type": "relu", "srclayers": ["fc1"]},
        {"name": "fc2", "type": "dense", "srclayers": ["act1"], "units": 48},
        {"name": "act2", "type": "tanh", "srclayers": ["fc2"]},
        {"name": "fc3", "type": "dense", "srclayers": ["act2"]},
        {"name": "loss", "type": "softmax_loss", "srclayers": ["fc3"]},
        {"name": "acc", "type": "accuracy", "srclayers": ["fc3"]},
    ]},
    "updater": {"type": "sgd", "momentum": 0.9, "weight_decay": 0.001,
                "clip": {"grad_norm": 1.0}, "lr": {"base": 0.05, "warmup_steps": 3}},
    "train_steps": 12,
    "disp_freq": 4,
    "test": {"freq": 6},
}  # fmt: skip

# A skip connection inside the middle stage (sum), one over it (act1 into the last stage's
# concat, handed through the middle one), and cuts that carry two tensors each.
DAG: dict[str, Any] = {
    **MLP,
    "name": "pipeline-dag",
    "neuralnet": {"layers": [
        {"name": "data", "type": "input"},
        {"name": "fc1", "type": "dense", "srclayers": ["data"], "units": 32},
        {"name": "act1", "type": "relu", "srclayers": ["fc1"]},
        {"name": "fc2", "type": "dense", "srclayers": ["act1"], "units": 32},
        {"name": "act2", "type": "tanh", "srclayers": ["fc2"]},
        {"name": "fc3", "type": "dense", "srclayers": ["act1"], "units": 32},
        {"name": "sum", "type": "add", "srclayers": ["act2", "fc3"]},
        {"name": "fc4", "type": "dense", "srclayers": ["sum"], "units": 16},
        {"name": "act4", "type": "relu", "srclayers": ["fc4"]},
        {"name": "both", "type": "concat", "srclayers": ["act4", "act1"]},
        {"name": "out", "type": "dense", "srclayers": ["both"]},
        {"name": "loss", "type": "softmax_loss", "srclayers": ["out"]},
        {"name": "acc", "type": "accuracy", "srclayers": ["out"]},
    ]},
}  # fmt: skip
DAG_STAGES = [
    ["data", "fc1", "act1", "fc2"],
    ["act2", "fc3", "sum", "fc4"],
    ["act4", "both", "out", "loss", "acc"],
]


def _pipelined(base: dict[str, Any], **pipeline: Any) -> dict[str, Any]:
    job = copy.deepcopy(base)
    job["pipeline"] = pipeline
    return job


def _local(job: dict[str, Any], cache_dir: Path, run_dir: Path) -> Trainer:
    compiled, data = compile_with_data(job, cache_dir=cache_dir)
    trainer = Trainer(compiled, data, TrainOptions(run_dir))
    trainer.run()
    return trainer


def _launch(job: dict[str, Any], redis_url: str, cache_dir: Path, run_dir: Path) -> LocalRun:
    run = launch_local(yaml.safe_dump(job), None, redis_url, run_dir, cache_dir=cache_dir)
    assert run.summary["status"] == "succeeded", run.summary
    return run


def _assert_same_params(run_dir: Path, local: Trainer) -> None:
    ckpt = load_checkpoint(resolve_checkpoint(run_dir))
    expected = local.net.named_params()
    assert set(ckpt.params) == set(expected)
    for name, param in expected.items():
        torch.testing.assert_close(ckpt.params[name], param.detach(), **TOL, msg=name)
    # The updater's state of every stage is in the one file, under the usual names.
    assert set(ckpt.updater) == set(local.updater.state_tensors())


def test_stage_flows_pass_skips_through_and_cut_two_tensors(cache_dir: Path) -> None:
    job = _pipelined(DAG, stages=DAG_STAGES, microbatches=4)
    compiled, _ = compile_with_data(job, cache_dir=cache_dir)
    flows = stage_flows(compiled.net, plan_pipeline(compiled), "train")
    assert [f.receives for f in flows] == [(), (("act1", 0), ("fc2", 0)), (("fc4", 0), ("act1", 0))]
    assert flows[2].sends == (("out", 0),)
    assert [s.name for s in flows[2].head] == ["loss", "acc"]


@pytest.mark.parametrize(
    ("base", "stages", "schedule", "microbatches", "rematerialize"),
    [
        (MLP, 2, "gpipe", 4, False),
        (MLP, 3, "1f1b", 4, True),
        (DAG, DAG_STAGES, "1f1b", 8, False),
        (DAG, DAG_STAGES, "gpipe", 2, True),
        (
            DAG,
            [DAG_STAGES[0] + DAG_STAGES[1][:2], DAG_STAGES[1][2:] + DAG_STAGES[2]],
            "1f1b",
            2,
            True,
        ),
    ],
    ids=[
        "mlp-k2-gpipe",
        "mlp-k3-1f1b-remat",
        "dag-k3-1f1b",
        "dag-k3-gpipe-remat",
        "dag-k2-1f1b-remat",
    ],
)
def test_a_pipelined_job_ends_with_the_unpipelined_parameters(
    base: dict[str, Any],
    stages: Any,
    schedule: str,
    microbatches: int,
    rematerialize: bool,
    redis_url: str,
    cache_dir: Path,
    tmp_path: Path,
) -> None:
    job = _pipelined(
        base,
        stages=stages,
        schedule=schedule,
        microbatches=microbatches,
        rematerialize=rematerialize,
    )
    run = _launch(job, redis_url, cache_dir, tmp_path / "pipeline")
    local = _local(base, cache_dir, tmp_path / "local")
    _assert_same_params(tmp_path / "pipeline", local)
    count = stages if isinstance(stages, int) else len(stages)
    assert set(run.workers) == {(0, s) for s in range(count)}
    # Every stage reports the last stage's loss and test figures; and its own busy fraction.
    for stage in range(count):
        metrics = run.workers[(0, stage)]["metrics"]
        assert metrics["test/loss"] == pytest.approx(
            local.evaluation.last_test["test/loss"], rel=1e-4
        )
        records = read_metrics(worker_dir(tmp_path / "pipeline", 0, stage))
        busy = [r["train/pipeline/busy"] for r in records if "train/pipeline/busy" in r]
        assert busy and all(0.0 < b <= 1.0 for b in busy)


@pytest.mark.parametrize(
    ("base", "pipeline", "kinds"),
    [
        (MLP, {"stages": 2, "schedule": "interleaved_1f1b", "virtual_stages": 2}, "FB"),
        (MLP, {"stages": 2, "schedule": "zero_bubble", "rematerialize": True}, "FBW"),
        (MLP, {"stages": 2, "schedule": "zbv", "rematerialize": True}, "FBW"),
        (
            DAG,
            {
                "stages": [DAG_STAGES[0], DAG_STAGES[1], DAG_STAGES[2][:1], DAG_STAGES[2][1:]],
                "schedule": "zero_bubble",
                "virtual_stages": 2,
            },
            "FBW",
        ),
    ],
    ids=["mlp-k2v2-interleaved", "mlp-k2-zb-remat", "mlp-k2-zbv-remat", "dag-k2v2-zb"],
)
def test_virtual_stage_schedules_end_with_the_unpipelined_parameters(
    base: dict[str, Any],
    pipeline: dict[str, Any],
    kinds: str,
    redis_url: str,
    cache_dir: Path,
    tmp_path: Path,
) -> None:
    """Interleaved 1F1B, zero bubble and ZB-V: two stages run their pieces (round-robin or in
    a V, where the first stage also holds the loss) and reach the unpipelined parameters; the
    timelines show each piece's forward, backward and, split, weight-gradient passes."""
    job = _pipelined(base, microbatches=4, **pipeline)
    run = _launch(job, redis_url, cache_dir, tmp_path / "pipeline")
    local = _local(base, cache_dir, tmp_path / "local")
    _assert_same_params(tmp_path / "pipeline", local)
    assert set(run.workers) == {(0, 0), (0, 1)}
    per_stage = (
        1 if pipeline["schedule"] == "zero_bubble" and "virtual_stages" not in pipeline else 2
    )
    for stage in range(2):
        metrics = run.workers[(0, stage)]["metrics"]
        assert metrics["test/loss"] == pytest.approx(
            local.evaluation.last_test["test/loss"], rel=1e-4
        )
        lines = (worker_dir(tmp_path / "pipeline", 0, stage) / "timeline.jsonl").read_text()
        events = json.loads(lines.splitlines()[-1])["events"]
        assert {kind for kind, *_ in events} == set(kinds)
        pieces = {piece for *_, piece in events}
        assert len(pieces) == per_stage and stage in pieces
        # Every piece runs every micro-batch's forward once.
        forwards = sorted((piece, mb) for kind, mb, _, _, piece in events if kind == "F")
        assert forwards == sorted((p, mb) for p in pieces for mb in range(4))


@pytest.mark.slow
def test_the_pipelined_char_gpt_ends_with_the_unpipelined_parameters(
    redis_url: str, cache_dir: Path, tmp_path: Path
) -> None:
    """examples/char_gpt_pipeline.yaml, cut between its two transformer blocks, against
    examples/char_gpt.yaml on the same batches: attention, layer norms and the repeated block's
    copies on two stages, their sum of micro-batch gradients the whole batch's."""
    short = {"train_steps": 4, "disp_freq": 2, "validate": {"freq": 0, "steps": 2}}
    short |= {"test": {"freq": 0, "steps": 2}}
    pipelined = yaml.safe_load((EXAMPLES / "char_gpt_pipeline.yaml").read_text()) | short
    unpipelined = yaml.safe_load((EXAMPLES / "char_gpt.yaml").read_text()) | short
    assert {k: v for k, v in pipelined.items() if k not in ("name", "pipeline")} == {
        k: v for k, v in unpipelined.items() if k != "name"
    }
    run = _launch(pipelined, redis_url, cache_dir, tmp_path / "pipeline")
    assert set(run.workers) == {(0, 0), (0, 1)}
    local = _local(unpipelined, cache_dir, tmp_path / "local")
    _assert_same_params(tmp_path / "pipeline", local)


@pytest.mark.slow
def test_a_pipelined_plugin_layer_ends_with_the_unpipelined_parameters(
    redis_url: str, cache_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/plugins.md's rmsnorm and a plugin layer that initialises its own weights at random
    (an nn.Linear) on the second stage: every stage process loads the plugins and builds them
    with the values the local trainer has (each layer's module is built under its own seed)."""
    mixer = tmp_path / "mixer.py"
    mixer.write_text(
        "from torch import nn\nfrom trainyard.plugins import layer\n\n"
        "@layer('mixer')\nclass Mixer(nn.Module):\n"
        "    def __init__(self, in_shape, *, units: int):\n"
        "        super().__init__()\n        self.proj = nn.Linear(in_shape[-1], units)\n"
        "    def forward(self, x):\n        return self.proj(x)\n"
    )
    job = copy.deepcopy(MLP)
    layers = job["neuralnet"]["layers"]
    layers[3:3] = [
        {"name": "norm", "type": "rmsnorm", "srclayers": ["act1"], "eps": 1e-5},
        {"name": "mix", "type": "mixer", "srclayers": ["norm"], "units": 32},
    ]
    layers[5]["srclayers"] = ["mix"]
    monkeypatch.setenv("TRAINYARD_PLUGINS", f"{PLUGIN},{mixer}")
    with unloaded_after():
        load_plugins()
        stages = [["data", "fc1", "act1"], ["norm", "mix", "fc2", "act2", "fc3", "loss", "acc"]]
        pipelined = _pipelined(job, stages=stages, microbatches=4)
        _launch(pipelined, redis_url, cache_dir, tmp_path / "pipeline")
        local = _local(job, cache_dir, tmp_path / "local")
        _assert_same_params(tmp_path / "pipeline", local)
        assert "mix/proj.weight" in local.net.named_params()


@pytest.mark.slow
def test_pipeline_replicas_under_allreduce_equal_the_local_trainer(
    redis_url: str, cache_dir: Path, tmp_path: Path
) -> None:
    """2 pipelines of 2 stages: each stage all-reduces with its peer in the other pipeline."""
    job = _pipelined(MLP, stages=2, microbatches=2)
    job["cluster"] = {"framework": "allreduce", "nworker_groups": 2}
    run = _launch(job, redis_url, cache_dir, tmp_path / "pipeline")
    assert set(run.workers) == {(0, 0), (0, 1), (1, 0), (1, 1)}
    _assert_same_params(tmp_path / "pipeline", _local(MLP, cache_dir, tmp_path / "local"))


def test_checkpoints_move_between_pipelined_and_unpipelined_jobs(
    redis_url: str, cache_dir: Path, tmp_path: Path
) -> None:
    """The unpipelined job's checkpoint initialises a pipelined one and the two then train
    alike; the pipelined job's checkpoint loads into the unpipelined net with the same test
    figures it reported."""
    first = _local(MLP, cache_dir, tmp_path / "first")
    start = str(resolve_checkpoint(tmp_path / "first"))
    more = {**MLP, "checkpoint": {"init_from": start}, "seed": 9}
    run = _launch(_pipelined(more, stages=2, microbatches=4), redis_url, cache_dir, tmp_path / "pp")
    local = _local(more, cache_dir, tmp_path / "local")
    _assert_same_params(tmp_path / "pp", local)
    assert first.net.named_params().keys() == local.net.named_params().keys()

    reloaded = {**more, "checkpoint": {"init_from": str(resolve_checkpoint(tmp_path / "pp"))}}
    compiled, data = compile_with_data(reloaded, cache_dir=cache_dir)
    trainer = Trainer(compiled, data, TrainOptions(tmp_path / "reloaded"))
    trainer.restore()
    figures = trainer.evaluate()
    assert figures["test/loss"] == pytest.approx(run.summary["metrics"]["test/loss"], rel=1e-5)
    assert figures["test/accuracy"] == pytest.approx(run.summary["metrics"]["test/accuracy"])


def test_a_bf16_pipeline_trains_close_to_the_unpipelined_bf16_job(
    redis_url: str, cache_dir: Path, tmp_path: Path
) -> None:
    """Each stage's forward runs under the job's autocast; what crosses a cut is bf16."""
    base = {**MLP, "precision": "bf16"}
    _launch(_pipelined(base, stages=2, microbatches=2), redis_url, cache_dir, tmp_path / "pp")
    local = _local(base, cache_dir, tmp_path / "local")
    ckpt = load_checkpoint(resolve_checkpoint(tmp_path / "pp"))
    for name, param in local.net.named_params().items():
        assert ckpt.params[name].dtype == torch.float32
        torch.testing.assert_close(ckpt.params[name], param.detach(), atol=2e-2, rtol=0.05)
