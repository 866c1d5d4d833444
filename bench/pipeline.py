"""Pipeline parallelism: speed-up over the unpipelined process against GPipe's ideal, and the
activation memory rematerialisation saves.

The model is a 1-D convolutional net (a 64 x 128 sequence, four equal conv1d layers of 64
channels and kernel 5, a dense classifier; batch 256): about 16 GFLOP a step against 170K
parameters, and 8 MB crossing the cut each way a step, the case pipelining is for; its four
equal layers let the planner give each stage half of the work. A wide MLP is not: the
gradient of a 2048 x 2048 weight is 16 MB that each micro-batch's backward adds to again, so
memory traffic grows with M. Every run is
a real job launched here (harness/local_cluster.py), one process per stage with one torch
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

Schedules (`--only schedules` runs just these): 1F1B and the schedules with virtual stages
(interleaved 1F1B and zero bubble with 2 pieces per stage, zero bubble with 1, ZB-V) at K = 2,
M = 8, each paired with its own unpipelined run and repeated likewise. Targets: the best new
schedule's speed-up >= 1.1x 1F1B's in the same run, and >= 0.85 of linear (K).

    .venv/bin/python bench/pipeline.py [--steps 30] [--repeats 2] [--plot docs/img/pipeline.png]
    .venv/bin/python bench/pipeline.py --only schedules --steps 20 --repeats 3
    .venv/bin/python bench/pipeline.py --smoke

`--smoke` runs every schedule named above (GPipe, with and without `rematerialize`, 1F1B,
interleaved 1F1B and zero bubble with 2 pieces, zero bubble, ZB-V) once, 3 steps of a small
net at M = 8, against one unpipelined run: the script runs end to end, its figures mean nothing.
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

from contract.rundir import TIMELINE
from harness.local_cluster import launch_local
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


# The schedules compared at M = 8: name -> (schedule, virtual_stages); 1F1B is the baseline.
SCHEDULES: dict[str, tuple[str, int | None]] = {
    "1f1b": ("1f1b", None),
    "interleaved_1f1b_v2": ("interleaved_1f1b", 2),
    "zero_bubble": ("zero_bubble", None),
    "zero_bubble_v2": ("zero_bubble", 2),
    "zbv": ("zbv", None),
}


def pipelined(
    steps: int,
    microbatches: int,
    schedule: str = "gpipe",
    remat: bool = False,
    virtual_stages: int | None = None,
    base: dict[str, Any] = JOB,
) -> dict[str, Any]:
    pipeline = {"stages": STAGES, "microbatches": microbatches, "schedule": schedule,
                "rematerialize": remat}  # fmt: skip
    if virtual_stages is not None:
        pipeline["virtual_stages"] = virtual_stages
    return {**base, "train_steps": steps, "pipeline": pipeline}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--plot", type=Path, default=None, help="write the speed-up plot here")
    parser.add_argument(
        "--only", choices=["all", "schedules"], default="all", help="schedules: M = 8 only"
    )
    # --smoke: every schedule once, 3 steps of a small net (smoke_run).
    args = smoke.parse(parser)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "cache").mkdir()
        server = RedisServer(root / "redis", persist=False)
        url = server.start()
        try:
            if args.smoke:
                results = smoke_run(url, root)
            elif args.only == "schedules":
                results = {"schedules_m8": measure_schedules(args.steps, args.repeats, url, root)}
            else:
                results = measure(args.steps, args.repeats, url, root)
        finally:
            server.stop()
    print(json.dumps(results, indent=2))
    if args.plot and "gpipe" in results:
        plot(results, args.plot)


def smoke_run(url: str, root: Path) -> dict[str, Any]:
    """Every schedule (GPipe with and without rematerialisation, and SCHEDULES) once at M = 8,
    3 steps of a 16-channel version of the net, each against the same unpipelined run: the
    script runs end to end, its figures mean nothing."""
    small: dict[str, Any] = json.loads(json.dumps(JOB))
    small["data"] |= {"num_samples": 160, "num_features": 16 * 32, "batch_size": 32}
    for layer in small["neuralnet"]["layers"]:
        if layer["type"] == "reshape":
            layer["shape"] = [16, 32]
        if layer["type"] == "conv1d":
            layer["filters"] = 16
    small["disp_freq"] = 1
    steps = 3
    base = throughput(run_job({**small, "train_steps": steps}, url, root, "plain"))
    kept = run_job(pipelined(steps, 8, base=small), url, root, "gpipe")
    remat = run_job(pipelined(steps, 8, remat=True, base=small), url, root, "gpipe-remat")
    speedups = {"gpipe": throughput(kept) / base}
    for name, (schedule, pieces) in SCHEDULES.items():
        job = pipelined(steps, 8, schedule, False, pieces, small)
        speedups[name] = throughput(run_job(job, url, root, name)) / base
    return {
        "smoke_speedups_m8": speedups,
        "activation_mb_m8": {"kept": peak_activation_mb(kept),
                             "rematerialized": peak_activation_mb(remat)},
    }  # fmt: skip


def paired_speedup(job: dict[str, Any], steps: int, repeats: int, url: str, root: Path) -> float:
    """The median over `repeats` pairs of the pipelined job's throughput over the unpipelined
    job's, run just before it."""
    return statistics.median(paired_runs(job, steps, repeats, url, root)[0])


