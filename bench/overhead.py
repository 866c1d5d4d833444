"""Trainer overhead: the trainyard trainer against a plain hand-written torch loop.

Both train the same MLP (784-1000-500-10, batch 64, SGD with momentum 0.9) on the same
synthetic data. They alternate in blocks of steps inside one run: every `--block` steps of
`Trainer.run()` a callback runs the same number of steps of the plain loop, so noise from other
work on the machine falls on both alike. The trainyard time is everything between callbacks:
batching, the net, the algorithm, the updater, metric windows and reporting (the final test
pass and checkpoint, after the last step, are not counted). Target: ratio >= 0.95.

    .venv/bin/python bench/overhead.py [--steps 3000] [--block 50]
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

    def __init__(self, data: Dataset) -> None:
        self.x, self.y = data.x_train, data.y_train
        self.model = nn.Sequential(
            nn.Linear(784, 1000), nn.ReLU(), nn.Linear(1000, 500), nn.ReLU(), nn.Linear(500, 10)
        )
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.01, momentum=0.9)
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
            loss = self.loss_fn(self.model(self.x[idx]), self.y[idx])
            loss.backward()
            self.opt.step()


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--block", type=int, default=50)
    args = smoke.parse(parser, steps=60, block=20)
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        loaded = TrainingData(cache_dir=Path(tmp))
        job = compile_job({**JOB, "train_steps": args.steps}, loaded)
        data = loaded.dataset
        plain = PlainLoop(data)
        plain.steps(20)  # warm-up
        trainer = Trainer(job, data, TrainOptions(run_dir=Path(tmp) / "run"))
        ours: list[float] = []
        theirs: list[float] = []
        mark = time.perf_counter()

        def alternate(step: int) -> None:
            nonlocal mark
            if step % args.block:
                return
            now = time.perf_counter()
            ours.append(now - mark)
            plain.steps(args.block)
            theirs.append(time.perf_counter() - now)
            mark = time.perf_counter()

        trainer.run(on_step=alternate)
    samples = args.block * BATCH
    ratios = [t / o for o, t in zip(ours[1:], theirs[1:], strict=True)]  # first block warms up
    total_ours, total_theirs = sum(ours[1:]), sum(theirs[1:])
    print(f"blocks: {len(ratios)} of {args.block} steps, batch {BATCH}")
    print(f"trainyard {samples * len(ratios) / total_ours:8.0f} samples/s")
    print(f"plain     {samples * len(ratios) / total_theirs:8.0f} samples/s")
    print(f"ratio of totals trainyard/plain: {total_theirs / total_ours:.3f} (target >= 0.95)")
    print(f"median block ratio: {statistics.median(ratios):.3f}")


if __name__ == "__main__":
    main()
