"""The frameworks: one descriptor each, which every reader derives its answer from.

A framework is a preset topology (SINGA's worker and server groups) and a way for the replicas
of the net to agree. The job language's choices (dsl/schema.py), the presets and the topology's
rules (dsl/topology.py), how a worker applies it (workers/parallel.py) and how the service
restarts its processes (scheduler/recovery/policy.py) all read `FRAMEWORK_SPECS`; no reader
compares a framework's name. A new framework is a descriptor here and its function in
workers/parallel.py's `FRAMEWORKS`. A framework is how a training run's replicas agree; what a
job's processes do (train, or score a dataset) is its run kind (dsl/run_kinds.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Literal

from dsl.registry import Registry


class Sync(Enum):
    """How the replicas of the net agree."""

    NONE = "none"  # one replica, in one process
    GROUP = "group"  # by collectives among the workers of one group, and never through shards
    SERVERS = "servers"  # through parameter-server shards, every worker on its own
    GROUP_THEN_SERVERS = "group, then servers"  # all-reduce in each group; groups through shards


@dataclass(frozen=True, kw_only=True)
class Preset:
    """The topology a framework runs when the cluster section names nothing else."""

    nworker_groups: int
    nworkers_per_group: int
    nserver_groups: int = 0
    nservers_per_group: int = 0
    server_worker_separate: bool = False


@dataclass(frozen=True, kw_only=True)
class FrameworkSpec:
    name: str
    doc: str  # how the updates go, one line (docs/distributed.md's table of the frameworks)
    preset: Preset
    sync: Sync
    # Whether the preset's replicas take each step together (asynchronous groups run apart).
    synchronous: bool = True
    # What the service restarts after a worker fails: the whole job from a restart point
    # ("gang"), or that worker alone from its last step ("alone").
    restart: Literal["gang", "alone"] = "gang"
    # GPUs one worker process drives (each worker sees its own as cuda:0, cuda:1, ...): a job
    # asking more of a framework is refused, as the rest would sit idle.
    devices_per_worker: int = 1
    # Its one worker group all-reduces the gradients through DistributedDataParallel, whose
    # communication hooks it can take (cluster.compression powersgd: dsl/sync_checks.py).
    ddp_gradients: bool = False
    # Its replicas train apart and average their parameters every sync_freq steps, on DDP's
    # post-local SGD hook (workers/distributed/localsgd.py): dsl/sync_checks.py holds a job
    # to what that hook can do.
    averages_locally: bool = False

    def __post_init__(self) -> None:
        # A worker restarted alone takes the current parameters from the shards, and only
        # asynchronous peers go on without it meanwhile.
        if self.restart == "alone" and (self.synchronous or not self.needs_servers):
            raise ValueError(
                f"framework {self.name}: only an asynchronous framework whose workers sync "
                "through server shards can restart a worker alone"
            )

    @property
    def in_one_process(self) -> bool:
        """One replica: nothing to synchronise, nothing for the service to place but it."""
        return self.sync is Sync.NONE

    @property
    def needs_servers(self) -> bool:
        """Whether every topology of it exchanges updates through server shards."""
        return self.sync is Sync.SERVERS

    @property
    def pushers_per_group(self) -> int | None:
        """Workers per group that push gradients to the shards: a group that all-reduces first
        pushes its mean once, as one replica; None: every worker pushes."""
        return 1 if self.sync is Sync.GROUP_THEN_SERVERS else None


FRAMEWORK_SPECS: Registry[FrameworkSpec] = Registry("framework")


def register_framework(spec: FrameworkSpec) -> FrameworkSpec:
    return FRAMEWORK_SPECS.register(spec.name)(spec)


def restarting_alone() -> list[str]:
    """The frameworks whose failed workers restart alone."""
    return [name for name, spec in FRAMEWORK_SPECS.items() if spec.restart == "alone"]


# In the order the job language lists them (its JSON Schema's enum, its error messages).
register_framework(
    FrameworkSpec(
        name="local",
        doc="in the process",
        preset=Preset(nworker_groups=1, nworkers_per_group=1),
        sync=Sync.NONE,
    )
)
register_framework(
    FrameworkSpec(
        name="sandblaster",
        doc="synchronous: one averaged update per step",
        preset=Preset(
            nworker_groups=1,
            nworkers_per_group=2,
            nserver_groups=1,
            nservers_per_group=1,
            server_worker_separate=True,
        ),
        sync=Sync.SERVERS,
    )
)
register_framework(
    FrameworkSpec(
        name="allreduce",
        doc="synchronous: all-reduce of the gradients (torch.distributed)",
        preset=Preset(nworker_groups=1, nworkers_per_group=2),
        sync=Sync.GROUP_THEN_SERVERS,
        ddp_gradients=True,
    )
)
register_framework(
    FrameworkSpec(
        name="downpour",
        doc="asynchronous between groups, one shared copy",
        preset=Preset(
            nworker_groups=2,
            nworkers_per_group=1,
            nserver_groups=1,
            nservers_per_group=1,
            server_worker_separate=True,
        ),
        sync=Sync.SERVERS,
        synchronous=False,
        restart="alone",
    )
)
register_framework(
    FrameworkSpec(
        name="hogwild",
        doc="each group its own copy; copies averaged every sync_freq",
        preset=Preset(
            nworker_groups=2,
            nworkers_per_group=1,
            nserver_groups=2,
            nservers_per_group=1,
            server_worker_separate=True,
        ),
        sync=Sync.SERVERS,
        synchronous=False,
        restart="alone",
    )
)
register_framework(
    FrameworkSpec(
        name="localsgd",
        doc="synchronous steps apart: local updates, replicas averaged every sync_freq",
        preset=Preset(nworker_groups=1, nworkers_per_group=2),
        sync=Sync.GROUP,
        averages_locally=True,
    )
)