def paired_runs(
    job: dict[str, Any], steps: int, repeats: int, url: str, root: Path
) -> tuple[list[float], list[float]]:
    """Each pair's ratio (pipelined throughput over the unpipelined run just before it), and
    each pipelined run's step time in ms from its stages' timelines."""
    plain = {k: v for k, v in job.items() if k != "pipeline"}
    ratios, spans = [], []
    for i in range(repeats):
        pipeline = job["pipeline"]
        pieces = pipeline.get("virtual_stages", 1)
        name = f"{pipeline['schedule']}-v{pieces}-m{pipeline['microbatches']}-{i}"
        base = throughput(run_job(plain, url, root, f"plain-{name}"))
        ratios.append(throughput(run_job(job, url, root, name)) / base)
        spans.append(step_ms(root / name))
    return ratios, spans


def step_ms(run_dir: Path) -> float:
    """The median, over the timed steps after the first, of the longest stage's span from its
    first pass's start to its last pass's end: the pipeline's step as its stages timed it,
    without the data loading and updates between steps."""
    by_step: dict[int, float] = {}
    for path in sorted(run_dir.glob(f"workers/*/{TIMELINE}")):
        for line in path.read_text().splitlines():
            record = json.loads(line)
            events = record["events"]
            span = max(e[3] for e in events) - min(e[2] for e in events)
            by_step[record["step"]] = max(by_step.get(record["step"], 0.0), span)
    spans = [by_step[step] for step in sorted(by_step)[1:]] or list(by_step.values())
    return statistics.median(spans) * 1000


def measure_schedules(
    steps: int,
    repeats: int,
    url: str,
    root: Path,
    schedules: dict[str, tuple[str, int | None]] = SCHEDULES,
    base: dict[str, Any] = JOB,
) -> dict[str, Any]:
    """Each schedule's speed-up at M = 8 (paired with its own unpipelined runs), its share of
    linear (K) and of 1F1B's speed-up in the same run; and its step as the stages timed it,
    against 1F1B's (a comparison of the pipelined runs alone, without their baselines)."""
    speedups, spans = {}, {}
    for name, (schedule, pieces) in schedules.items():
        job = pipelined(steps, 8, schedule, False, pieces, base)
        ratios, timed = paired_runs(job, steps, repeats, url, root)
        speedups[name], spans[name] = statistics.median(ratios), statistics.median(timed)
    first = speedups["1f1b"]
    return {
        name: {
            "speedup": value,
            "of_linear": value / STAGES,
            "over_1f1b": value / first,
            "step_ms": spans[name],
            "timed_over_1f1b": spans["1f1b"] / spans[name],
        }
        for name, value in speedups.items()
    }


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
        "schedules_m8": measure_schedules(steps, repeats, url, root),
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
