"""Parameter-server step time with the gradients sent during the backward pass ("overlap")
against sending them after it ("apart"), on the same job in one run.

The job is a synchronous (sandblaster) worker training a deep MLP, 784-1024-1024-1024-1024-10
(3.96M parameters, 15.8 MB of fp32 pushed and pulled each step, so that the traffic weighs as
much as the arithmetic), SGD with momentum 0.9, batch 128, against one shard in a separate
process (harness/local_cluster.py) and a private Redis. Two trainers of the same job take the
steps in alternating blocks as one worker of the job (one step counter, so the shard applies
every step once): one whose client sends each part of the gradient the moment the backward
pass completes it (what the parameter-server frameworks do; the shard then updates each slice as
it comes, as the job does not clip), one whose client sends the whole gradient after the
backward pass (what they did before). A step is what Trainer.loop does
for it: the next batch, `train_one_batch` (forward and backward), `apply_update` (push, wait
for the shard's update, pull). Both sides run the same code but for `overlap`, warm, through
the same Redis and shard.

    .venv/bin/python bench/ps_overlap.py [--steps 120] [--block 10] [--batch 128]
        [--width 1024] [--depth 4]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import smoke

from dsl.compiler import compile_job
from dsl.topology import Topology
from harness.local_cluster import LocalCluster, prepare_launch
from scheduler.cli.redis_server import RedisServer
from workers.data import TrainingData
from workers.distributed.ps.client import PSClient
from workers.distributed.ps.plan import Connections, PSKeys, PSPlan, clear_ps_keys
from workers.parallel import sync_through_servers
from workers.trainer import StepHooks, Trainer, TrainOptions


def job_doc(args: argparse.Namespace, steps: int) -> dict[str, Any]:
    layers: list[dict[str, Any]] = [{"name": "data", "type": "input"}]
    source = "data"
    for i in range(1, args.depth + 1):
        layers.append(
            {"name": f"fc{i}", "type": "dense", "srclayers": [source], "units": args.width}
        )
        layers.append({"name": f"relu{i}", "type": "relu", "srclayers": [f"fc{i}"]})
        source = f"relu{i}"
    layers.append({"name": "out", "type": "dense", "srclayers": [source], "units": 10})
    layers.append({"name": "loss", "type": "softmax_loss", "srclayers": ["out"]})
    return {
        "name": "ps-overlap",
        "seed": 0,
        "data": {
            "source": "synthetic",
            "task": "classification",
            "num_samples": 4096,
            "num_features": 784,
            "num_classes": 10,
            "batch_size": args.batch,
            "test_fraction": 0.0625,
        },
        "neuralnet": {"layers": layers},
        "updater": {"type": "sgd", "momentum": 0.9, "lr": {"base": 0.01}},
        "train_steps": steps,
        "disp_freq": 10**6,
        "checkpoint": {"freq": 0, "keep": 1},
        "cluster": {"framework": "sandblaster"},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--steps", type=int, default=120, help="steps of each kind")
    parser.add_argument("--block", type=int, default=10)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--depth", type=int, default=4, help="hidden layers")
    args = smoke.parse(parser, steps=4, block=2, width=64, depth=2)
    torch.set_num_threads(1)
    load_before = os.getloadavg()
    steps = args.steps - args.steps % args.block
    doc = job_doc(args, 2 * (steps + args.block))  # a warm-up block of each kind
    topology = Topology("sandblaster", 1, 1, 1, 1, True, 1, 0)
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        server = RedisServer(tmp / "redis", persist=False)
        url = server.start()
        try:
            times, nparams = run(args, steps, doc, topology, url, tmp)
        finally:
            server.stop()
    report(args, steps, times, nparams, load_before)


def run(
    args: argparse.Namespace,
    steps: int,
    doc: dict[str, Any],
    topology: Topology,
    url: str,
    tmp: Path,
) -> tuple[dict[str, list[float]], int]:
    """Each kind's block times, and the net's parameter count."""
    config = prepare_launch(
        json.dumps(doc), topology, url, tmp / "run", cache_dir=tmp / "cache", scope="bench:ovl"
    )
    cluster = LocalCluster(config)
    cluster.start([("server", 0, 0)])
    keys = PSKeys(config.scope)
    plan = PSPlan.from_topology(topology)
    connections: list[Connections] = []
    clients: list[PSClient] = []
    trainers: dict[str, Trainer] = {}
    for kind, overlap in (("overlap", True), ("apart", False)):
        data = TrainingData(cache_dir=tmp / "cache")
        job = compile_job(doc, data)
        connection = Connections(url)
        client = PSClient(
            job.net, plan=plan, connections=connection, keys=keys, group=0, rank=0, overlap=overlap
        )
        hooks = sync_through_servers(StepHooks(), client=client, job=job, device="cpu")
        trainers[kind] = Trainer(job, data.dataset, TrainOptions(run_dir=tmp / kind), hooks=hooks)
        client.connect()
        connections.append(connection)
        clients.append(client)
    step = 0

    def block(trainer: Trainer) -> Callable[[], float]:
        def steps_of_block() -> float:
            nonlocal step
            trainer.step = step  # one worker of the job: the shard applies each step once
            started = time.perf_counter()
            for _ in range(args.block):
                x, y = next(trainer.batches)
                trainer.train_one_batch(x, y)
                trainer.apply_update()
                trainer.step += 1
            elapsed = time.perf_counter() - started
            step = trainer.step
            return elapsed

        return steps_of_block

    times: dict[str, list[float]] = {kind: [] for kind in trainers}
    try:
        for trainer in trainers.values():  # warm: allocations, the shard's first updates
            block(trainer)()
        for _ in range(steps // args.block):
            for kind, trainer in trainers.items():
                times[kind].append(block(trainer)())
        for client in clients:
            client.finish()
        cluster.join_servers()
    finally:
        cluster.stop()
        clear_ps_keys(connections[0], keys)
        for client in clients:
            client.close()
        for connection in connections:
            connection.close()
        for trainer in trainers.values():
            trainer.batches.close()
    nparams = sum(p.numel() for p in clients[0].params.values())
    return times, nparams


def report(
    args: argparse.Namespace,
    steps: int,
    times: dict[str, list[float]],
    nparams: int,
    load_before: tuple[float, float, float],
) -> None:
    print(
        f"model: 784-{'-'.join([str(args.width)] * args.depth)}-10 MLP, {nparams:,} parameters "
        f"({4 * nparams / 1e6:.1f} MB of fp32 each way), batch {args.batch}; sandblaster, 1 "
        f"worker, 1 shard; {steps} steps of each kind in blocks of {args.block}"
    )
    before, after = (" ".join(f"{v:.2f}" for v in load) for load in (load_before, os.getloadavg()))
    print(f"load average before: {before}, after: {after}")
    for kind, blocks in times.items():
        print(f"{kind:>8}: {sum(blocks) / steps * 1e3:7.2f} ms per step")
    ratios = [a / o for o, a in zip(times["overlap"], times["apart"], strict=True)]
    print(
        f"speed-up with overlap: {sum(times['apart']) / sum(times['overlap']):.3f} "
        f"(median block {statistics.median(ratios):.3f}); target >= 1.3"
    )


if __name__ == "__main__":
    main()
