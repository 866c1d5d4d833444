"""The worker process: trains one allocation of a job (`python -m workers.entry`), or scores
one shard of a prediction run (workers/prediction.py).

The node agent starts it in its own process group and supervises it. With `--fork-server FD` the
process imports torch and the trainer once and then forks a process per allocation the agent
asks for over the socket FD (workers/fork_server.py), so a job starts without paying for the
imports (seconds on a small machine).

Exit codes: 0 trained to the end, 1 failed, 2 the job cannot run here, 3 cancelled, 4 drained
(SIGTERM: it stopped, saving a restart point when it could, to continue elsewhere), 5 the loss
diverged, 6 past its memory limit (contract/allocation.py's ExitCode). What the
process prints (stderr) is the agent's reason when it fails.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import redis

from contract.allocation import CGROUP, AllocationInfo, ExitCode, stop_requested
from contract.codec import decode
from contract.keys import Keys
from contract.settings import Settings
from contract.stream import JobStream
from dsl.plugins import PluginError, load_plugins
from dsl.run_kinds import RUN_KINDS
from workers.confine import confine, out_of_memory
from workers.fork_server import serve
from workers.metrics import RedisSink

if TYPE_CHECKING:
    from dsl.schema import JobSpec
    from workers.context import Place, RunContext
    from workers.metrics import MetricSink
    from workers.trainer import Summary


class StopPoll:
    """The trainer's `should_stop`: asks Redis at most every `every` seconds. SIGTERM (the node
    agent draining its node) stops the run too, as a drain: the trainer saves a restart point."""

    def __init__(
        self, client: redis.Redis, keys: Keys, info: AllocationInfo, every: float = 0.1
    ) -> None:
        self.client, self.keys, self.info, self.every = client, keys, info, every
        self.last = -float("inf")
        self.stopped = False
        self.draining = False

    def on_sigterm(self, signum: int, frame: object) -> None:
        self.draining = True

    def __call__(self) -> bool:
        if self.draining:
            return True
        now = time.monotonic()
        if not self.stopped and now - self.last >= self.every:
            self.last = now
            self.stopped = stop_requested(
                self.client, self.keys, self.info.job_id, self.info.allocation_id
            )
        return self.stopped


class StderrLog:
    """Echoes the trainer's log lines to stderr, where the agent looks for failure reasons."""

    def emit(self, record: object) -> None:
        return None

    def log(self, line: str) -> None:
        try:
            print(line, file=sys.stderr, flush=True)
        except BrokenPipeError:
            # The node agent died. The process trains on, unsupervised, until the scheduler
            # gives its allocation up or the restarted agent stops it; its output is lost.
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            os.dup2(devnull, sys.stderr.fileno())
            os.close(devnull)

    def checkpoint(self, step: int, path: Path, *, best: bool = False) -> None:
        return None

    def close(self) -> None:
        return None


def warm_up() -> None:
    """Import what training needs, before an allocation arrives (in the fork server)."""
    import sklearn.datasets  # noqa: F401  (the digits source imports it lazily: ~1 s)
    import torch
    import torch.utils.tensorboard  # the TensorBoard sink's writer, else imported per job

    import workers.parallel  # noqa: F401  (the trainer, the data sources, the frameworks)

    # One thread, so that no OpenMP thread pool exists yet when the server forks: a pool does
    # not survive a fork. Each forked process sets its own count (train()).
    torch.set_num_threads(1)

    # torch imports more on first use: the first optimizer pulls in torch._dynamo (seconds),
    # the first backward pass starts autograd's machinery. Pay for both now.
    param = torch.zeros(1, requires_grad=True)
    optimizer = torch.optim.SGD([param], lr=0.1)
    (param * 2.0).sum().backward()
    optimizer.step()


def _no_cuda_yet() -> None:
    """A CUDA context does not survive a fork: the fork server must never start one."""
    import torch

    if torch.cuda.is_initialized():
        raise RuntimeError("the fork server started CUDA: its forked workers could not use it")


