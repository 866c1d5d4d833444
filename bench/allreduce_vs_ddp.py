"""The allreduce framework's overhead over bare torch DistributedDataParallel, two worker
processes each.

The framework is itself on DDP now (workers/distributed/allreduce.py): its trainer's forward
goes through DistributedDataParallel, whose reducer all-reduces the gradients in buckets
during the backward pass, with the communication hook `cluster.compression` names. So this
measures what the framework adds around the same DDP: batching, the compiled net's layers,
the updater with its per-parameter lr and weight-decay scales and clipping, metric reporting.

Both train the MLP of bench/overhead.py (784-1000-500-10, 1.3M parameters, SGD with momentum
0.9) on the same synthetic data with the same global batch (64: 32 rows per worker), in the
same two processes over one gloo process group. They alternate in blocks of steps inside one
run: every `--block` steps of the trainyard trainer (`group_trainer`), a callback runs the same
number of steps of a hand-written DDP loop, so noise from other work on the machine falls on
both alike. The trainyard time is everything between callbacks. Target: ratio >= 0.9.

With `--compression fp16|bf16|powersgd` both sides register the same hook, made by the same
function (`compression_hook`: DDP's fp16_compress_hook, bf16_compress_hook, or powerSGD_hook
of rank `--powersgd-rank` with a state of its own on each side, in the same buckets:
`bucket_cap_mb`), so both send the same bytes.
Both update with the same torch kernels (workers/updaters.kernel_options).

    .venv/bin/python bench/allreduce_vs_ddp.py [--steps 1000] [--block 50] [--compression none]
        [--powersgd-rank 4]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/ is not a package

import smoke
from overhead import BATCH, JOB

from dsl.compiler import compile_job
from workers.data import TrainingData
from workers.distributed.allreduce import DDPSync, bucket_cap_mb, compression_hook
from workers.distributed.rendezvous import GroupMember, file_store, join_group
from workers.parallel import group_trainer
from workers.trainer import TrainOptions
from workers.updaters import kernel_options

WORLD = 2


class DDPLoop:
    """What a person would write with DistributedDataParallel for the same model and data."""

    def __init__(
        self, x: torch.Tensor, y: torch.Tensor, rank: int, compression: str, powersgd_rank: int
    ) -> None:
        self.x, self.y, self.rank = x, y, rank
        model = nn.Sequential(
            nn.Linear(784, 1000), nn.ReLU(), nn.Linear(1000, 500), nn.ReLU(), nn.Linear(500, 10)
        )
        bucket_mb = bucket_cap_mb(compression, model.parameters())  # the framework's buckets
        self.model = DistributedDataParallel(model, bucket_cap_mb=bucket_mb)
        hook = compression_hook(compression, group=None, powersgd_rank=powersgd_rank)
        if hook is not None:
            self.model.register_comm_hook(*hook)
        params = list(self.model.parameters())
        kernel = kernel_options("sgd", params)
        self.opt = torch.optim.SGD(params, lr=0.01, momentum=0.9, **kernel)
        self.loss_fn = nn.CrossEntropyLoss()
        self.gen = torch.Generator().manual_seed(0)  # the same order on both workers
        self.perm = torch.randperm(len(x), generator=self.gen)
        self.pos = 0

    def steps(self, count: int) -> None:
        part = BATCH // WORLD
        for _ in range(count):
            if self.pos + BATCH > len(self.x):
                self.perm, self.pos = torch.randperm(len(self.x), generator=self.gen), 0
            start = self.pos + self.rank * part
            idx = self.perm[start : start + part]
            self.pos += BATCH
            self.opt.zero_grad(set_to_none=True)
            loss = self.loss_fn(self.model(self.x[idx]), self.y[idx])
            loss.backward()
            self.opt.step()


def worker(
    rank: int, steps: int, block: int, compression: str, powersgd_rank: int, tmp: Path
) -> None:
    torch.set_num_threads(1)
    member = GroupMember(rank, WORLD)
    join_group(file_store(tmp / "store", member), member)
    cluster = {"framework": "allreduce", "compression": compression}
    job = {**JOB, "train_steps": steps, "cluster": {**cluster, "powersgd_rank": powersgd_rank}}
    loaded = TrainingData(cache_dir=tmp)
    compiled = compile_job(job, loaded)
    data = loaded.dataset
    ddp = DDPLoop(data.x_train, data.y_train, rank, compression, powersgd_rank)
    ddp.steps(20)  # warm-up
    options = TrainOptions(run_dir=tmp / "run", rank=rank, world=WORLD)
    trainer, sync = group_trainer(compiled, data, options)
    assert isinstance(sync, DDPSync)
    ours: list[float] = []
    theirs: list[float] = []
    mark = time.perf_counter()

    def alternate(step: int) -> None:
        nonlocal mark
        if step % block:
            return
        now = time.perf_counter()
        ours.append(now - mark)
        ddp.steps(block)
        theirs.append(time.perf_counter() - now)
        mark = time.perf_counter()

    trainer.run(on_step=alternate)
    if rank == 0:
        result = {
            "ours": ours[1:],  # the first block warms up
            "theirs": theirs[1:],
            "hooks": [
                ddp.model._get_ddp_logging_data().get("comm_hook", "") or "DDP's all-reduce",
                sync.ddp._get_ddp_logging_data().get("comm_hook", "") or "DDP's all-reduce",
            ],
        }
        (tmp / "result.json").write_text(json.dumps(result))
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--block", type=int, default=50)
    parser.add_argument(
        "--compression", choices=["none", "fp16", "bf16", "powersgd"], default="none"
    )
    parser.add_argument("--powersgd-rank", type=int, default=4)
    args = smoke.parse(parser, steps=20, block=10)
    with tempfile.TemporaryDirectory() as tmp:
        mp.start_processes(
            worker,
            args=(args.steps, args.block, args.compression, args.powersgd_rank, Path(tmp)),
            nprocs=WORLD,
            start_method="spawn",
        )
        result = json.loads((Path(tmp) / "result.json").read_text())
    ours, theirs = result["ours"], result["theirs"]
    samples = args.block * BATCH
    ratios = [t / o for o, t in zip(ours, theirs, strict=True)]
    print(f"blocks: {len(ratios)} of {args.block} steps, global batch {BATCH} over {WORLD} workers")
    bare, framework = result["hooks"]
    print(
        f"gradient compression: {args.compression}; hooks: bare DDP {bare}, framework {framework}"
    )
    print(f"trainyard allreduce {samples * len(ours) / sum(ours):8.0f} samples/s")
    print(
        f"torch DDP ({args.compression:>4})    {samples * len(theirs) / sum(theirs):8.0f} samples/s"
    )
    print(f"ratio of totals trainyard/DDP: {sum(theirs) / sum(ours):.3f} (target >= 0.9)")
    print(f"median block ratio: {statistics.median(ratios):.3f}")


if __name__ == "__main__":
    main()
