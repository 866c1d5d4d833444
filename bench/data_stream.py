"""Data larger than memory: a folder of npy shards streamed to the trainer (issue 29).

Three measurements, each in this run, each worker a real training process (workers/trainer.py
on `source: shards`) watched from outside with psutil (harness/watched_workers.py):

1. **memory and speed**: one worker trains one epoch over the whole generated dataset (>= 4 GB
   in the full run); its peak resident memory is sampled every 20 ms. The same net trains the
   same number of steps from an in-memory array of a subset (`source: npz`), same batch size.
   The runs alternate (in-memory, streamed, in-memory, streamed, in-memory) against the
   machine's drift: the median streamed samples/s over the median in-memory.
2. **no copy per rank**: two data-parallel workers (ranks 0 and 1 of 2, each on its half of
   every global batch and its own disjoint half of the shards) against one worker of the same
   global batch. A worker's memory for the data is its peak RSS minus the peak RSS of the same
   worker trained on a one-batch in-memory array (everything but the data).
3. **exact resume**: a smaller dataset whose first feature carries the sample id; the worker is
   SIGKILLed at 5 random points and restarted from its latest restart point each time; the ids
   of the batches that made the final model (the last recording of each step) must hold every
   training sample exactly once per epoch.

    python -m bench.data_stream          # the full run (writes ~4.3 GB, deleted afterwards)
    python -m bench.data_stream --smoke    # tiny sizes, seconds (tests/workers/test_shards.py)
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import yaml

from harness.watched_workers import ID_SCALE, launch, mlp_job, train, write_shards


@dataclass(frozen=True)
class Sizes:
    features: int
    shard_rows: int
    shards: int  # training shards (a test folder of one shard is written beside)
    batch_size: int
    hidden: int
    resume_shards: int
    resume_rows: int
    resume_epochs: int
    step_sleep: float

    @property
    def dataset_bytes(self) -> int:
        return self.features * 4 * self.shard_rows * self.shards


FULL = Sizes(
    features=1024,
    shard_rows=4096,
    shards=260,
    batch_size=256,
    hidden=512,
    resume_shards=12,
    resume_rows=500,  # 6000 samples: 23 batches of 256 an epoch, 112 left out
    resume_epochs=3,
    step_sleep=0.01,
)
SMOKE = Sizes(
    features=16,
    shard_rows=256,
    shards=6,
    batch_size=32,
    hidden=32,
    resume_shards=5,
    resume_rows=64,
    resume_epochs=2,
    step_sleep=0.01,
)


def job(data: dict[str, Any], sizes: Sizes, steps: int, **options: Any) -> dict[str, Any]:
    """The benchmark's net, an MLP over the features, at `sizes`' batch and width."""
    return mlp_job(data, steps, batch_size=sizes.batch_size, hidden=sizes.hidden, **options)


def throughput_and_memory(
    folder: Path, test: Path, sizes: Sizes, work: Path, *, smoke: bool = False
) -> dict[str, Any]:
    """Measurements 1 and 2."""
    train_rows = sizes.shards * sizes.shard_rows
    steps = train_rows // sizes.batch_size
    shards = {
        "source": "shards",
        "path": str(folder),
        "test_path": str(test),
        "shuffle": True,
    }
    # The in-memory subset: 1/16 of the shards (at least 2 batches), as one .npz.
    subset_rows = max(2 * sizes.batch_size, train_rows // 16)
    subset = work / "subset.npz"
    one_batch = work / "one_batch.npz"
    x = np.load(folder / "00000.x.npy", mmap_mode="r")[: sizes.batch_size]
    generator = np.random.default_rng(1)
    subset_x = generator.random((subset_rows, sizes.features), dtype=np.float32)
    subset_y = (np.arange(subset_rows) % 10).astype(np.int64)
    test_x, test_y = np.load(test / "00000.x.npy"), np.load(test / "00000.y.npy")
    np.savez(subset, x=subset_x, y=subset_y, x_test=test_x, y_test=test_y)
    np.savez(
        one_batch,
        x=x[: sizes.batch_size],
        y=(np.arange(sizes.batch_size) % 10).astype(np.int64),
        x_test=test_x,
        y_test=test_y,
    )
    del x, subset_x, subset_y
    memory = {"source": "npz", "path": str(subset)}
    # Alternated, against the machine's drift: in-memory, streamed, in-memory, ... in-memory.
    runs, streams = [], []
    for repeat in range(1 if smoke else 2):
        runs.append(train(job(memory, sizes, steps), work, f"in-memory-{repeat}")[0])
        streams.append(train(job(shards, sizes, steps), work, f"streamed-{repeat}")[0])
    if not smoke:
        runs.append(train(job(memory, sizes, steps), work, "in-memory-last")[0])
    baseline = float(np.median([r.result["samples_per_sec"] for r in runs]))
    rate = float(np.median([r.result["samples_per_sec"] for r in streams]))
    streamed = max(streams, key=lambda r: r.peak_rss)
    # Memory for the data: against the same workers on a one-batch array, as many steps.
    short = max(4, min(steps, 400))
    control = {"source": "npz", "path": str(one_batch)}
    control_one = train(job(control, sizes, short), work, "control-1")[0]
    control_two = train(job(control, sizes, short), work, "control-2", world=2)
    one = train(job(shards, sizes, short), work, "one-worker")[0] if short < steps else streamed
    two = train(job(shards, sizes, short), work, "two-workers", world=2)
    data_one = one.peak_rss - control_one.peak_rss
    data_two = sum(r.peak_rss - c.peak_rss for r, c in zip(two, control_two, strict=True))
    return {
        "dataset_bytes": sizes.dataset_bytes,
        "shape": f"{sizes.shards} shards x ({sizes.shard_rows}, {sizes.features}) float32",
        "steps": steps,
        "batch_size": sizes.batch_size,
        "streamed_peak_rss_mb": streamed.peak_rss / 2**20,
        "in_memory_peak_rss_mb": max(r.peak_rss for r in runs) / 2**20,
        "streamed_samples_per_sec": rate,
        "streamed_runs_samples_per_sec": [r.result["samples_per_sec"] for r in streams],
        "in_memory_samples_per_sec": baseline,
        "in_memory_runs_samples_per_sec": [r.result["samples_per_sec"] for r in runs],
        "speed_ratio": rate / baseline,  # of the medians
        "control_peak_rss_mb": control_one.peak_rss / 2**20,
        "one_worker_data_mb": data_one / 2**20,
        "two_workers_data_mb": data_two / 2**20,
        "memory_ratio": data_two / max(data_one, 1),
    }


def exact_resume(sizes: Sizes, work: Path, kills: int = 5, seed: int = 0) -> dict[str, Any]:
    """Measurement 3: SIGKILL at `kills` random points, restart, check the ids."""
    folder = work / "resume"
    test = work / "resume-test"
    ids = write_shards(
        folder, shards=sizes.resume_shards, rows=sizes.resume_rows, features=sizes.features
    )
    write_shards(test, shards=1, rows=sizes.resume_rows, features=sizes.features, first_id=ids)
    batch = sizes.batch_size
    steps_per_epoch = ids // batch
    steps = steps_per_epoch * sizes.resume_epochs
    data = {"source": "shards", "path": str(folder), "test_path": str(test), "shuffle_buffer": 100}
    job_file = work / "resume.yaml"
    job_file.write_text(yaml.safe_dump(job(data, sizes, steps)))
    run_dir, trace = work / "resume-run", work / "resume-trace.txt"
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    trace.unlink(missing_ok=True)
    extra = ["--trace", str(trace), "--restart-seconds", "0.05", "--step-sleep"]
    extra.append(str(sizes.step_sleep))
    chooser = random.Random(seed)
    killed, attempts = 0, 0
    while True:
        attempts += 1
        process = launch(job_file, run_dir, *extra)
        if killed < kills:
            # A random number of steps into what is left to train, counted from the trace.
            left = steps - len(_history(trace))
            target = _lines(trace) + chooser.randint(1, max(1, left // (kills - killed + 1)))
            while process.poll() is None and _lines(trace) < target:
                time.sleep(0.002)
            if process.poll() is None:
                process.send_signal(signal.SIGKILL)
                process.wait()
                killed += 1
                continue
        process.wait()
        assert process.stdout is not None
        result = json.loads(process.stdout.read().strip().splitlines()[-1])
        if result["status"] != "succeeded":
            raise RuntimeError(f"the resumed run ended {result}")
        break
    history = _history(trace)
    expected = _uninterrupted(job_file, run_dir, steps)
    once = all(
        len(set(ids)) == len(ids) == steps_per_epoch * batch
        for epoch in range(sizes.resume_epochs)
        for ids in [
            [
                i
                for key in range(epoch * steps_per_epoch, (epoch + 1) * steps_per_epoch)
                for i in history.get(key, [])
            ]
        ]
    )
    return {
        "resume_kills": killed,
        "resume_attempts": attempts,
        "resume_steps": steps,
        "resume_epochs": sizes.resume_epochs,
        "every_sample_once_per_epoch": once and len(history) == steps,
        "same_batches_as_uninterrupted": [history.get(k) for k in range(steps)] == expected,
    }


def _uninterrupted(job_file: Path, run_dir: Path, steps: int) -> list[list[int]]:
    """The ids of every batch of `steps` of the job's stream read straight through."""
    from dsl.schema import JobSpec
    from workers.data import load_dataset

    spec = JobSpec.model_validate(yaml.safe_load(job_file.read_text()))
    data = load_dataset(spec.data, seed=spec.seed, cache_dir=run_dir, base_dir=run_dir)
    stream = data.train_batches(spec.data.batch_size, seed=spec.seed, shuffle=spec.data.shuffle)
    out = []
    for _ in range(steps):
        x, _ = next(stream)
        out.append(np.rint(x[:, 0].double().numpy() / ID_SCALE).astype(np.int64).tolist())
    return out