def train(
    info: AllocationInfo,
    client: redis.Redis,
    keys: Keys,
    cache_dir: Path,
    *,
    redis_url: str,
    ps_urls: list[str],
    confined: str = "",
) -> int:
    import torch

    from dsl.compiler import compile_job
    from dsl.errors import JobSpecError
    from dsl.schema import JobSpec
    from dsl.topology import Topology
    from workers.checkpoint import CheckpointWriteError
    from workers.context import Place, RunContext
    from workers.data import TrainingData

    torch.set_num_threads(max(info.slots, 1))
    should_stop = StopPoll(client, keys, info)
    signal.signal(signal.SIGTERM, should_stop.on_sigterm)
    if RUN_KINDS.get(info.kind).scores_rows:  # a prediction run's worker scores its shard
        from workers.prediction import predict_shard

        stream = JobStream(client, keys, info.job_id, info.attempt)
        code = predict_shard(info, stream, should_stop)
        return ExitCode.DRAINED if should_stop.draining and code != ExitCode.OK else code
    # The service checked the job at submission: its execution spec is used as it is.
    spec = JobSpec.model_validate(info.spec)
    place = Place(
        topology=Topology.from_dict(info.topology),
        group=info.group,
        rank=info.rank,
        redis_url=redis_url,
        ps_urls=ps_urls,
        scope=keys.job_scope(info.job_id),
        should_stop=should_stop,
    )
    if info.role == "server":
        code = _serve(spec, place)
        return ExitCode.DRAINED if should_stop.draining else code
    data = TrainingData(cache_dir=cache_dir)
    try:
        job = compile_job(spec, data, filename=f"job {info.job_id}")
    except JobSpecError as exc:
        print(f"the job cannot be built here: {exc}", file=sys.stderr)
        return ExitCode.INVALID
    context = RunContext(
        **vars(place),  # the same place, with what a worker needs besides
        job=job,
        dataset=data.dataset,
        run_dir=info.run_dir,
        # Its own GPUs only are visible (workers/confine.py): the first is cuda:0.
        device="cuda:0" if info.gpus and torch.cuda.is_available() else "cpu",
        drain=lambda: should_stop.draining,
        resume_from=Path(info.resume_from) if info.resume_from else None,
        restart_seconds=info.restart_seconds,
        start_step=info.start_step,
        replacement=info.replacement,
        attempt=info.attempt,
    )
    try:
        summary = _train(context, JobStream(client, keys, info.job_id, info.attempt), confined)
    except CheckpointWriteError as exc:  # disk full, no permission: the reason, no traceback
        print(str(exc), file=sys.stderr)
        return ExitCode.FAILED
    if summary.status == "succeeded":
        return ExitCode.OK
    if summary.status == "drained":
        return ExitCode.DRAINED
    if summary.status == "cancelled":
        return ExitCode.CANCELLED
    print(f"training {summary.status} at step {summary.steps}", file=sys.stderr)
    return ExitCode.DIVERGED if summary.status == "diverged" else ExitCode.FAILED


def _train(context: RunContext, stream: JobStream, confined: str = "") -> Summary:
    """Train this allocation's worker: rank 0 of group 0 writes the job's run directory, the
    other workers of a distributed topology their own."""
    from contract.rundir import CHECKPOINTS, list_checkpoints
    from dsl.flatten import job_parameters
    from dsl.frameworks import FRAMEWORK_SPECS
    from workers import environment
    from workers.context import worker_dir
    from workers.metrics import JsonlSink, TensorBoardSink
    from workers.parallel import train

    lead = context.group == 0 and context.rank == 0
    run_dir = context.run_dir if lead else worker_dir(context.run_dir, context.group, context.rank)
    # A local job whose run directory already holds a checkpoint continues from it (a sweep's
    # population-based training hands a member the checkpoint it goes on from this way); a
    # restart point named by the service (context.resume_from) comes first.
    framework = FRAMEWORK_SPECS.get(context.topology.framework)
    local = framework.in_one_process and context.resume_from is None
    resume = local and bool(list_checkpoints(context.run_dir / CHECKPOINTS))
    jsonl = JsonlSink(run_dir)
    tensorboard = TensorBoardSink(run_dir, job_parameters(context.spec))
    sinks: list[MetricSink] = [
        RedisSink(stream, group=context.group, rank=context.rank, training_lines=lead),
        jsonl,
        tensorboard,
        StderrLog(),
    ]
    if confined:  # the job's log says what this process was given
        for sink in sinks:
            sink.log(f"worker {context.group}/{context.rank}: {confined}")
    found = environment.collect(group=context.group, rank=context.rank, device=context.device)
    for sink in sinks:
        sink.emit(found)
    try:
        return train(replace(context, run_dir=run_dir, sinks=sinks, resume=resume))
    finally:
        jsonl.close()
        tensorboard.close()


