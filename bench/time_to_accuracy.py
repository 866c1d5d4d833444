"""Time to 85% test accuracy on mnist1d_cnn for every framework: SINGA's synchronous against
asynchronous comparison, on this machine.

Each framework trains the 1-D CNN of examples/mnist1d_cnn.yaml for --steps steps with a test
pass every --test-freq steps; its time to accuracy is the training time of worker 0 (from the
end of its first step, when every process is up) until its first test pass at or above the
target. All distributed processes run here, one torch thread each, talking through one private
Redis. A table goes to stdout and a plot of test accuracy against time to
docs/img/time_to_accuracy.png.

With --hosts (root; bench/tta_hosts.py) every case runs instead as a job of the service on test
hosts, each process on a host of its own, with the links limited to each of --bandwidths in
turn: a table per bandwidth, and a plot per bandwidth (docs/img/time_to_accuracy_<bw>.png).

With --scale 1,2,4,8 (a machine with the cores: bench/gpu_check.sh on a lent one) it runs the
local job, then allreduce with n workers and downpour with n groups of one worker for each n,
every process pinned to a core of its own, and prints a speed-up table: the local job's time to
the target over each one's.

    .venv/bin/python bench/time_to_accuracy.py [--steps 400] [--test-freq 25]
        [--only local,sandblaster,...] [--hosts --bandwidths 1gbit,100mbit] [--scale 1,2,4,8]

The slow-link comparison of docs/performance.md (local, plain allreduce, PowerSGD, local SGD):

    .venv/bin/python bench/time_to_accuracy.py --hosts --bandwidths 100mbit \
        --only local,allreduce,allreduce-powersgd,localsgd

`--smoke` runs SMOKE_CASES, a case of every framework and of each way allreduce workers sync
(plain, PowerSGD, local SGD with a delayed mean), 40 steps each (local SGD's every 32 steps
averages once, over the 4 after); a case that fails fails the run. Its figures mean nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/ is not a package

import smoke

from dsl.compiler import compile_job
from harness.local_cluster import LaunchError, launch_local
from scheduler.cli.redis_server import RedisServer
from workers.context import worker_dir
from workers.data import TrainingData
from workers.metrics import JsonlSink, read_metrics
from workers.trainer import Trainer, TrainOptions

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
TARGET = 0.85


@dataclass(frozen=True)
class Case:
    name: str
    job: str  # example file
    overrides: dict[str, object]
    note: str


CASES = [
    Case("local", "mnist1d_cnn.yaml", {}, "1 process"),
    Case("sandblaster", "mnist1d_sandblaster.yaml", {}, "1 group x 2 workers, 2 shards"),
    Case(
        "sandblaster-bf16",
        "mnist1d_sandblaster.yaml",
        {"cluster.compression": "bf16"},
        "as above, bf16 gradients",
    ),
    Case("allreduce", "mnist1d_cnn.yaml", {"cluster.framework": "allreduce"}, "1 group x 2"),
    Case(
        "allreduce-powersgd",
        "mnist1d_cnn_powersgd.yaml",
        {},
        "1 group x 2, PowerSGD rank 4 gradients",
    ),
    Case(
        "localsgd",
        "mnist1d_cnn_localsgd.yaml",
        {},
        "1 group x 2, parameters averaged every 8 steps",
    ),
    Case(
        "localsgd-32",
        "mnist1d_cnn_localsgd.yaml",
        {"cluster.sync_freq": 32},
        "1 group x 2, parameters averaged every 32 steps",
    ),
    Case(
        "localsgd-64",
        "mnist1d_cnn_localsgd.yaml",
        {"cluster.sync_freq": 64},
        "1 group x 2, parameters averaged every 64 steps",
    ),
    Case(
        "localsgd-32-delay-8",
        "mnist1d_cnn_localsgd.yaml",
        {"cluster.sync_freq": 32, "cluster.localsgd_delay": 8},
        "1 group x 2, averaged every 32 steps, each averaging over the next 8",
    ),
    Case(
        "localsgd-32-delay-4",
        "mnist1d_cnn_localsgd.yaml",
        {"cluster.sync_freq": 32, "cluster.localsgd_delay": 4},
        "1 group x 2, averaged every 32 steps, each averaging over the next 4",
    ),
    Case(
        "allreduce-powersgd-1",
        "mnist1d_cnn_powersgd.yaml",
        {"cluster.powersgd_rank": 1},
        "1 group x 2, PowerSGD rank 1 gradients",
    ),
    Case("downpour", "mnist1d_downpour.yaml", {}, "2 groups x 1 worker, 1 shard"),
    Case(
        "downpour-fp16",
        "mnist1d_downpour.yaml",
        {"cluster.compression": "fp16"},
        "as above, fp16 gradients",
    ),
    Case("hogwild", "mnist1d_hogwild.yaml", {}, "2 server groups, each 1 worker"),
    Case(
        "hybrid",
        "mnist1d_downpour.yaml",
        {"cluster.nworkers_per_group": 2, "cluster.nservers_per_group": 2},
        "2 groups x 2 workers, 2 shards",
    ),
]


# A case of every framework and of each way allreduce workers sync: what --smoke runs.
SMOKE_CASES = (
    "local",
    "sandblaster",
    "allreduce",
    "allreduce-powersgd",
    "localsgd-32-delay-4",
    "downpour",
    "hogwild",
)


@dataclass
class Result:
    case: Case
    curve: list[tuple[float, float]]  # (seconds since training started, test accuracy)
    seconds: float | None  # time to TARGET
    wall: float  # the whole run, start-up included
    error: str = ""


def _curve(records: list[dict[str, float]]) -> list[tuple[float, float]]:
    """Test accuracy against time since the end of the first step (training metrics are
    reported every step here): by then every process of the run is up, so the start-up of
    server shards does not count as training time."""
    first = next((r["time"] for r in records if "train/loss" in r), None)
    if first is None:
        return []
    return [(r["time"] - first, r["test/accuracy"]) for r in records if "test/accuracy" in r]


def _time_to(curve: list[tuple[float, float]]) -> float | None:
    return next((t for t, acc in curve if acc >= TARGET), None)


def run_local(case: Case, overrides: dict[str, object], run_dir: Path, cache: Path) -> Result:
    started = time.perf_counter()
    text = (EXAMPLES / case.job).read_text()
    loaded = TrainingData(cache_dir=cache)
    job = compile_job(text, loaded, overrides={**case.overrides, **overrides})
    data = loaded.dataset
    sink = JsonlSink(run_dir)
    Trainer(job, data, TrainOptions(run_dir=run_dir), [sink]).run()
    sink.close()
    curve = _curve(read_metrics(run_dir))
    return Result(case, curve, _time_to(curve), time.perf_counter() - started)


def run_distributed(
    case: Case,
    overrides: dict[str, object],
    run_dir: Path,
    cache: Path,
    redis_url: str,
    *,
    pin: bool = False,
) -> Result:
    started = time.perf_counter()
    try:
        launch_local(
            EXAMPLES / case.job,
            None,
            redis_url,
            run_dir,
            cache_dir=cache,
            overrides={**case.overrides, **overrides},
            timeout=900,
            pin_from=0 if pin else None,
        )
    except LaunchError as exc:
        last = str(exc).strip().splitlines()[-1]
        return Result(case, [], None, time.perf_counter() - started, error=last)
    curve = _curve(read_metrics(worker_dir(run_dir, 0, 0)))
    return Result(case, curve, _time_to(curve), time.perf_counter() - started)


def plot(results: list[Result], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for result in results:
        if result.curve:
            xs, ys = zip(*result.curve, strict=True)
            ax.plot(xs, ys, marker=".", label=result.case.name)
    ax.axhline(TARGET, color="grey", linestyle="--", linewidth=1)
    ax.set_xlabel("training time (s), worker 0")
    ax.set_ylabel("test accuracy")
    ax.set_ylim(0, 1)
    ax.set_title(title)
    ax.legend(loc="lower right", fontsize="small")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def table(results: list[Result]) -> None:
    print(f"| framework | topology | time to {TARGET:.0%} | final accuracy | run wall time |")
    print("| --- | --- | --- | --- | --- |")
    for r in results:
        reached = f"{r.seconds:.1f} s" if r.seconds is not None else "not reached"
        final = f"{r.curve[-1][1]:.3f}" if r.curve else "-"
        note = f"{r.case.note}" + (f" ({r.error})" if r.error else "")
        print(f"| {r.case.name} | {note} | {reached} | {final} | {r.wall:.0f} s |")


def as_json(results: list[Result]) -> list[dict[str, object]]:
    return [
        {"name": r.case.name, "seconds": r.seconds, "curve": r.curve, "error": r.error}
        for r in results
    ]


def run_here(cases: list[Case], overrides: dict[str, object], tmp: Path) -> list[Result]:
    results: list[Result] = []
    cache = tmp / "cache"
    server = RedisServer(tmp / "redis", persist=False)
    redis_url = server.start()
    try:
        for case in cases:
            run_dir = tmp / case.name
            if case.name == "local":
                result = run_local(case, overrides, run_dir, cache)
            else:
                result = run_distributed(case, overrides, run_dir, cache, redis_url)
            results.append(result)
            shown = f"{result.seconds:.1f} s" if result.seconds is not None else "not reached"
            print(f"{case.name}: {shown} {result.error}", flush=True)
    finally:
        server.stop()
    return results


def scale_cases(workers: list[int]) -> list[Case]:
    """allreduce with n workers in one group and downpour with n groups of one worker (one
    shard) for each n: SINGA's first goal, less time to an accuracy with more workers."""
    cases = []
    for n in workers:
        cases.append(
            Case(
                f"allreduce-{n}",
                "mnist1d_cnn.yaml",
                {"cluster.framework": "allreduce", "cluster.nworkers_per_group": n},
                f"1 group x {n}",
            )
        )
        cases.append(
            Case(
                f"downpour-{n}",
                "mnist1d_downpour.yaml",
                {"cluster.nworker_groups": n},
                f"{n} groups x 1 worker, 1 shard",
            )
        )
    return cases


