"""Run every process of a job's topology on this machine, supervised the way the service does.

`launch_local` starts each worker and server shard as a separate OS process (this file run
as a script), talking only through Redis: a server shard that dies is started again (it
continues from its state in Redis); a worker that fails fails the run. Tests
(tests/workers/distributed/) and benchmarks (bench/ps_throughput.py, bench/time_to_accuracy.py)
use it, as `harness.local_cluster`; the service runs processes through its node agents
instead (workers/entry.py).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

# Run as a script (each launched process), this file needs the repository on sys.path.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from contract.rundir import SUMMARY
from dsl.compiler import compile_job
from dsl.plugins import load_plugins
from dsl.schema import JobSpec
from dsl.topology import Topology, resolve_topology
from workers.checkpoint import write_json_atomic
from workers.context import Place, RunContext, worker_dir
from workers.data import TrainingData
from workers.distributed.ps.plan import Connections, PSKeys, clear_ps_keys
from workers.metrics import JsonlSink
from workers.parallel import serve, train


class LaunchError(RuntimeError):
    """A distributed run that could not finish (a worker failed, or it ran out of time)."""


# -- running a topology on this machine ------------------------------------------------------
@dataclass(frozen=True)
class LaunchConfig:
    """Everything a launched process needs, written once as JSON next to the run."""

    spec: dict[str, Any]  # the validated job, as the service stores it for its workers
    topology: dict[str, Any]
    redis_url: str
    scope: str
    run_dir: str
    cache_dir: str
    base_dir: str
    ps_urls: list[str] = field(default_factory=list)
    threads: int = 1
    # Each process on a core of its own (the n-th started on core pin_from + n), for figures
    # on a machine with the cores (bench/time_to_accuracy.py --scale, ps_throughput.py --pin).
    pin_from: int | None = None


@dataclass
class LocalRun:
    summary: dict[str, Any]  # worker 0's summary.json
    workers: dict[tuple[int, int], dict[str, Any]]  # (group, rank) -> that worker's summary
    restarts: int
    seconds: float


Role = tuple[str, int, int]  # ("worker" | "server", group, rank)


class LocalCluster:
    """The processes of one topology on this machine, supervised like the service does."""

    def __init__(self, config: LaunchConfig, *, max_restarts: int = 3) -> None:
        self.config = config
        self.topology = Topology.from_dict(config.topology)
        self.run_dir = Path(config.run_dir)
        self.max_restarts = max_restarts
        self.restarts = 0
        self.processes: dict[Role, subprocess.Popen[bytes]] = {}
        self._config_path = self.run_dir / "launch.json"

    @property
    def roles(self) -> list[Role]:
        t = self.topology
        servers = [
            ("server", sg, s)
            for sg in range(t.nserver_groups)
            for s in range(t.nservers_per_group)
            if t.server_worker_separate
        ]
        workers = [
            ("worker", g, r) for g in range(t.nworker_groups) for r in range(t.nworkers_per_group)
        ]
        return servers + workers

    def start(self, roles: Sequence[Role] | None = None) -> None:
        """Start every process of the topology (or only `roles`: a benchmark that drives the
        workers itself starts the servers alone)."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "logs").mkdir(exist_ok=True)
        self._config_path.write_text(json.dumps(self.config.__dict__))
        for role in self.roles if roles is None else roles:
            self._spawn(role)
        if self.config.pin_from is not None:
            cores = sorted(os.sched_getaffinity(0))
            for n, process in enumerate(self.processes.values(), start=self.config.pin_from):
                os.sched_setaffinity(process.pid, {cores[n % len(cores)]})

    def _spawn(self, role: Role) -> None:
        kind, group, rank = role
        log = (self.run_dir / "logs" / f"{kind}-g{group}r{rank}.log").open("ab")
        self.processes[role] = subprocess.Popen(
            [
                sys.executable,
                str(Path(__file__).resolve()),
                str(self._config_path),
                kind,
                str(group),
                str(rank),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=self.config.base_dir,
        )
        log.close()

    def kill(self, role: Role, sig: int = signal.SIGKILL) -> None:
        os.kill(self.processes[role].pid, sig)

    def stop(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                process.kill()
        for process in self.processes.values():
            process.wait()

    def join_servers(self, timeout: float = 60.0) -> None:
        """For a benchmark that drives the workers itself (start(servers) only): wait for the
        processes it started to end, once its clients have finished; exit naming one that
        failed."""
        for role, process in self.processes.items():
            process.wait(timeout=timeout)
            if process.returncode:
                raise SystemExit(f"{role} exited with {process.returncode}")

    def _log_tail(self, role: Role, lines: int = 30) -> str:
        kind, group, rank = role
        path = self.run_dir / "logs" / f"{kind}-g{group}r{rank}.log"
        text = path.read_text(errors="replace") if path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def wait(self, timeout: float = 600.0) -> LocalRun:
        """Supervise until every worker finished; start dead shards again."""
        started = time.monotonic()
        try:
            while True:
                if time.monotonic() - started > timeout:
                    raise LaunchError(f"the run did not finish within {timeout:.0f} s")
                workers_running = False
                for role, process in list(self.processes.items()):
                    code = process.poll()
                    if role[0] == "worker":
                        if code is None:
                            workers_running = True
                        elif code != 0:
                            raise LaunchError(
                                f"worker {role[1]}/{role[2]} exited with {code}:\n"
                                + self._log_tail(role)
                            )
                    elif code not in (None, 0):
                        if self.restarts >= self.max_restarts:
                            raise LaunchError(
                                f"server {role[1]}/{role[2]} died {self.restarts + 1} times:\n"
                                + self._log_tail(role)
                            )
                        self.restarts += 1
                        self._spawn(role)
                if not workers_running:
                    break
                time.sleep(0.1)
            for role, process in self.processes.items():
                if role[0] == "server":
                    process.wait(timeout=max(5.0, timeout - (time.monotonic() - started)))
        finally:
            self.stop()
        run_dir = self.run_dir
        return LocalRun(
            summary=json.loads((run_dir / SUMMARY).read_text()),
            workers={
                (g, r): json.loads((worker_dir(run_dir, g, r) / SUMMARY).read_text())
                for kind, g, r in self.roles
                if kind == "worker"
            },
            restarts=self.restarts,
            seconds=time.monotonic() - started,
        )


def prepare_launch(
    job_yaml: str | Path,
    topology: Topology | None,
    redis_url: str,
    run_dir: Path,
    *,
    cache_dir: Path,
    overrides: Mapping[str, Any] | None = None,
    ps_urls: Sequence[str] = (),
    scope: str | None = None,
) -> LaunchConfig:
    """Validate the job and describe its local launch (`topology` default: the job's own).

    `job_yaml` is a path or the YAML text; the run's Redis keys live under `scope` (default a
    fresh one).
    """
    text = Path(job_yaml).read_text() if isinstance(job_yaml, Path) else job_yaml
    base_dir = job_yaml.parent if isinstance(job_yaml, Path) else Path.cwd()
    # Generated data is made once here rather than by every process at the same time.
    data = TrainingData(cache_dir=cache_dir, base_dir=base_dir)
    spec = compile_job(text, data, overrides=overrides).spec
    topology = topology or resolve_topology(spec.cluster, spec.pipeline)
    return LaunchConfig(
        spec=spec.model_dump(mode="json", exclude_unset=True),
        topology=topology.to_dict(),
        redis_url=redis_url,
        scope=scope or f"local:{uuid.uuid4().hex[:12]}",
        run_dir=str(run_dir),
        cache_dir=str(cache_dir),
        base_dir=str(base_dir),
        ps_urls=list(ps_urls),
    )


def launch_local(
    job_yaml: str | Path,
    topology: Topology | None,
    redis_url: str,
    run_dir: Path,
    *,
    cache_dir: Path,
    overrides: Mapping[str, Any] | None = None,
    ps_urls: Sequence[str] = (),
    timeout: float = 600.0,
    keep_keys: bool = False,
    pin_from: int | None = None,
) -> LocalRun:
    """Run every process of `topology` (default: the job's own) here and wait for the end.

    The run's parameter-server keys are deleted at the end unless `keep_keys`.
    """
    config = prepare_launch(
        job_yaml,
        topology,
        redis_url,
        run_dir,
        cache_dir=cache_dir,
        overrides=overrides,
        ps_urls=ps_urls,
    )
    config = replace(config, pin_from=pin_from)
    cluster = LocalCluster(config)
    cluster.start()
    try:
        return cluster.wait(timeout)
    finally:
        if not keep_keys:
            connections = Connections(redis_url, ps_urls)
            clear_ps_keys(connections, PSKeys(config.scope))
            connections.close()


def _run_process(config: LaunchConfig, kind: str, group: int, rank: int) -> int:
    import torch

    torch.set_num_threads(config.threads)
    spec = JobSpec.model_validate(config.spec)
    place = Place(
        topology=Topology.from_dict(config.topology),
        group=group,
        rank=rank,
        redis_url=config.redis_url,
        ps_urls=config.ps_urls,
        scope=config.scope,
    )
    if kind == "server":
        report = serve(spec, place)
        logging.getLogger(__name__).info("server %d/%d done: %s", group, rank, report)
        return 0
    data = TrainingData(cache_dir=Path(config.cache_dir), base_dir=Path(config.base_dir))
    run_dir = Path(config.run_dir)
    own_dir = worker_dir(run_dir, group, rank)
    sink = JsonlSink(own_dir)
    context = RunContext(
        **vars(place),
        job=compile_job(spec, data),
        dataset=data.dataset,
        run_dir=run_dir,
        sinks=[sink],
        base_dir=Path(config.base_dir),
    )
    try:
        summary = train(context)
    finally:
        sink.close()
    write_json_atomic(own_dir / SUMMARY, summary.to_json())
    return 0 if summary.status == "succeeded" else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="harness/local_cluster.py",
        description="Run one process of a local distributed launch (see launch_local).",
    )
    parser.add_argument("config", type=Path, help="launch.json written by LocalCluster")
    parser.add_argument("role", choices=["worker", "server"])
    parser.add_argument("group", type=int)
    parser.add_argument("rank", type=int)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    load_plugins()  # as every process of the platform does (TRAINYARD_PLUGINS, entry points)
    config = LaunchConfig(**json.loads(args.config.read_text()))
    return _run_process(config, args.role, args.group, args.rank)


if __name__ == "__main__":
    sys.exit(main())