def _lines(trace: Path) -> int:
    return trace.read_bytes().count(b"\n") if trace.is_file() else 0


def _history(trace: Path) -> dict[int, list[int]]:
    """The last recording of each step: what the final model was trained on."""
    history: dict[int, list[int]] = {}
    if trace.is_file():
        for line in trace.read_text().splitlines():
            parts = line.split()
            if parts:
                history[int(parts[0])] = [int(p) for p in parts[1:]]
    return history


def machine_load() -> str:
    load = os.getloadavg()
    return f"{psutil.cpu_count()} CPUs, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, seconds")
    parser.add_argument("--folder", help="where to write the shards (deleted afterwards)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    sizes = SMOKE if args.smoke else FULL
    work = Path(args.folder or tempfile.mkdtemp(prefix="data-stream-"))
    work.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    load_before = machine_load()
    try:
        folder, test = work / "shards", work / "test"
        ids = write_shards(
            folder, shards=sizes.shards, rows=sizes.shard_rows, features=sizes.features
        )
        write_shards(test, shards=1, rows=sizes.shard_rows, features=sizes.features, first_id=ids)
        figures = throughput_and_memory(folder, test, sizes, work, smoke=args.smoke)
        figures |= exact_resume(sizes, work, kills=2 if args.smoke else 5)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    figures["load_before"] = load_before
    figures["load_after"] = machine_load()
    figures["seconds"] = time.perf_counter() - started
    if args.json:
        print(json.dumps(figures))
        return
    for key, value in figures.items():
        print(f"{key:32} {value:.3f}" if isinstance(value, float) else f"{key:32} {value}")


if __name__ == "__main__":
    main()
