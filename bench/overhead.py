"""Trainer overhead: the trainyard trainer against a plain hand-written torch loop.

Both train the same MLP (784-1000-500-10, batch 64, SGD with momentum 0.9) on the same
synthetic data for the same number of steps, alternating in one process so machine noise hits
both alike. Prints the throughput of each round and the median ratio trainyard / plain
(target >= 0.95).

    .venv/bin/python bench/overhead.py [--steps 300] [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch
from torch import nn

from workers.jobs import prepare_job
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


def trainyard_round(steps: int, cache: Path) -> float:
    """Samples per second of a full `Trainer.run()` (final evaluation and checkpoint included)."""
    job, data = prepare_job({**JOB, "train_steps": steps}, cache_dir=cache)
    with tempfile.TemporaryDirectory() as run_dir:
        trainer = Trainer(job, data, TrainOptions(run_dir=Path(run_dir)))
        started = time.perf_counter()
        trainer.run()
        return steps * BATCH / (time.perf_counter() - started)


def plain_round(steps: int, cache: Path) -> float:
    """The loop a person would write by hand for the same model and data."""
    _, data = prepare_job({**JOB, "train_steps": steps}, cache_dir=cache)
    x, y = data.x_train, data.y_train
    model = nn.Sequential(
        nn.Linear(784, 1000), nn.ReLU(), nn.Linear(1000, 500), nn.ReLU(), nn.Linear(500, 10)
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    gen = torch.Generator().manual_seed(0)
    started = time.perf_counter()
    perm = torch.randperm(len(x), generator=gen)
    pos = 0
    for _ in range(steps):
        if pos + BATCH > len(x):
            perm, pos = torch.randperm(len(x), generator=gen), 0
        idx = perm[pos : pos + BATCH]
        pos += BATCH
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x[idx]), y[idx])
        loss.backward()
        opt.step()
    return steps * BATCH / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as cache_dir:
        cache = Path(cache_dir)
        plain_round(20, cache)  # warm-up: allocator, kernels, data generation
        trainyard_round(20, cache)
        ratios = []
        for i in range(args.rounds):
            ours = trainyard_round(args.steps, cache)
            plain = plain_round(args.steps, cache)
            ratios.append(ours / plain)
            print(
                f"round {i + 1}: trainyard {ours:8.0f} samples/s   plain {plain:8.0f} samples/s"
                f"   ratio {ours / plain:.3f}"
            )
    print(f"median ratio trainyard/plain: {statistics.median(ratios):.3f} (target >= 0.95)")


if __name__ == "__main__":
    main()
