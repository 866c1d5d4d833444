"""Pipeline parallelism: speed-up over the unpipelined process against GPipe's ideal, and the
activation memory rematerialisation saves.

The model is a 1-D convolutional net (a 64 x 128 sequence, four equal conv1d layers of 64
channels and kernel 5, a dense classifier; batch 256): about 16 GFLOP a step against 170K
parameters, and 8 MB crossing the cut each way a step, the case pipelining is for; its four
equal layers let the planner give each stage half of the work. A wide MLP is not: the
gradient of a 2048 x 2048 weight is 16 MB that each micro-batch's backward adds to again, so
memory traffic grows with M. Every run is
a real job launched here (bench/local_cluster.py), one process per stage with one torch
thread each; the planner cuts the net in two. The throughput is the trainer's own samples/s
over its windows after the first (start-up and the first step's shape probe excluded), so
the ratio compares the steady state of the two. Every pipelined run is paired with an
unpipelined run just before it, and each pair is repeated (`--repeats`): the ratio reported
is the median over the pairs, so a burst of other work on the shared machine spoils one
pair, not the figure.

For K = 2 stages and M micro-batches the ideal speed-up is K*M / (M + K - 1) (GPipe's bubble).
Target: >= 0.85 of it at M = 8. Memory: the most activation memory a stage holds for its
backward passes (pipeline/activation_mb) with and without `rematerialize`; target: at most
half with it.

    .venv/bin/python bench/pipeline.py [--steps 30] [--repeats 2] [--plot docs/img/pipeline.png]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/ is not a package

import smoke
from local_cluster import launch_local

from scheduler.cli.redis_server import RedisServer
from workers.context import worker_dir
from workers.metrics import read_metrics

STAGES = 2
MICROBATCHES = (1, 2, 4, 8, 16)
LENGTH = 128  # positions of the sequence
CHANNELS = 64

JOB: dict[str, Any] = {
    "name": "bench-pipeline",
    "seed": 0,
    "data": {"source": "synthetic", "task": "classification", "num_samples": 2048,
             "num_features": CHANNELS * LENGTH, "num_classes": 10, "batch_size": 256,
             "test_fraction": 0.1},
    "neuralnet": {"layers": [
        {"name": "data", "type": "input"},
        {"name": "seq", "type": "reshape", "srclayers": ["data"], "shape": [CHANNELS, LENGTH]},
        *[layer for i in range(1, 5) for layer in (
            {"name": f"conv{i}", "type": "conv1d",
             "srclayers": ["seq" if i == 1 else f"act{i - 1}"],
             "filters": CHANNELS, "kernel": 5, "padding": 2},
            {"name": f"act{i}", "type": "relu", "srclayers": [f"conv{i}"]},
        )],
        {"name": "flat", "type": "flatten", "srclayers": ["act4"]},
        {"name": "out", "type": "dense", "srclayers": ["flat"]},
        {"name": "loss", "type": "softmax_loss", "srclayers": ["out"]},
    ]},
    "updater": {"type": "sgd", "momentum": 0.9, "lr": {"base": 0.01}},
    "disp_freq": 5,
    "test": {"steps": 1},
}  # fmt: skip


def ideal(stages: int, microbatches: int) -> float:
    return stages * microbatches / (microbatches + stages - 1)


def run_job(
    job: dict[str, Any], redis_url: str, root: Path, name: str
) -> dict[tuple[int, int], list[dict[str, float]]]:
    """Launch the job; each worker's metric records after its first window."""
    run_dir = root / name
    run = launch_local(yaml.safe_dump(job), None, redis_url, run_dir, cache_dir=root / "cache")
    if run.summary["status"] != "succeeded":
        raise RuntimeError(f"{name}: {run.summary}")
    records = {}
    for group, rank in run.workers:
        rows = [r for r in read_metrics(worker_dir(run_dir, group, rank)) if "samples_per_sec" in r]
        records[(group, rank)] = rows[1:]
    if not run.workers:  # a one-process job writes the run directory itself
        rows = [r for r in read_metrics(run_dir) if "samples_per_sec" in r]
        records[(0, 0)] = rows[1:]
    return records


def throughput(records: dict[tuple[int, int], list[dict[str, float]]]) -> float:
    """Samples/s of the first worker (every stage runs the same steps)."""
    return statistics.median(r["samples_per_sec"] for r in records[min(records)])


def peak_activation_mb(records: dict[tuple[int, int], list[dict[str, float]]]) -> list[float]:
    """Per stage, the most activation memory held during a step (max over windows)."""
    return [max(r["train/pipeline/activation_mb"] for r in records[key]) for key in sorted(records)]


def pipelined(
    steps: int, microbatches: int, schedule: str = "gpipe", remat: bool = False
) -> dict[str, Any]:
    pipeline = {"stages": STAGES, "microbatches": microbatches, "schedule": schedule,
                "rematerialize": remat}  # fmt: skip
    return {**JOB, "train_steps": steps, "pipeline": pipeline}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--plot", type=Path, default=None, help="write the speed-up plot here")
    args = smoke.parse(parser, steps=10, repeats=1)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "cache").mkdir()
        server = RedisServer(root / "redis", persist=False)
        url = server.start()
        try:
            results = measure(args.steps, args.repeats, url, root)
        finally:
            server.stop()
    print(json.dumps(results, indent=2))
    if args.plot:
        plot(results, args.plot)


def paired_speedup(job: dict[str, Any], steps: int, repeats: int, url: str, root: Path) -> float:
    """The median over `repeats` pairs of the pipelined job's throughput over the unpipelined
    job's, run just before it."""
    plain = {**JOB, "train_steps": steps}
    ratios = []
    for i in range(repeats):
        name = f"{job['pipeline']['schedule']}-m{job['pipeline']['microbatches']}-{i}"
        base = throughput(run_job(plain, url, root, f"plain-{name}"))
        ratios.append(throughput(run_job(job, url, root, name)) / base)
    return statistics.median(ratios)


def measure(steps: int, repeats: int, url: str, root: Path) -> dict[str, Any]:
    rows = []
    for m in MICROBATCHES:
        speedup = paired_speedup(pipelined(steps, m), steps, repeats, url, root)
        rows.append(
            {"microbatches": m, "speedup": speedup, "ideal": ideal(STAGES, m),
             "of_ideal": speedup / ideal(STAGES, m)}
        )  # fmt: skip
    one_f_one_b = paired_speedup(pipelined(steps, 8, "1f1b"), steps, repeats, url, root)
    kept = peak_activation_mb(run_job(pipelined(steps, 8, "gpipe"), url, root, "mem"))
    remat = peak_activation_mb(run_job(pipelined(steps, 8, "gpipe", True), url, root, "mem-remat"))
    return {
        "gpipe": rows,
        "1f1b_m8": {"speedup": one_f_one_b, "of_ideal": one_f_one_b / ideal(STAGES, 8)},
        "activation_mb_m8": {"kept": kept, "rematerialized": remat,
                             "ratio": [r / k for r, k in zip(remat, kept, strict=True)]},
    }  # fmt: skip


def plot(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = results["gpipe"]
    ms = [r["microbatches"] for r in rows]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(ms, [r["ideal"] for r in rows], "--", label="ideal K·M/(M+K-1)")
    ax.plot(ms, [r["speedup"] for r in rows], "o-", label="measured (GPipe)")
    ax.set_xscale("log", base=2)
    ax.set_xticks(ms, [str(m) for m in ms])
    ax.set_xlabel("micro-batches M")
    ax.set_ylabel("speed-up over one process")
    ax.set_title("2 pipeline stages, 2 CPU cores")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
