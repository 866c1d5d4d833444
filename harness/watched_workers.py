"""Workers watched from outside: real training processes (workers/trainer.py), each started
as this file run as a module, its peak resident memory sampled every 20 ms; one may record the
sample ids of every batch it trains on. With what they train on: folders of npy shards whose
first feature carries the sample id, and an MLP job. bench/data_stream.py measures streaming
with it, bench/data_stream_stack.py writes its shards with it, and tests/workers/test_shards.py
checks a streaming worker's memory with it.

    python -m harness.watched_workers --job job.yaml --run-dir run [--rank 0 --world 1]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import yaml

ROOT = Path(__file__).resolve().parents[1]
ID_SCALE = 1e-6  # the first feature is id * ID_SCALE, exact enough in float32 to round back


def write_shards(
    folder: Path, *, shards: int, rows: int, features: int, first_id: int = 0, seed: int = 0
) -> int:
    """`shards` npy pairs of `rows` samples: x float32 (rows, features) with x[:, 0] the sample
    id (scaled), y = id % 10. Returns the next id."""
    folder.mkdir(parents=True, exist_ok=True)
    generator = np.random.default_rng(seed)
    next_id = first_id
    for index in range(shards):
        ids = np.arange(next_id, next_id + rows)
        x = generator.random((rows, features), dtype=np.float32)
        x[:, 0] = ids * ID_SCALE
        np.save(folder / f"{index:05d}.x.npy", x)
        np.save(folder / f"{index:05d}.y.npy", (ids % 10).astype(np.int64))
        next_id += rows
    return next_id


def mlp_job(
    data: dict[str, Any],
    steps: int,
    *,
    batch_size: int,
    hidden: int,
    first: dict[str, Any] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """A job of an MLP over the features (`hidden` units), 10 classes. `first`: a layer
    between the input and the MLP (it reads `data`); `extra`: top-level keys, which win."""
    inputs: list[dict[str, Any]] = [{"name": "data", "type": "input"}]
    if first is not None:
        inputs.append({**first, "srclayers": ["data"]})
    return {
        "name": "data-stream",
        "seed": 0,
        "data": {"batch_size": batch_size, **data},
        "neuralnet": {
            "layers": [
                *inputs,
                {
                    "name": "fc1",
                    "type": "dense",
                    "srclayers": [inputs[-1]["name"]],
                    "units": hidden,
                },
                {"name": "relu1", "type": "relu", "srclayers": ["fc1"]},
                {"name": "fc2", "type": "dense", "srclayers": ["relu1"], "units": 10},
                {"name": "loss", "type": "softmax_loss", "srclayers": ["fc2"]},
            ]
        },
        "train_one_batch": {"alg": "bp"},
        "updater": {"type": "sgd", "lr": {"base": 0.01}},
        "train_steps": steps,
        "disp_freq": max(1, min(50, steps // 4)),
        "test": {"freq": 0, "steps": 1},
        "checkpoint": {"freq": 0},
        **extra,
    }


# -- the worker (a separate process) -------------------------------------------------------------
def worker(args: argparse.Namespace) -> None:
    """Train the job once (resuming from the run's latest restart point); print a JSON line
    with samples/s of the display windows after the first."""
    import torch

    from contract.rundir import latest_restart_point
    from dsl.compiler import compile_job
    from workers.data import TrainingData
    from workers.trainer import Trainer, TrainOptions

    torch.set_num_threads(1)
    run_dir = Path(args.run_dir)
    document = yaml.safe_load(Path(args.job).read_text())
    data = TrainingData(cache_dir=run_dir / "cache", base_dir=run_dir)
    compiled = compile_job(document, data)
    found = latest_restart_point(run_dir)
    options = TrainOptions(
        run_dir=run_dir,
        rank=args.rank,
        world=args.world,
        resume_from=found[1] if found else None,
        restart_seconds=args.restart_seconds,
    )
    rates: list[float] = []

    class Rates:
        def emit(self, record: Any) -> None:
            if "samples_per_sec" in getattr(record, "values", {}):
                rates.append(record.values["samples_per_sec"])

        def log(self, line: str) -> None: ...
        def checkpoint(self, step: int, path: Path, *, best: bool = False) -> None: ...
        def close(self) -> None: ...

    trainer = Trainer(compiled, data.dataset, options, [Rates()])
    if args.trace:
        trainer.batches = Recording(trainer.batches, Path(args.trace))
    sleep = args.step_sleep
    summary = trainer.run(on_step=(lambda _: time.sleep(sleep)) if sleep else None)
    steady = rates[1:] or rates
    print(
        json.dumps(
            {
                "status": summary.status,
                "steps": summary.steps,
                "samples_per_sec": sum(steady) / max(len(steady), 1),
            }
        ),
        flush=True,
    )


class Recording:
    """The trainer's stream, writing `key id id ...` for every batch it hands out, where key is
    the batch's step in the whole run (epoch * steps_per_epoch + position)."""

    def __init__(self, stream: Any, path: Path) -> None:
        self.stream, self.out = stream, path.open("a", buffering=1)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)

    def __iter__(self) -> Recording:
        return self

    def __next__(self) -> Any:
        state = self.stream.state()
        key = state["epoch"] * self.stream.steps_per_epoch + state["position"]
        x, y = next(self.stream)
        ids = np.rint(x[:, 0].double().numpy() / ID_SCALE).astype(np.int64)
        self.out.write(f"{key} {' '.join(map(str, ids.tolist()))}\n")
        return x, y


