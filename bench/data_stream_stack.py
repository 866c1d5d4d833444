"""Issue 29's "done when" through a real stack: a folder of npy shards (>= 4 GB in the full run)
trained by allreduce on 2 workers of one `trainyard up`, one worker SIGKILLed mid-epoch.

The shards are bench/data_stream.py's (harness/watched_workers.py writes them; the first
feature carries the sample id), written to a temporary folder that is deleted afterwards. An
admin submits `source: shards, path: ...` with a 2-worker allreduce job; the service saves
restart points every `--restart-seconds`. Once the job reports `--kill-at` of its steps, the
worker of rank 1 is SIGKILLed (its pid from its allocation's record in Redis, as
bench/faults.py finds it); the service restarts the job from its latest restart point and
it runs to the end. Measured from outside:

- **peak resident memory** of every worker process (psutil, every 20 ms), the most per rank
  over its attempts;
- **exactly once**: the net's first layer is bench/sample_ids.py's `sample_ids` (a plugin the
  stack loads), which writes the ids of every batch each worker trains on, with the step. The
  batches that made the final model (the last recording of each step and rank) must hold no
  sample twice within an epoch, and be batch for batch what an uninterrupted stream of the
  same job gives each rank (workers/data read here straight through). Where `--steps` is less
  than an epoch, this holds over the samples the job trained on, a fraction of the epoch.

    .venv/bin/python bench/data_stream_stack.py [--steps 4160] [--kill-at 0.5]
        [--folder /tmp/x] [--json out.json]      # ~4.4 GB of shards, deleted afterwards
    .venv/bin/python bench/data_stream_stack.py --smoke
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import psutil  # noqa: E402
import redis  # noqa: E402
from sqlalchemy import select  # noqa: E402

from bench import smoke  # noqa: E402
from bench.data_stream import SMOKE, job, machine_load  # noqa: E402
from bench.load import start_stack  # noqa: E402
from contract.allocation import PID  # noqa: E402
from contract.keys import Keys  # noqa: E402
from contract.settings import Settings  # noqa: E402
from harness.watched_workers import ID_SCALE, write_shards  # noqa: E402
from scheduler.cli.stack import read_stack_file  # noqa: E402
from scheduler.store.database import Database  # noqa: E402
from scheduler.store.models import Allocation  # noqa: E402
from trainyard import Client  # noqa: E402
from trainyard.client import Job  # noqa: E402

PLUGIN = ROOT / "bench" / "sample_ids.py"
WORLD = 2
TIMEOUT = 1800.0


@dataclass
class Worker:
    """One worker process of the job, as seen from outside."""

    rank: int
    pid: int
    started: int  # its allocation's id: later attempts have larger ones
    peak_rss: int = 0


@dataclass
class Watch:
    """The job's worker processes, found through SQL (allocations) and Redis (their pids)."""

    db: Database
    redis: redis.Redis
    keys: Keys
    job_id: int
    workers: dict[int, Worker] = field(default_factory=dict)  # by allocation id
    checked: float = 0.0

    def sample(self) -> None:
        now = time.monotonic()
        if now - self.checked > 0.5:
            self.checked = now
            self._find()
        for worker in self.workers.values():
            with contextlib.suppress(psutil.Error):
                rss = psutil.Process(worker.pid).memory_info().rss
                worker.peak_rss = max(worker.peak_rss, rss)

    def _find(self) -> None:
        with self.db.session() as session:
            rows = session.execute(
                select(Allocation.id, Allocation.rank).where(
                    Allocation.job_id == self.job_id, Allocation.role == "worker"
                )
            ).all()
        for alloc_id, rank in rows:
            if alloc_id not in self.workers:
                pid = int(self.redis.hget(self.keys.allocation(alloc_id), PID) or 0)
                if pid:
                    self.workers[alloc_id] = Worker(rank, pid, alloc_id)

    def running(self, rank: int) -> Worker | None:
        ours = [w for w in self.workers.values() if w.rank == rank and psutil.pid_exists(w.pid)]
        return max(ours, key=lambda w: w.started, default=None)


