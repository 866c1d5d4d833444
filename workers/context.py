"""What one process of a job needs to run its part: one value instead of long argument chains.

The node agent's worker (workers/entry.py) and the local launcher of tests and benchmarks
(harness/local_cluster.py) build a `RunContext` for a worker, which workers/parallel.py reads to
apply the job's parallelism and train, or a `Place` for a parameter-server shard, which serves
from the job's spec alone (it builds no net and loads no data).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from contract.rundir import WORKERS
from dsl.compiler import CompiledJob
from dsl.schema import JobSpec
from dsl.topology import Topology
from workers.data import Dataset
from workers.metrics import MetricSink
from workers.trainer import TrainOptions


def worker_dir(run_dir: Path, group: int, rank: int) -> Path:
    """Where worker (group, rank) of a distributed run writes metrics.jsonl and summary.json;
    worker 0 of group 0 writes the run directory itself."""
    return run_dir / WORKERS / f"g{group}r{rank}"


@dataclass(frozen=True, kw_only=True)
class Place:
    """Where one process of a job stands and how it reaches the others: all a parameter-server
    shard needs besides the job's spec."""

    topology: Topology
    # Worker `rank` of worker group `group`, or shard `rank` of server group `group`.
    group: int = 0
    rank: int = 0
    # The job's Redis, the parameter-server shards' Redis servers, and the scope every key of
    # the job lives under.
    redis_url: str = ""
    ps_urls: Sequence[str] = ()
    scope: str = ""
    should_stop: Callable[[], bool] = lambda: False


@dataclass(frozen=True, kw_only=True)
class RunContext(Place):
    """What a training worker needs: its place, the compiled job and its data, where it
    writes and what it reports to."""

    job: CompiledJob
    dataset: Dataset
    run_dir: Path  # the job's run directory (checkpoints, worker 0's summary)
    device: str = "cpu"
    sinks: Sequence[MetricSink] = ()
    base_dir: Path = field(default_factory=Path.cwd)  # relative paths of the job (init_from)
    resume: bool = False
    drain: Callable[[], bool] = lambda: False
    resume_from: Path | None = None  # the service's restart point for this attempt
    restart_seconds: float = 0.0
    start_step: int = 0  # an asynchronous worker restarted alone
    replacement: int = 0  # the processes that held this place before (AllocationInfo's)
    attempt: int = 0  # the service's placement of the job this process belongs to

    @property
    def spec(self) -> JobSpec:
        return self.job.spec

    def train_options(self, *, rank: int | None = None, world: int = 1) -> TrainOptions:
        """The trainer's options: it reads part `rank` (default: the worker's rank) of `world`
        of every batch; its metrics carry the worker's group and rank in the group."""
        return TrainOptions(
            run_dir=self.run_dir,
            device=self.device,
            resume=self.resume,
            rank=self.rank if rank is None else rank,
            world=world,
            group=self.group,
            group_rank=self.rank,
            base_dir=self.base_dir,
            should_stop=self.should_stop,
            drain=self.drain,
            resume_from=self.resume_from,
            restart_seconds=self.restart_seconds,
            start_step=self.start_step,
        )