def run_scale(workers: list[int], overrides: dict[str, object], tmp: Path) -> list[Result]:
    """The local job, then scale_cases(workers), every process pinned to a core of its own."""
    cache = tmp / "cache"
    server = RedisServer(tmp / "redis", persist=False)
    redis_url = server.start()
    results = [run_local(CASES[0], overrides, tmp / "local", cache)]
    try:
        for case in scale_cases(workers):
            results.append(
                run_distributed(case, overrides, tmp / case.name, cache, redis_url, pin=True)
            )
            done = results[-1]
            shown = done.seconds if done.seconds is not None else "not reached"
            print(f"{case.name}: {done.error or shown}", flush=True)
    finally:
        server.stop()
    return results


def speedup_table(results: list[Result], workers: list[int]) -> None:
    """Time to TARGET of each framework and n, and the local job's time over it."""
    by_name = {r.case.name: r for r in results}
    local = by_name["local"].seconds

    def cell(name: str) -> str:
        found = by_name[name].seconds
        if found is None:
            return "not reached | -"
        ratio = f"{local / found:.2f}x" if local is not None else "-"
        return f"{found:.1f} s | {ratio}"

    shown = f"{local:.1f} s" if local is not None else "not reached"
    print(f"\nthe local job (1 process): {shown} to {TARGET:.0%}\n")
    print("| workers | allreduce | speed-up | downpour | speed-up |")
    print("| --- | --- | --- | --- | --- |")
    for n in workers:
        print(f"| {n} | {cell(f'allreduce-{n}')} | {cell(f'downpour-{n}')} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--test-freq", type=int, default=25)
    parser.add_argument("--only", default="", help="comma-separated case names")
    parser.add_argument("--plot", type=Path, default=ROOT / "docs" / "img" / "time_to_accuracy.png")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    parser.add_argument("--hosts", action="store_true", help="run on test hosts (needs root)")
    parser.add_argument(
        "--bandwidths", default="1gbit,100mbit", help="with --hosts: comma-separated, or none"
    )
    parser.add_argument(
        "--scale",
        default="",
        help="comma-separated worker counts (e.g. 1,2,4,8): a speed-up table of allreduce and "
        "downpour, each process pinned to a core of its own (needs that many cores)",
    )
    args = smoke.parse(parser, steps=40, test_freq=10, only=",".join(SMOKE_CASES))
    torch.set_num_threads(1)
    wanted = {name for name in args.only.split(",") if name}
    cases = [case for case in CASES if not wanted or case.name in wanted]
    overrides: dict[str, object] = {
        "train_steps": args.steps,
        "test.freq": args.test_freq,
        "disp_freq": 1,
        "checkpoint.freq": 0,
    }
    if args.scale:
        workers = [int(n) for n in args.scale.split(",")]
        needed = max(workers) + 1  # the downpour shard's core
        if len(os.sched_getaffinity(0)) < needed:
            raise SystemExit(f"--scale {args.scale} pins each process: it needs {needed} cores")
        with tempfile.TemporaryDirectory() as tmp:
            results = run_scale(workers, overrides, Path(tmp))
        speedup_table(results, workers)
        if args.json:
            args.json.write_text(json.dumps({"scale": as_json(results)}, indent=1))
        failed = [r.case.name for r in results if r.error]
        if failed:  # a run that broke is no figure (bench/gpu_check.sh shows the step failed)
            raise SystemExit(f"these runs failed: {', '.join(failed)}")
        return
    with tempfile.TemporaryDirectory() as tmp:
        if args.hosts:
            from tta_hosts import run_on_hosts

            bandwidths = [b for b in args.bandwidths.split(",") if b]
            by_bandwidth = run_on_hosts(cases, overrides, bandwidths, Path(tmp))
        else:
            by_bandwidth = {"": run_here(cases, overrides, Path(tmp))}
    for bandwidth, results in by_bandwidth.items():
        where = f"test hosts, links of {bandwidth}" if bandwidth else "one 2-core machine"
        print(f"\n{where}\n")
        table(results)
        path = args.plot.with_stem(f"{args.plot.stem}_{bandwidth}") if bandwidth else args.plot
        plot(results, path, f"mnist1d CNN: test accuracy against time, {where}")
        print(f"\nplot: {path}")
    if args.json:
        payload = {b or "here": as_json(results) for b, results in by_bandwidth.items()}
        args.json.write_text(json.dumps(payload, indent=1))
    failed = [r.case.name for results in by_bandwidth.values() for r in results if r.error]
    if args.smoke and failed:  # a smoke run checks that every case runs
        raise SystemExit(f"these runs failed: {', '.join(failed)}")


if __name__ == "__main__":
    main()
