"""What needs a GPU, run by bench/gpu_check.sh on a lent one (`-m gpu`); skipped without CUDA.

The trainer on cuda, a checkpoint carried cuda -> cpu -> cuda, bf16 and fp16, `compile: true`,
the fused updater kernels, training batches gathered on the GPU, a worker process's GPUs as its
own torch counts them once it has confined itself (workers/confine.py), and a job through a node
agent that pins it to its GPU.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from tests.conftest import RunningStack, compile_with_data
from workers.checkpoint import load_checkpoint, resolve_checkpoint
from workers.metrics import JsonlSink
from workers.trainer import Summary, Trainer, TrainOptions

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="skipped: no GPU"),
]

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "digits_mlp.yaml"
SHORT = {"train_steps": 40, "disp_freq": 10, "test.freq": 20, "checkpoint.freq": 20}


def run(
    run_dir: Path,
    cache_dir: Path,
    device: str,
    *,
    resume: bool = False,
    **overrides: Any,
) -> tuple[Summary, Trainer]:
    document = yaml.safe_load(EXAMPLE.read_text())
    job, data = compile_with_data(document, cache_dir=cache_dir, overrides={**SHORT, **overrides})
    sink = JsonlSink(run_dir)
    options = TrainOptions(run_dir=run_dir, resume=resume, base_dir=run_dir, device=device)
    trainer = Trainer(job, data, options, sinks=[sink])
    try:
        return trainer.run(), trainer
    finally:
        sink.close()


def finite_loss(summary: Summary) -> bool:
    return math.isfinite(summary.metrics["train/loss"])


def test_the_trainer_trains_on_cuda(tmp_path: Path, cache_dir: Path) -> None:
    summary, trainer = run(tmp_path, cache_dir, "cuda")
    assert summary.status == "succeeded" and summary.steps == 40 and finite_loss(summary)
    assert all(p.device.type == "cuda" for p in trainer.net.parameters())
    assert summary.metrics["test/accuracy"] > 0.5


def test_a_checkpoint_goes_cuda_to_cpu_to_cuda(tmp_path: Path, cache_dir: Path) -> None:
    first, _ = run(tmp_path, cache_dir, "cuda", train_steps=20)
    assert first.steps == 20
    saved = load_checkpoint(resolve_checkpoint(tmp_path))
    assert saved.step == 20 and all(t.device.type == "cpu" for t in saved.params.values())
    second, on_cpu = run(tmp_path, cache_dir, "cpu", resume=True)
    assert second.status == "succeeded" and second.steps == 40 and finite_loss(second)
    assert all(p.device.type == "cpu" for p in on_cpu.net.parameters())
    third, on_cuda = run(tmp_path, cache_dir, "cuda", resume=True, train_steps=60)
    assert third.status == "succeeded" and third.steps == 60 and finite_loss(third)
    assert all(p.device.type == "cuda" for p in on_cuda.net.parameters())


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_mixed_precision_on_cuda(tmp_path: Path, cache_dir: Path, precision: str) -> None:
    gpu = {"cluster.resources.gpus_per_worker": 1}  # fp16 is refused for a CPU job
    summary, trainer = run(tmp_path, cache_dir, "cuda", precision=precision, **gpu)
    assert summary.status == "succeeded" and finite_loss(summary)
    assert (trainer.updater.scaler is not None) == (precision == "fp16")  # fp16's loss scale


def test_compile_on_cuda(tmp_path: Path, cache_dir: Path) -> None:
    summary, _ = run(tmp_path, cache_dir, "cuda", compile=True)
    assert summary.status == "succeeded" and finite_loss(summary)


def test_the_fused_updater_kernels_on_cuda_match_the_loop() -> None:
    from pydantic import TypeAdapter

    from dsl.updater_config import UpdaterConfig
    from workers.updaters import ParamEntry, Updater

    config = TypeAdapter(UpdaterConfig).validate_python({"type": "adam", "lr": {"base": 0.01}})
    gen = torch.Generator().manual_seed(0)
    start = [torch.randn(64, 33, generator=gen), torch.randn(33, generator=gen)]
    fused_params = [torch.nn.Parameter(t.cuda()) for t in start]
    loop_params = [torch.nn.Parameter(t.cuda()) for t in start]
    fused = Updater([ParamEntry(f"p{i}", p) for i, p in enumerate(fused_params)], config, 20)
    loop = Updater([ParamEntry(f"p{i}", p) for i, p in enumerate(loop_params)], config, 20)
    assert fused.optimizer.defaults["fused"]
    for group in loop.optimizer.param_groups:
        group["fused"], group["foreach"] = False, False
    loop.optimizer.defaults["fused"] = False
    for step in range(10):
        grads = [torch.randn(t.shape, generator=gen).cuda() for t in start]
        for params, updater in ((fused_params, fused), (loop_params, loop)):
            for p, g in zip(params, grads, strict=True):
                p.grad = g.clone()
            updater.step(step)
    for a, b in zip(fused_params, loop_params, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("resident", [True, False])
def test_training_batches_on_cuda_are_the_cpu_batches(
    monkeypatch: pytest.MonkeyPatch, resident: bool
) -> None:
    """A small training split is gathered on the GPU, a larger one on the host and copied
    over: both hand out the CPU's batches, across the end of an epoch, for every rank."""
    from workers.data import batches

    if not resident:
        monkeypatch.setattr(batches, "RESIDENT_BYTES", 0)
    x, y = torch.randn(50, 3, 4), torch.arange(50)
    for rank in range(2):
        on_cpu = batches.TrainBatches(x, y, batch_size=8, seed=5, rank=rank, world=2)
        on_gpu = batches.TrainBatches(x, y, 8, seed=5, rank=rank, world=2, device="cuda")
        assert on_gpu.resident == resident
        for _ in range(15):  # two epochs of 6 steps, and more
            (x_cpu, y_cpu), (x_gpu, y_gpu) = next(on_cpu), next(on_gpu)
            assert x_gpu.is_cuda and torch.equal(x_gpu.cpu(), x_cpu)
            assert torch.equal(y_gpu.cpu(), y_cpu)
        on_cpu.restore({"epoch": 3, "position": 2})
        on_gpu.restore({"epoch": 3, "position": 2})
        assert torch.equal(next(on_gpu)[0].cpu(), next(on_cpu)[0])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_accuracy_on_cuda_is_the_mean_of_the_hits_to_the_bit(dtype: torch.dtype) -> None:
    """CUDA's mean multiplies by 1/N: accuracy there is still what `.to(dtype).mean()` gave."""
    from dsl.layers.loss import topk_accuracy

    gen = torch.Generator().manual_seed(0)
    for batch in (3, 7, 24, 100, 999):
        logits = torch.randn(batch, 5, generator=gen).to(dtype).cuda()
        labels = torch.randint(0, 5, (batch,), generator=gen).cuda()
        for k in (1, 2):
            if k == 1:  # argmax, which picks its own among equal scores
                hits = logits.argmax(1) == labels
            else:
                hits = (logits.topk(k, dim=1).indices == labels.unsqueeze(1)).any(1)
            expected = hits.to(dtype).mean()
            assert torch.equal(topk_accuracy(logits, labels, k), expected)