# -- watching from outside -------------------------------------------------------------------
@dataclass
class Ran:
    peak_rss: int
    result: dict[str, Any]
    returncode: int


def launch(job_file: Path, run_dir: Path, *extra: str) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "harness.watched_workers", "--job", str(job_file)]
    command += ["--run-dir", str(run_dir), *extra]
    return subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, text=True)


def watch(processes: list[subprocess.Popen[str]]) -> list[Ran]:
    """Wait for the processes, sampling each one's resident memory every 20 ms."""
    peaks = [0] * len(processes)
    handles = [psutil.Process(p.pid) for p in processes]
    while any(p.poll() is None for p in processes):
        for i, handle in enumerate(handles):
            with contextlib.suppress(psutil.Error):
                peaks[i] = max(peaks[i], handle.memory_info().rss)
        time.sleep(0.02)
    out = []
    for process, peak in zip(processes, peaks, strict=True):
        assert process.stdout is not None
        lines = process.stdout.read().strip().splitlines()
        result = json.loads(lines[-1]) if lines else {}
        out.append(Ran(peak, result, process.returncode))
    return out


def train(
    document: dict[str, Any], work: Path, name: str, *extra: str, world: int = 1
) -> list[Ran]:
    run_dirs = [work / f"{name}-{rank}" for rank in range(world)]
    job_file = work / f"{name}.yaml"
    job_file.write_text(yaml.safe_dump(document))
    processes = []
    for rank, run_dir in enumerate(run_dirs):
        shutil.rmtree(run_dir, ignore_errors=True)
        run_dir.mkdir(parents=True)
        args = ["--rank", str(rank), "--world", str(world), *extra]
        processes.append(launch(job_file, run_dir, *args))
    ran = watch(processes)
    for r in ran:
        if r.returncode != 0 or r.result.get("status") != "succeeded":
            raise RuntimeError(f"{name}: the worker ended {r.returncode} {r.result}")
    return ran


def main() -> None:
    parser = argparse.ArgumentParser(description="Train a job once, as one watched worker.")
    parser.add_argument("--job", required=True)
    parser.add_argument("--run-dir", required=True)
    parser.add_argument("--rank", type=int, default=0)
    parser.add_argument("--world", type=int, default=1)
    parser.add_argument("--trace", help="write each batch's step and sample ids here")
    parser.add_argument("--restart-seconds", type=float, default=0.0)
    parser.add_argument("--step-sleep", type=float, default=0.0)
    worker(parser.parse_args())


if __name__ == "__main__":
    main()
