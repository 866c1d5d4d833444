"""Submit-to-first-step latency on a warm stack, against the same job started without the service.

The bench starts its own stack (`trainyard up` in a temporary data directory: embedded Redis,
SQLite, API, scheduler, one node agent), runs one job to warm it, then submits
examples/digits_mlp.yaml `--runs` times, one after another, with `disp_freq: 1`.

Latency of one submission = the `time` stamp of the job's first `metric` record with
step >= 1 (set by the worker process when it emits that record, read from the job's Redis
stream) minus the moment just before the client sent POST /jobs. It covers the request itself
(the API compiles the document, stores the job and triggers placement before it answers),
queueing, placement, dispatch to the node's Celery queue, the agent handing the allocation to a
worker process, building the net and data, and the first training step. (Until 2026-11-26 the
clock started when POST /jobs had returned, leaving the request's own time out.) Each job ends
before the next is submitted, and the stack gets `--gap` seconds to be idle again (warm: its
fork server has done its imports).

The baseline, measured in the same run and alternating with the service's runs so that load on
the machine falls on both alike: the same document with the same overrides, started the way the
node's fork server starts a worker but without the service. This bench process, warmed as the
fork server is (workers.entry.warm_up), forks a child that validates the execution spec,
compiles the job, loads its data from the same cache and trains with the same local sinks
(metrics.jsonl, TensorBoard, the environment record); the clock runs from the fork to the
child's first metric record with step >= 1. What the service adds on top is the request,
admission, queueing, placement, dispatch over Celery, the agent's claim and the stream.
Target: p50(service) / p50(baseline) <= 2.0, the service adding at most the job's own start
(about a quarter of a second here: docs/performance.md has the figures); both p50s are printed.

    .venv/bin/python bench/submit_latency.py [--runs 20] [--gap 5.0] [--data-dir DIR]

`--gpus 1` submits the jobs with cluster.gpus_per_worker: 1 (a GPU node: bench/gpu_check.sh);
`--data-dir` measures on a stack already running there (its stack.json) instead of starting
one; `--smoke` (2 runs, the target not judged) is what the tests run.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import redis
import smoke  # bench/smoke.py: run as a script, bench/ is on sys.path

from contract.codec import decode
from contract.keys import Keys
from contract.stream import MetricRecord
from dsl.compiler import compile_job
from dsl.flatten import job_parameters
from dsl.schema import JobSpec
from dsl.topology import Topology
from harness.local_cluster import LaunchConfig, prepare_launch
from scheduler.cli.redis_server import free_port
from scheduler.cli.stack import StackFile, read_stack_file
from trainyard import Client
from workers import environment
from workers.context import RunContext
from workers.data import TrainingData
from workers.entry import warm_up
from workers.metrics import JsonlSink, TensorBoardSink
from workers.parallel import train

ROOT = Path(__file__).resolve().parent.parent
JOB = ROOT / "examples" / "digits_mlp.yaml"
OVERRIDES = {"disp_freq": 1, "train_steps": 20, "test.freq": 0, "checkpoint.freq": 0}
TARGET_RATIO = 2.0  # p50 of submit -> first step over p50 of the same job started directly


class FirstStep:
    """The baseline child's sink: writes the time of the first metric record with step >= 1
    to a pipe, once."""

    def __init__(self, fd: int) -> None:
        self.fd: int | None = fd

    def emit(self, record: object) -> None:
        if self.fd is not None and isinstance(record, MetricRecord) and record.step >= 1:
            os.write(self.fd, f"{record.time!r}\n".encode())
            os.close(self.fd)
            self.fd = None

    def log(self, line: str) -> None:
        return None

    def checkpoint(self, step: int, path: Path, *, best: bool = False) -> None:
        return None

    def close(self) -> None:
        return None


def _direct_child(config: LaunchConfig, run_dir: Path, fd: int) -> int:
    """In the forked child: what the worker process does for this job, without the service."""
    spec = JobSpec.model_validate(config.spec)
    data = TrainingData(cache_dir=Path(config.cache_dir), base_dir=Path(config.base_dir))
    job = compile_job(spec, data)
    sinks = [JsonlSink(run_dir), TensorBoardSink(run_dir, job_parameters(spec)), FirstStep(fd)]
    found = environment.collect()
    for sink in sinks:
        sink.emit(found)
    context = RunContext(
        topology=Topology.from_dict(config.topology),
        job=job,
        dataset=data.dataset,
        run_dir=run_dir,
        sinks=sinks,
        base_dir=Path(config.base_dir),
    )
    summary = train(context)
    for sink in sinks:
        sink.close()
    return 0 if summary.status == "succeeded" else 1


def direct(config: LaunchConfig, run_dir: Path) -> float:
    """Fork -> first step of the job started directly (the baseline), in seconds."""
    read_end, write_end = os.pipe()
    started = time.time()
    pid = os.fork()
    if pid == 0:  # the child: never returns into the bench
        os.close(read_end)
        code = 1
        try:
            code = _direct_child(config, run_dir, write_end)
        finally:
            os._exit(code)
    os.close(write_end)
    with os.fdopen(read_end) as pipe:
        line = pipe.readline()
    _, status = os.waitpid(pid, 0)
    if not line or os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"the directly started job failed (exit {status}); see {run_dir}")
    return float(line) - started


def start_stack(data_dir: Path) -> tuple[subprocess.Popen[bytes], StackFile]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TRAINYARD_", "REDIS_"))}
    env.pop("DATABASE_URL", None)
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "scheduler",
            "up",
            "--data-dir",
            str(data_dir),
            "--port",
            str(free_port()),
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        found = read_stack_file(data_dir / "stack.json")
        if found is not None and found.pid == process.pid:
            return process, found
        if process.poll() is not None:
            raise SystemExit(f"trainyard up exited with {process.returncode}; see {data_dir}/logs")
        time.sleep(0.1)
    process.kill()
    raise SystemExit("trainyard up did not start in 120 s")


def stream_times(
    client: redis.Redis, keys: Keys, job_id: int, timeout: float = 60.0
) -> tuple[float, float]:
    """From the job's stream: when its node agent reported the process RUNNING (the agent's
    clock), and when the worker emitted the first metric record with step >= 1."""
    stream, last = keys.job_stream(job_id), "0-0"
    running = float("nan")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for _, records in client.xread({stream: last}, block=1000, count=100) or []:
            for record_id, raw in records:
                last = record_id
                fields = decode(raw)
                if fields.get("kind") == "state" and fields.get("state") == "RUNNING":
                    running = float(fields["time"])
                if fields.get("kind") == "metric" and int(fields["step"]) >= 1:
                    return running, float(fields["time"])
    raise SystemExit(f"job {job_id} reported no step within {timeout} s")


def measure(
    api: Client, broker: redis.Redis, keys: Keys, gpus: int = 0
) -> tuple[float, float, float]:
    """(submit -> first step, of which submit -> the agent starting the process, of which
    the POST itself) in seconds; the clock starts before the request is sent."""
    sent = time.time()
    overrides = {**OVERRIDES, "cluster.resources.gpus_per_worker": gpus} if gpus else OVERRIDES
    job = api.submit(JOB, overrides=overrides)
    returned = time.time()
    running, first = stream_times(broker, keys, job.id)
    job.wait(timeout=120, poll=0.1)
    if job.state != "SUCCEEDED":
        raise SystemExit(f"job {job.id} ended {job.state}: {job.error}")
    return first - sent, running - sent, returned - sent


def run(
    found: StackFile, args: argparse.Namespace, scratch: Path
) -> tuple[list[float], list[float]]:
    """(the service's latencies, the baseline's), alternating run by run."""
    broker = redis.Redis.from_url(found.redis_url)
    keys = Keys()
    config = prepare_launch(
        JOB, None, "", scratch / "prepare", cache_dir=scratch / "cache", overrides=OVERRIDES
    )
    warm_up()  # this process is the baseline's fork server
    with Client(found.url, found.token) as api:
        measure(api, broker, keys, args.gpus)  # warm-up: data caches, first imports
        direct(config, scratch / "direct-warm-up")
        latencies, baseline = [], []
        for i in range(args.runs):
            time.sleep(args.gap)
            total, dispatch, post = measure(api, broker, keys, args.gpus)
            time.sleep(args.gap)
            alone = direct(config, scratch / f"direct-{i}")
            latencies.append(total)
            baseline.append(alone)
            if not args.json:
                print(
                    f"run {i + 1:2d}: {total * 1000:7.1f} ms  (POST answered after "
                    f"{post * 1000:6.1f} ms, placed and handed to a process after "
                    f"{dispatch * 1000:6.1f} ms); started directly {alone * 1000:7.1f} ms"
                )
    return latencies, baseline


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--gap", type=float, default=5.0, help="idle seconds between jobs")
    parser.add_argument("--json", action="store_true", help="print one JSON line")
    parser.add_argument("--data-dir", type=Path, help="a running stack's data directory")
    parser.add_argument("--gpus", type=int, default=0, help="cluster.gpus_per_worker of the jobs")
    args = smoke.parse(parser, runs=2, gap=0.5)

    with tempfile.TemporaryDirectory(prefix="trainyard-bench-") as tmp:
        process = None
        if args.data_dir is not None:
            found = read_stack_file(args.data_dir / "stack.json")
            if found is None:
                raise SystemExit(f"no running stack in {args.data_dir} (no stack.json)")
        else:
            process, found = start_stack(Path(tmp) / "data")
        try:
            latencies, baseline = run(found, args, Path(tmp))
        finally:
            if process is not None:
                process.send_signal(signal.SIGTERM)
                process.wait(timeout=60)
    p50 = statistics.median(latencies)
    p90 = statistics.quantiles(latencies, n=10, method="inclusive")[-1]
    base50 = statistics.median(baseline)
    ratio = p50 / base50
    result = {
        "runs": args.runs,
        "p50_s": round(p50, 4),
        "p90_s": round(p90, 4),
        "min_s": round(min(latencies), 4),
        "max_s": round(max(latencies), 4),
        "direct_p50_s": round(base50, 4),
        "direct_min_s": round(min(baseline), 4),
        "direct_max_s": round(max(baseline), 4),
        "ratio": round(ratio, 3),
        "target_ratio": TARGET_RATIO,
        "pass": ratio <= TARGET_RATIO,
    }
    if args.json:
        print(json.dumps(result))
    else:
        verdict = "PASS" if result["pass"] else "FAIL"
        print(
            f"submit -> first step over {args.runs} runs: p50 {p50:.3f} s  p90 {p90:.3f} s  "
            f"(min {min(latencies):.3f}, max {max(latencies):.3f}); the same job started "
            f"directly: p50 {base50:.3f} s (min {min(baseline):.3f}, max {max(baseline):.3f}); "
            f"ratio {ratio:.2f}, target <= {TARGET_RATIO}: {verdict}"
        )
    if args.smoke:
        print("smoke run: sizes too small for a figure; the target is not judged")
    elif not result["pass"]:
        sys.exit(1)


if __name__ == "__main__":
    main()
