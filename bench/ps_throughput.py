"""Parameter-server throughput: push gradients + pull parameters through the shards, against
raw redis-py SET + GET of the same bytes.

The model is the 1.3M-parameter MLP of bench/overhead.py (784-1000-500-10, 5.2 MB of fp32); the
shards are separate processes started here (harness/local_cluster.py)
applying the job's updater (SGD, momentum 0.9). Three kinds of step alternate in blocks inside
one run against the same Redis, so machine noise falls on all alike:

- raw: one pipelined SET of the gradient bytes and GET of as many bytes, prepared in advance;
- wire: `PSClient.push` + `PSClient.pull`: encode the gradients into frames and XADD them to
  the shard streams, GET the shards' parameter blobs and copy them into the net. The shards
  apply the updates meanwhile; after each block the run waits, untimed, until they caught up.
  Target: >= 0.7 of raw.
- round trip: `PSClient.step`, the synchronous (sandblaster) step: push, wait until the shards
  applied and committed the update (parameters, version and updater state in one MULTI), pull.

    .venv/bin/python bench/ps_throughput.py [--steps 200] [--block 10] [--shards 1]
        [--redis-servers 1] [--compression none|fp16|bf16] [--cpu]

`--cpu` also reports where the CPU goes: per kind of step, the CPU time of this process (the
worker), each shard and each Redis server, and the first Redis server's time per command.
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
from dataclasses import replace
from pathlib import Path

import psutil
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import smoke
from overhead import JOB

from dsl.compiler import compile_job
from dsl.topology import Topology
from harness.local_cluster import LocalCluster, prepare_launch
from scheduler.cli.redis_server import RedisServer
from workers.data import TrainingData
from workers.distributed.ps.client import PSClient
from workers.distributed.ps.plan import Connections, PSKeys, PSPlan, clear_ps_keys


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--steps", type=int, default=200, help="steps of each kind")
    parser.add_argument("--block", type=int, default=10)
    parser.add_argument("--shards", type=int, default=1)
    parser.add_argument("--redis-servers", type=int, default=1, help="REDIS_PS_URLS count")
    parser.add_argument("--compression", default="none", choices=["none", "fp16", "bf16"])
    parser.add_argument("--cpu", action="store_true", help="report CPU per process and step")
    parser.add_argument(
        "--pin",
        action="store_true",
        help="this process, each Redis server and each shard on a core of its own",
    )
    args = smoke.parse(parser, steps=10, block=5)
    torch.set_num_threads(1)
    steps = args.steps - args.steps % args.block
    job_doc = {
        **JOB,
        "train_steps": 10 * steps,
        "cluster": {"framework": "sandblaster", "compression": args.compression},
    }
    topology = Topology("sandblaster", 1, 1, 1, args.shards, True, 1, 0)
    with tempfile.TemporaryDirectory() as tmp:
        servers = [
            RedisServer(Path(tmp) / f"redis{i}", persist=False) for i in range(args.redis_servers)
        ]
        urls = [server.start() for server in servers]
        if args.pin:
            cores = sorted(os.sched_getaffinity(0))
            if len(cores) < 1 + args.redis_servers + args.shards:
                raise SystemExit("--pin needs a core for this process, each Redis and each shard")
            for n, server in enumerate(servers, start=1):
                if server.process is not None:
                    os.sched_setaffinity(server.process.pid, {cores[n]})
        try:
            pids = {
                f"redis {i}": server.process.pid
                for i, server in enumerate(servers)
                if server.process is not None
            }
            run(args, steps, job_doc, topology, urls, Path(tmp), pids)
        finally:
            for server in servers:
                server.stop()


def run(
    args: argparse.Namespace,
    steps: int,
    job_doc: dict[str, object],
    topology: Topology,
    urls: list[str],
    tmp: Path,
    redis_pids: dict[str, int],
) -> None:
    job = compile_job(job_doc, TrainingData(cache_dir=tmp / "cache"))
    net = job.net
    gen = torch.Generator().manual_seed(0)
    for p in net.named_params().values():
        p.grad = torch.randn(p.shape, generator=gen) * 1e-3
    grads = [p.grad for p in net.named_params().values() if p.grad is not None]
    grad_bytes = b"".join(g.numpy().tobytes() for g in grads)
    raw_bytes = grad_bytes if args.compression == "none" else grad_bytes[: len(grad_bytes) // 2]

    config = prepare_launch(
        json.dumps(job_doc),
        topology,
        urls[0],
        tmp / "run",
        cache_dir=tmp / "cache",
        ps_urls=urls,
        scope="bench:ps",
    )
    if args.pin:
        config = replace(config, pin_from=1 + args.redis_servers)
    cluster = LocalCluster(config)
    cluster.start([("server", 0, s) for s in range(args.shards)])
    if args.pin:  # only now: the shards are pinned to cores counted from this process's set
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    connections = Connections(urls[0], urls)
    keys = PSKeys(config.scope)
    client = PSClient(
        net,
        plan=PSPlan.from_topology(topology),
        connections=connections,
        keys=keys,
        group=0,
        rank=0,
        compression=args.compression,
    )
    client.connect()
    raw = connections.client(urls[0])
    raw_key = f"{config.scope}:raw"

    state_key = keys.state(0, 0)
    updates = 0

    def drain() -> None:
        """Wait, untimed, until the shards applied every gradient pushed so far."""
        while int(raw.hget(state_key, "version") or 0) < updates:
            time.sleep(0.001)

    def round_trip_block() -> float:
        nonlocal updates
        started = time.perf_counter()
        for _ in range(args.block):
            client.step(updates)
            updates += 1
        return time.perf_counter() - started

    def wire_block() -> float:
        nonlocal updates
        started = time.perf_counter()
        for _ in range(args.block):
            client.push(updates)
            client.pull()
            updates += 1
        elapsed = time.perf_counter() - started
        drain()
        return elapsed

    def raw_block() -> float:
        started = time.perf_counter()
        for _ in range(args.block):
            pipe = raw.pipeline(transaction=False)
            pipe.set(raw_key, raw_bytes)
            pipe.get(raw_key)
            pipe.execute()
        return time.perf_counter() - started

    times: dict[str, list[float]] = {"raw": [], "wire": [], "round trip": []}
    processes = {"worker": psutil.Process()}
    processes.update(
        {f"shard {role[2]}": psutil.Process(p.pid) for role, p in cluster.processes.items()}
    )
    processes.update({name: psutil.Process(pid) for name, pid in redis_pids.items()})
    cpu: dict[str, dict[str, float]] = {kind: dict.fromkeys(processes, 0.0) for kind in times}

    def measured(kind: str, block: Callable[[], float]) -> None:
        """Run a block; note its time and, with --cpu, each process's CPU time in it."""
        before = {name: sum(p.cpu_times()[:2]) for name, p in processes.items()} if args.cpu else {}
        times[kind].append(block())
        for name, start in before.items():
            cpu[kind][name] += sum(processes[name].cpu_times()[:2]) - start

    try:
        round_trip_block()  # the shards load and warm up
        wire_block()
        raw_block()
        raw.config_resetstat()
        for _ in range(steps // args.block):
            measured("raw", raw_block)
            measured("wire", wire_block)
            measured("round trip", round_trip_block)
        commands = raw.info("commandstats")
        client.finish()
        cluster.join_servers()
    finally:
        cluster.stop()
        clear_ps_keys(connections, keys)
        client.close()
        connections.close()
    report(args, steps, times, len(raw_bytes), len(grad_bytes), sum(g.numel() for g in grads))
    if args.cpu:
        report_cpu(steps, cpu, commands)


def report_cpu(
    steps: int, cpu: dict[str, dict[str, float]], commands: dict[str, dict[str, float]]
) -> None:
    print("CPU ms per step (wire blocks include the untimed wait for the shards):")
    for kind, by_process in cpu.items():
        parts = ", ".join(
            f"{name} {seconds / steps * 1e3:.2f}" for name, seconds in by_process.items()
        )
        print(f"{kind:>10}: {parts}")
    print("redis 0, time per command over all steps (ms per call, calls):")
    busiest = sorted(commands.items(), key=lambda item: -item[1]["usec"])
    for name, stats in busiest[:8]:
        per_call = stats["usec_per_call"] / 1e3
        print(f"  {name.removeprefix('cmdstat_'):>12}: {per_call:.3f}, {stats['calls']}")


def report(
    args: argparse.Namespace,
    steps: int,
    times: dict[str, list[float]],
    push_bytes: int,
    pull_bytes: int,
    nparams: int,
) -> None:
    push_mb, pull_mb = push_bytes / 1e6, pull_bytes / 1e6
    print(
        f"model: {nparams:,} parameters; push {push_mb:.2f} MB ({args.compression}), "
        f"pull {pull_mb:.2f} MB per step"
    )
    print(
        f"shards: {args.shards}, redis servers: {args.redis_servers}, "
        f"{steps} steps of each kind in blocks of {args.block}"
    )
    raw_total = sum(times["raw"])
    for name, blocks in times.items():
        rate = steps / sum(blocks)
        line = f"{name:>10}: {rate:7.1f} steps/s ({rate * (push_mb + pull_mb):6.0f} MB/s)"
        if name != "raw":
            ratios = [r / b for b, r in zip(blocks, times["raw"], strict=True)]
            line += (
                f"  ratio to raw: {raw_total / sum(blocks):.3f}"
                f" (median block {statistics.median(ratios):.3f})"
            )
        print(line)
    print("target: wire (push + pull) >= 0.7 of raw")


if __name__ == "__main__":
    main()