def document(shards: Path, test: Path, trace: Path, args: argparse.Namespace) -> dict[str, Any]:
    """bench/data_stream.py's MLP with `sample_ids` first, on 2 allreduce workers."""
    data = {"source": "shards", "path": str(shards), "test_path": str(test), "shuffle": True}
    ids = {"name": "ids", "type": "sample_ids", "trace": str(trace), "sleep": args.step_sleep}
    sizes = replace(SMOKE, batch_size=args.batch_size, hidden=args.hidden)
    return job(
        data,
        sizes,
        args.steps,
        first=ids,
        name="data-stream-stack",
        disp_freq=max(1, min(50, args.steps // 8)),
        cluster={"framework": "allreduce", "nworkers_per_group": WORLD},
    )


def history(trace: Path, workers: list[Worker]) -> dict[tuple[int, int], list[int]]:
    """(rank, step) -> the ids of the batch that step trained on last: each worker's lines in
    the order its attempt started."""
    found: dict[tuple[int, int], list[int]] = {}
    for worker in sorted(workers, key=lambda w: w.started):
        path = trace / f"{worker.pid}.txt"
        if path.is_file():
            for line in path.read_text().splitlines():
                step, *ids = map(int, line.split())
                found[(worker.rank, step)] = ids
    return found


def uninterrupted(spec: dict[str, Any], steps: int) -> dict[tuple[int, int], list[int]]:
    """The ids of each rank's first `steps` batches of the job's stream read straight through."""
    from dsl.plugins import load_plugins
    from dsl.schema import JobSpec
    from workers.data import load_dataset

    load_plugins([str(PLUGIN)])  # the job's net names its layer, as in the stack's processes
    job = JobSpec.model_validate(spec)
    with tempfile.TemporaryDirectory() as cache:
        data = load_dataset(job.data, seed=job.seed, cache_dir=Path(cache), base_dir=Path(cache))
    out = {}
    for rank in range(WORLD):
        stream = data.train_batches(
            job.data.batch_size, seed=job.seed, rank=rank, world=WORLD, shuffle=job.data.shuffle
        )
        for step in range(1, steps + 1):
            x, _ = next(stream)
            out[(rank, step)] = np.rint(x[:, 0].double().numpy() / ID_SCALE).astype(int).tolist()
    return out


def run(work: Path, args: argparse.Namespace) -> dict[str, Any]:
    shards, test, trace, data_dir = (work / name for name in ("shards", "test", "trace", "stack"))
    began = time.perf_counter()
    ids = write_shards(shards, shards=args.shards, rows=args.shard_rows, features=args.features)
    write_shards(test, shards=1, rows=args.shard_rows, features=args.features, first_id=ids)
    written = time.perf_counter() - began
    trace.mkdir()
    data_dir.mkdir()
    process, url, token = start_stack(
        data_dir,
        WORLD,
        work / "up.log",
        TRAINYARD_PLUGINS=str(PLUGIN),
        TRAINYARD_RESTART_POINT_SECONDS=repr(args.restart_seconds),
    )
    stack = read_stack_file(data_dir / "stack.json")
    assert stack is not None
    settings = Settings(data_dir=data_dir, redis_url=stack.redis_url)
    db = Database(settings.sql_url())
    try:
        client = Client(url, token)
        spec = document(shards, test, trace, args)
        load_at_start = machine_load()
        job = client.submit(spec)
        assert isinstance(job, Job)
        watch = Watch(
            db, redis.Redis.from_url(stack.redis_url), Keys(settings.redis_prefix), job.id
        )
        kill_step = int(args.steps * args.kill_at)
        killed_at = 0
        deadline = time.monotonic() + TIMEOUT
        polled = 0.0
        while time.monotonic() < deadline:
            watch.sample()
            if time.monotonic() - polled > 0.5:
                polled = time.monotonic()
                job.refresh()
                if job.state in ("SUCCEEDED", "FAILED", "CANCELLED"):
                    break
                victim = watch.running(1)
                if not killed_at and job.step >= kill_step and victim is not None:
                    killed_at = _last_step(trace / f"{victim.pid}.txt")
                    os.kill(victim.pid, signal.SIGKILL)
            time.sleep(0.02)
        job.refresh()
        trained = time.perf_counter() - began - written
        if job.state != "SUCCEEDED":
            raise RuntimeError(f"job {job.id} ended {job.state}: {job.error}\n{_tail(work)}")
        workers = list(watch.workers.values())
    finally:
        db.dispose()
        process.terminate()
        process.wait(timeout=60)
    seen = history(trace, workers)
    expected = uninterrupted(spec, args.steps)
    steps_per_epoch = epoch_steps(args)
    epochs = [
        [i for rank in range(WORLD) for k in steps for i in seen.get((rank, k), [])]
        for steps in _epochs(args.steps, steps_per_epoch)
    ]
    samples = sum(len(e) for e in epochs)
    per_epoch = steps_per_epoch * args.batch_size
    peaks = {
        rank: max((w.peak_rss for w in workers if w.rank == rank), default=0) / 2**20
        for rank in range(WORLD)
    }
    return {
        "dataset_bytes": args.shards * args.shard_rows * args.features * 4,
        "shape": f"{args.shards} shards x ({args.shard_rows}, {args.features}) float32",
        "batch_size": args.batch_size,
        "steps": args.steps,
        "steps_per_epoch": steps_per_epoch,
        "share_of_an_epoch": args.steps / steps_per_epoch,
        "killed_rank_1_at_step": killed_at,
        "restarts": job.info.restarts,
        "resumed_at_steps": _resumed_at(trace, workers),
        "worker_processes": len(workers),
        "peak_rss_mb_by_rank": peaks,
        "samples_trained": samples,
        # No sample twice in an epoch; a whole epoch trains on every sample of the ranks.
        "every_sample_once_per_epoch": all(
            len(set(e)) == len(e) and (len(e) == per_epoch or e is epochs[-1]) for e in epochs
        ),
        "every_step_recorded": len(seen) == WORLD * args.steps,
        "same_batches_as_uninterrupted": seen == expected,
        "write_seconds": written,
        "train_seconds": trained,
        "load_at_start": load_at_start,
        "load_after": machine_load(),
    }


def epoch_steps(args: argparse.Namespace) -> int:
    """Steps of an epoch: each rank's range in whole batch parts (the sizes here divide)."""
    return args.shards * args.shard_rows // WORLD // (args.batch_size // WORLD)


def _epochs(steps: int, per_epoch: int) -> list[range]:
    return [range(s + 1, min(s + per_epoch, steps) + 1) for s in range(0, steps, per_epoch)]


def _resumed_at(trace: Path, workers: list[Worker]) -> list[int]:
    """The steps restarted workers went on from: their first step recorded, less one."""
    firsts = {
        int(path.read_text().split(maxsplit=1)[0]) - 1
        for w in workers
        if (path := trace / f"{w.pid}.txt").is_file() and path.stat().st_size
    }
    return sorted(firsts - {0})


def _last_step(path: Path) -> int:
    lines = path.read_text().splitlines() if path.is_file() else []
    return int(lines[-1].split()[0]) if lines else 0


def _tail(work: Path) -> str:
    return (work / "up.log").read_text(errors="replace")[-4000:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", type=int, default=260, help="training shards")
    parser.add_argument("--shard-rows", type=int, default=4096)
    parser.add_argument("--features", type=int, default=1024)
    parser.add_argument("--batch-size", type=int, default=256, help="the global batch")
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--steps", type=int, help="default: one epoch")
    parser.add_argument("--kill-at", type=float, default=0.5, help="share of the steps")
    parser.add_argument("--restart-seconds", type=float, default=5.0)
    parser.add_argument(
        "--step-sleep", type=float, default=0.0, help="seconds added to each step (smoke)"
    )
    parser.add_argument("--folder", help="where to write the shards (deleted afterwards)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = smoke.parse(
        parser,
        shards=6,
        shard_rows=256,
        features=16,
        batch_size=32,
        hidden=32,
        steps=60,
        restart_seconds=0.5,
        step_sleep=0.1,  # 60 steps of 6 s: time to be killed mid-way
    )
    args.steps = args.steps or epoch_steps(args)
    work = Path(args.folder or tempfile.mkdtemp(prefix="data-stream-stack-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        figures = run(work, args)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    text = json.dumps(figures, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    checks = ("every_sample_once_per_epoch", "every_step_recorded")
    if not all(figures[c] for c in (*checks, "same_batches_as_uninterrupted")):
        raise SystemExit("the exactly-once check failed")
    if figures["restarts"] < 1:
        raise SystemExit("the job was not restarted: the kill came too late")


if __name__ == "__main__":
    main()
