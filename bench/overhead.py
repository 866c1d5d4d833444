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

`--widths` and `--batch` change the MLP (input, hidden layers, classes) and the batch. A tiny
model (`--widths 16,16,16,10 --batch 8`) makes the compute nearly nothing, so the difference of
the two sides' step times is the trainer's host cost per step, which the default model hides on
a CPU behind its 10 times longer steps and which a GPU shows (its kernels run beside the host).
The script prints that difference as microseconds per step. `--clock cpu` (CPU only) times both
sides by the process's CPU time instead of the wall clock: on a machine shared with other work
it moves less from run to run.

    .venv/bin/python bench/overhead.py [--steps 3000] [--block 50] [--device cuda]
        [--precision fp32|bf16] [--compile] [--widths 784,1000,500,10] [--batch 64]
        [--clock wall|cpu]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Sequence
from itertools import pairwise
from pathlib import Path
from typing import Any

import smoke  # bench/smoke.py: run as a script, bench/ is on sys.path
import torch
from torch import nn

from dsl.compiler import compile_job
from workers.data import Dataset, TrainingData
from workers.trainer import Trainer, TrainOptions
from workers.updaters import kernel_options

WIDTHS = (784, 1000, 500, 10)  # input features, the hidden layers' units, classes
BATCH = 64


BASE: dict[str, Any] = {  # the job without its net (job_document adds one)
    "name": "overhead-mlp",
    "seed": 0,
    "data": {
        "source": "synthetic",
        "task": "classification",
        "num_samples": 4096,
        "test_fraction": 0.0625,
    },
    "updater": {"type": "sgd", "momentum": 0.9, "lr": {"base": 0.01}},
    "disp_freq": 100,
    "checkpoint": {"freq": 0, "keep": 1},
}


def job_document(widths: Sequence[int], batch: int) -> dict[str, Any]:
    """The job of an MLP of `widths` (a dense layer and a relu between each two, the last
    without relu) trained on synthetic data in batches of `batch`."""
    layers: list[dict[str, Any]] = [{"name": "data", "type": "input"}]
    source = "data"
    for i, units in enumerate(widths[1:], start=1):
        layers.append({"name": f"fc{i}", "type": "dense", "srclayers": [source], "units": units})
        source = f"fc{i}"
        if i < len(widths) - 1:
            layers.append({"name": f"relu{i}", "type": "relu", "srclayers": [source]})
            source = f"relu{i}"
    layers.append({"name": "loss", "type": "softmax_loss", "srclayers": [source]})
    data = {**BASE["data"], "batch_size": batch, "num_features": widths[0]}
    return {**BASE, "data": {**data, "num_classes": widths[-1]}, "neuralnet": {"layers": layers}}


# The default MLP's job, which bench/allreduce_vs_ddp.py and bench/ps_throughput.py train too.
JOB = job_document(WIDTHS, BATCH)