def test_a_job_through_a_node_agent_on_its_pinned_gpu(stack_factory: Any) -> None:
    from trainyard import Client

    running: RunningStack = stack_factory()
    with Client(running.url, running.token) as api:
        job = api.submit(EXAMPLE, overrides={**SHORT, "cluster.resources.gpus_per_worker": 1})
        job.wait(timeout=300, poll=0.5)
        assert job.state == "SUCCEEDED", job.error
        logs = "\n".join(job.logs())
    assert "CUDA_VISIBLE_DEVICES=" in logs  # the agent pinned the process to its GPU


PINNED = """
import json, sys
from pathlib import Path
from contract.allocation import AllocationInfo
from workers.confine import confine
base = dict(allocation_id=1, job_id=1, role="worker", group=0, rank=0, world=1, slots=1,
            gpus=0, node="n", framework="local", topology={}, spec={}, run_dir=Path("."))
devices = tuple(json.loads(sys.argv[1]))
confine(AllocationInfo(**{**base, "gpus": len(devices), "devices": devices}), "")
import torch  # CUDA starts after the process confined itself, as in a forked worker
count = torch.cuda.device_count()
print(json.dumps({"count": count, "uuids": [str(torch.cuda.get_device_properties(i).uuid)
                                            for i in range(count)]}))
"""


def seen_by_a_worker(devices: tuple[int, ...]) -> dict[str, Any]:
    """What torch in a fresh process reports after confine() gave it the node's `devices`."""
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(PINNED), json.dumps(devices)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def test_a_worker_process_sees_through_torch_only_the_gpu_it_was_given() -> None:
    """Each GPU of the machine given alone: the worker's torch counts one, and it is that one
    (its UUID); a job without GPUs counts none, whatever the machine has."""
    machine = [
        str(torch.cuda.get_device_properties(i).uuid) for i in range(torch.cuda.device_count())
    ]
    for index, uuid in enumerate(machine):
        assert seen_by_a_worker((index,)) == {"count": 1, "uuids": [uuid]}
    assert seen_by_a_worker(()) == {"count": 0, "uuids": []}