def _serve(spec: JobSpec, place: Place) -> int:
    """A parameter-server shard: serves until the workers of its group finish."""
    from workers.parallel import serve

    serve(spec, place)
    return ExitCode.CANCELLED if place.should_stop() else ExitCode.OK


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m workers.entry", description=__doc__)
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--allocation", type=int, help="the allocation id to run")
    which.add_argument(
        "--fork-server",
        type=int,
        metavar="FD",
        help="import first, then fork a process per allocation asked for over the socket FD",
    )
    parser.add_argument(
        "--redis-url",
        help="default REDIS_URL from the environment (kept off the command line); a fork "
        "server's processes log in with the URL each request brings",
    )
    parser.add_argument("--prefix", default="trainyard", help="prefix of the Redis keys")
    parser.add_argument(
        "--cache-dir", type=Path, required=True, help="where generated datasets are cached"
    )
    parser.add_argument(
        "--ps-urls",
        help="comma-separated Redis URLs of parameter-server shards; default REDIS_PS_URLS",
    )
    args = parser.parse_args(argv)
    if args.redis_url is None or args.ps_urls is None:
        settings = Settings()
        if args.redis_url is None:
            args.redis_url = settings.redis_url or ""
            if not args.redis_url and args.fork_server is None:
                parser.error("no Redis: pass --redis-url or set REDIS_URL")
        if args.ps_urls is None:
            args.ps_urls = settings.redis_ps_urls or ""
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        # Before the fork server warms up: the processes it forks have them loaded.
        load_plugins()
    except PluginError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return ExitCode.INVALID
    if args.fork_server is None:
        return run_allocation(args, args.allocation)
    warm_up()
    _no_cuda_yet()
    with socket.socket(fileno=args.fork_server) as channel:
        serve(channel, lambda *request: run_allocation(args, *request))
    return ExitCode.OK


def run_allocation(
    args: argparse.Namespace, allocation_id: int, redis_url: str = "", ps_urls: str = ""
) -> int:
    """Train one allocation, logged in to Redis with `redis_url` and the parameter-server Redis
    servers with `ps_urls` (its job's own user, from the fork server's request), else
    --redis-url / REDIS_URL and --ps-urls / REDIS_PS_URLS."""
    redis_url = redis_url or args.redis_url
    ps_urls = ps_urls or args.ps_urls
    if not redis_url:
        print(f"allocation {allocation_id}: no Redis URL to log in with", file=sys.stderr)
        return ExitCode.INVALID
    client = redis.Redis.from_url(redis_url)
    keys = Keys(args.prefix)
    fields = decode(client.hgetall(keys.allocation(allocation_id)))
    if not fields:
        print(f"allocation {allocation_id} is not in Redis", file=sys.stderr)
        return ExitCode.INVALID
    info = AllocationInfo.from_hash(allocation_id, fields)
    try:
        confined = confine(info, fields.get(CGROUP, ""))
    except OSError as exc:  # never run past the limits it was given
        print(f"cannot apply its memory limit or GPUs: {exc}", file=sys.stderr)
        return ExitCode.FAILED
    shards = [url for url in ps_urls.split(",") if url] or [redis_url]
    try:
        return train(
            info,
            client,
            keys,
            args.cache_dir,
            redis_url=redis_url,
            ps_urls=shards,
            confined=confined,
        )
    except (MemoryError, RuntimeError) as exc:
        if not out_of_memory(exc):
            raise
        print(f"exceeded its {info.memory_mb} MB limit: {exc}", file=sys.stderr)
        return ExitCode.OUT_OF_MEMORY


def exit_now(code: int) -> None:
    """Exit without Python's teardown: with torch imported it takes about a second of a core,
    and the node's next job waits for it (a slot is free once its process has exited). All
    the run wrote is written by now: records to Redis synchronously, files closed."""
    with contextlib.suppress(OSError, ValueError):  # the agent's end of the pipe closed
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    exit_now(main())