class PlainLoop:
    """The loop a person would write by hand for the same model and data."""

    def __init__(
        self,
        data: Dataset,
        device: str,
        precision: str,
        compiled: bool,
        *,
        widths: Sequence[int],
        batch: int,
    ) -> None:
        self.x, self.y = data.x_train.to(device), data.y_train.to(device)
        self.batch = batch
        layers: list[nn.Module] = []
        for fan_in, fan_out in pairwise(widths):
            layers += [nn.Linear(fan_in, fan_out), nn.ReLU()]
        self.model = nn.Sequential(*layers[:-1]).to(device)
        params = list(self.model.parameters())
        kernel = kernel_options("sgd", params)
        self.opt = torch.optim.SGD(params, lr=0.01, momentum=0.9, **kernel)
        self.forward = torch.compile(self.model) if compiled else self.model
        self.device_type = torch.device(device).type
        self.autocast = precision == "bf16"
        self.loss_fn = nn.CrossEntropyLoss()
        self.gen = torch.Generator().manual_seed(0)
        self.device = device
        self.perm = self.permutation()
        self.pos = 0

    def permutation(self) -> torch.Tensor:
        """An epoch's order, drawn on the CPU and kept beside the samples: a CPU index into CUDA
        samples is copied over with a wait every step (the first GPU run's plain loop did)."""
        return torch.randperm(len(self.x), generator=self.gen).to(self.device)

    def steps(self, count: int) -> None:
        for _ in range(count):
            if self.pos + self.batch > len(self.x):
                self.perm, self.pos = self.permutation(), 0
            idx = self.perm[self.pos : self.pos + self.batch]
            self.pos += self.batch
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
    parser.add_argument(
        "--widths",
        type=widths_arg,
        default=WIDTHS,
        help="the MLP's input features, hidden units and classes, comma-separated "
        "(default 784,1000,500,10)",
    )
    parser.add_argument("--batch", type=int, default=BATCH, help="samples a step (default 64)")
    parser.add_argument(
        "--clock",
        default="wall",
        choices=["wall", "cpu"],
        help="wall: elapsed time (default); cpu: this process's CPU time, which other work "
        "on a shared machine disturbs less (CPU only: a GPU's work is not the process's)",
    )
    args = smoke.parse(parser, steps=60, block=20)
    if args.clock == "cpu" and args.device != "cpu":
        parser.error("--clock cpu measures CPU work; use it with --device cpu")
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        loaded = TrainingData(cache_dir=Path(tmp))
        document = {
            **job_document(args.widths, args.batch),
            "train_steps": args.steps,
            "precision": args.precision,
        }
        job = compile_job({**document, "compile": args.compile}, loaded)
        data = loaded.dataset
        plain = PlainLoop(
            data, args.device, args.precision, args.compile, widths=args.widths, batch=args.batch
        )
        plain.steps(20)  # warm-up (and compilation)
        options = TrainOptions(run_dir=Path(tmp) / "run", device=args.device)
        trainer = Trainer(job, data, options)
        sync = torch.cuda.synchronize if args.device.startswith("cuda") else (lambda: None)
        ours: list[float] = []
        theirs: list[float] = []
        mark = clock()

        def alternate(step: int) -> None:
            nonlocal mark
            if step % args.block:
                return
            sync()
            now = clock()
            ours.append(now - mark)
            plain.steps(args.block)
            sync()
            theirs.append(clock() - now)
            mark = clock()

        trainer.run(on_step=alternate)
    samples = args.block * args.batch
    ratios = [t / o for o, t in zip(ours[1:], theirs[1:], strict=True)]  # first block warms up
    total_ours, total_theirs = sum(ours[1:]), sum(theirs[1:])
    steps = args.block * len(ratios)
    widths = "-".join(map(str, args.widths))
    print(
        f"blocks: {len(ratios)} of {args.block} steps, MLP {widths}, batch {args.batch}, ", end=""
    )
    print(f"on {args.device}, {args.precision}{', compiled' if args.compile else ''}, ", end="")
    print(f"{args.clock} clock")
    print(f"trainyard {samples * len(ratios) / total_ours:8.0f} samples/s")
    print(f"plain     {samples * len(ratios) / total_theirs:8.0f} samples/s")
    print(f"ratio of totals trainyard/plain: {total_theirs / total_ours:.3f} (target >= 0.95)")
    print(f"median block ratio: {statistics.median(ratios):.3f}")
    per_step = (total_ours - total_theirs) / steps * 1e6
    print(f"step time: trainyard {total_ours / steps * 1e6:.1f} us, ", end="")
    print(f"plain {total_theirs / steps * 1e6:.1f} us, difference {per_step:.1f} us")


def widths_arg(text: str) -> tuple[int, ...]:
    """`--widths`: at least an input and a number of classes, all positive."""
    try:
        widths = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not comma-separated integers: {text!r}") from None
    if len(widths) < 2 or min(widths) < 1:
        raise argparse.ArgumentTypeError(
            f"{text!r}: give the input features, any hidden units and the classes, all positive"
        )
    return widths


if __name__ == "__main__":
    main()
