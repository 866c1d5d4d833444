"""Trainer overhead: the trainyard trainer against a plain hand-written torch loop.

Both train the same MLP (784-1000-500-10, batch 64, SGD with momentum 0.9) on the same
synthetic data. They alternate in blocks of steps inside one run: every `--block` steps of
`Trainer.run()` a callback runs the same number of steps of the plain loop, so noise from other
work on the machine falls on both alike. The trainyard time is everything between callbacks:
batching, the net, the algorithm, the updater, metric windows and reporting (the final test
pass and checkpoint, after the last step, are not counted). Target: ratio >= 0.95.

Both update with the same torch kernels (the trainer's updater picks foreach, or fused on CUDA:
workers/updaters.kernel_options), so the ratio is the trainer's overhead, not a kernel choice.
`--device cuda`, `--precision bf16` (autocast on both sides) and `--compile` (torch.compile of
the plain model and `compile: true` of the job) are bench/gpu_check.sh's figures; on CUDA the
clock waits for the device at each block's edges.

    .venv/bin/python bench/overhead.py [--steps 3000] [--block 50] [--device cuda]
        [--precision fp32|bf16] [--compile]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import smoke  # bench/smoke.py: run as a script, bench/ is on sys.path
import torch
from torch import nn

from dsl.compiler import compile_job
from workers.data import Dataset, TrainingData
from workers.trainer import Trainer, TrainOptions
from workers.updaters import kernel_options

BATCH = 64

JOB = {
    "name": "overhead-mlp",
    "seed": 0,
    "data": {
        "source": "synthetic",
        "task": "classification",
        "num_samples": 4096,
        "num_features": 784,
        "num_classes": 10,
        "batch_size": BATCH,
        "test_fraction": 0.0625,
    },
    "neuralnet": {
        "layers": [
            {"name": "data", "type": "input"},
            {"name": "fc1", "type": "dense", "srclayers": ["data"], "units": 1000},
            {"name": "relu1", "type": "relu", "srclayers": ["fc1"]},
            {"name": "fc2", "type": "dense", "srclayers": ["relu1"], "units": 500},
            {"name": "relu2", "type": "relu", "srclayers": ["fc2"]},
            {"name": "fc3", "type": "dense", "srclayers": ["relu2"], "units": 10},
            {"name": "loss", "type": "softmax_loss", "srclayers": ["fc3"]},
        ]
    },
    "updater": {"type": "sgd", "momentum": 0.9, "lr": {"base": 0.01}},
    "disp_freq": 100,
    "checkpoint": {"freq": 0, "keep": 1},
}


class PlainLoop:
    """The loop a person would write by hand for the same model and data."""

    def __init__(self, data: Dataset, device: str, precision: str, compiled: bool) -> None:
        self.x, self.y = data.x_train.to(device), data.y_train.to(device)
        self.model = nn.Sequential(
            nn.Linear(784, 1000), nn.ReLU(), nn.Linear(1000, 500), nn.ReLU(), nn.Linear(500, 10)
        ).to(device)
        params = list(self.model.parameters())
        kernel = kernel_options("sgd", params)
        self.opt = torch.optim.SGD(params, lr=0.01, momentum=0.9, **kernel)
        self.forward = torch.compile(self.model) if compiled else self.model
        self.device_type = torch.device(device).type
        self.autocast = precision == "bf16"
        self.loss_fn = nn.CrossEntropyLoss()
        self.gen = torch.Generator().manual_seed(0)
        self.perm = torch.randperm(len(self.x), generator=self.gen)
        self.pos = 0

    def steps(self, count: int) -> None:
        for _ in range(count):
            if self.pos + BATCH > len(self.x):
                self.perm, self.pos = torch.randperm(len(self.x), generator=self.gen), 0
            idx = self.perm[self.pos : self.pos + BATCH]
            self.pos += BATCH
            self.opt.zero_grad(set_to_none=True)
            with torch.autocast(self.device_type, torch.bfloat16, enabled=self.autocast):
                loss = self.loss_fn(self.forward(self.x[idx]), self.y[idx])
            loss.backward()
            self.opt.step()


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--block", type=int, default=50)
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    parser.add_argument("--compile", action="store_true", help="torch.compile on both sides")
    args = smoke.parse(parser, steps=60, block=20)
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        loaded = TrainingData(cache_dir=Path(tmp))
        document = {**JOB, "train_steps": args.steps, "precision": args.precision}
        job = compile_job({**document, "compile": args.compile}, loaded)
        data = loaded.dataset
        plain = PlainLoop(data, args.device, args.precision, args.compile)
        plain.steps(20)  # warm-up (and compilation)
        options = TrainOptions(run_dir=Path(tmp) / "run", device=args.device)
        trainer = Trainer(job, data, options)
        sync = torch.cuda.synchronize if args.device.startswith("cuda") else (lambda: None)
        ours: list[float] = []
        theirs: list[float] = []
        mark = time.perf_counter()

        def alternate(step: int) -> None:
            nonlocal mark
            if step % args.block:
                return
            sync()
            now = time.perf_counter()
            ours.append(now - mark)
            plain.steps(args.block)
            sync()
            theirs.append(time.perf_counter() - now)
            mark = time.perf_counter()

        trainer.run(on_step=alternate)
    samples = args.block * BATCH
    ratios = [t / o for o, t in zip(ours[1:], theirs[1:], strict=True)]  # first block warms up
    total_ours, total_theirs = sum(ours[1:]), sum(theirs[1:])
    print(f"blocks: {len(ratios)} of {args.block} steps, batch {BATCH}, on {args.device}, ", end="")
    print(f"{args.precision}{', compiled' if args.compile else ''}")
    print(f"trainyard {samples * len(ratios) / total_ours:8.0f} samples/s")
    print(f"plain     {samples * len(ratios) / total_theirs:8.0f} samples/s")
    print(f"ratio of totals trainyard/plain: {total_theirs / total_ours:.3f} (target >= 0.95)")
    print(f"median block ratio: {statistics.median(ratios):.3f}")


if __name__ == "__main__":
    main()
