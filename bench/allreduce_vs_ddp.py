"""The allreduce framework against torch DistributedDataParallel, two worker processes each.

Both train the MLP of bench/overhead.py (784-1000-500-10, 1.3M parameters, SGD with momentum
0.9) on the same synthetic data with the same global batch (64: 32 rows per worker), in the
same two processes over one gloo process group. They alternate in blocks of steps inside one
run: every `--block` steps of the trainyard trainer (`group_trainer`: all-reduce in buckets
overlapping backward, then the local updater), a callback runs the same number of steps of a
hand-written DDP loop, so noise from other work on the machine falls on both alike. The
trainyard time is everything between callbacks: batching, the net, the all-reduce, the updater
and metric reporting. Target: ratio >= 0.9.

With `--compression fp16|bf16` the DDP side compresses too, through DDP's own communication
hook (`fp16_compress_hook`; `bf16_compress_hook`'s steps on CPU): both sides send the same
bytes. (Before 2026-11-26 DDP sent float32 while ours sent bf16, and the bf16 ratio flattered
ours.) Both update with the same torch kernels (workers/updaters.kernel_options).

    .venv/bin/python bench/allreduce_vs_ddp.py [--steps 1000] [--block 50] [--compression none]
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
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/ is not a package

import smoke
from overhead import BATCH, JOB

from dsl.compiler import compile_job
from workers.data import TrainingData
from workers.distributed.rendezvous import GroupMember, file_store, join_group
from workers.parallel import group_trainer
from workers.trainer import TrainOptions
from workers.updaters import kernel_options

WORLD = 2


def bf16_compress_hook_on_gloo(process_group, bucket):  # type: ignore[no-untyped-def]
    """DDP's `bf16_compress_hook`, which DDP refuses by its name off NCCL (CPU, gloo): the same
    steps, through the same torch function (cast the bucket to bf16 divided by the world size,
    all-reduce, cast back). On CUDA DDP's own hook is used. (No annotations: DDP checks them,
    and this module's are strings.)"""
    return default_hooks._compress_hook(torch.bfloat16, process_group, bucket)


# DDP's own gradient compression, the same as `cluster.compression` of ours.
HOOKS = {
    "fp16": default_hooks.fp16_compress_hook,
    "bf16": default_hooks.bf16_compress_hook
    if torch.cuda.is_available()
    else bf16_compress_hook_on_gloo,
}


class DDPLoop:
    """What a person would write with DistributedDataParallel for the same model and data."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor, rank: int, compression: str) -> None:
        self.x, self.y, self.rank = x, y, rank
        model = nn.Sequential(
            nn.Linear(784, 1000), nn.ReLU(), nn.Linear(1000, 500), nn.ReLU(), nn.Linear(500, 10)
        )
        self.model = DistributedDataParallel(model)
        if compression in HOOKS:
            self.model.register_comm_hook(None, HOOKS[compression])
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


def worker(rank: int, steps: int, block: int, compression: str, tmp: Path) -> None:
    torch.set_num_threads(1)
    member = GroupMember(rank, WORLD)
    join_group(file_store(tmp / "store", member), member)
    job = {**JOB, "train_steps": steps, "cluster": {"compression": compression}}
    loaded = TrainingData(cache_dir=tmp)
    compiled = compile_job(job, loaded)
    data = loaded.dataset
    ddp = DDPLoop(data.x_train, data.y_train, rank, compression)
    ddp.steps(20)  # warm-up
    options = TrainOptions(run_dir=tmp / "run", rank=rank, world=WORLD)
    trainer, sync = group_trainer(compiled, data, options)
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
            "buckets": len(sync.buckets),
            "wire_bytes_per_step": sync.wire_bytes / steps,
        }
        (tmp / "result.json").write_text(json.dumps(result))
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--block", type=int, default=50)
    parser.add_argument("--compression", choices=["none", "fp16", "bf16"], default="none")
    args = smoke.parse(parser, steps=20, block=10)
    with tempfile.TemporaryDirectory() as tmp:
        mp.start_processes(
            worker,
            args=(args.steps, args.block, args.compression, Path(tmp)),
            nprocs=WORLD,
            start_method="spawn",
        )
        result = json.loads((Path(tmp) / "result.json").read_text())
    ours, theirs = result["ours"], result["theirs"]
    samples = args.block * BATCH
    ratios = [t / o for o, t in zip(ours, theirs, strict=True)]
    print(f"blocks: {len(ratios)} of {args.block} steps, global batch {BATCH} over {WORLD} workers")
    print(f"gradient compression: {args.compression}, buckets: {result['buckets']}, ", end="")
    print(f"all-reduce bytes per worker and step: {result['wire_bytes_per_step']:.0f}")
    print(f"trainyard allreduce {samples * len(ours) / sum(ours):8.0f} samples/s")
    print(
        f"torch DDP ({args.compression:>4})    {samples * len(theirs) / sum(theirs):8.0f} samples/s"
    )
    print(f"ratio of totals trainyard/DDP: {sum(theirs) / sum(ours):.3f} (target >= 0.9)")
    print(f"median block ratio: {statistics.median(ratios):.3f}")


if __name__ == "__main__":
    main()
