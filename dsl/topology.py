"""Resolve a job's cluster section into a concrete topology (SINGA's worker and server groups).

Each framework's descriptor (dsl/frameworks.py) gives its preset; explicit fields override it,
and its way of syncing the replicas says which topologies make sense.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from dsl.frameworks import FRAMEWORK_SPECS, Sync
from dsl.schema import ClusterConfig, PipelineConfig


@dataclass(frozen=True)
class Topology:
    framework: str
    nworker_groups: int
    nworkers_per_group: int
    nserver_groups: int
    nservers_per_group: int
    server_worker_separate: bool
    slots_per_worker: int
    gpus_per_worker: int
    # Pipeline stages per worker group: a pipelined job's groups are its pipelines (replicas)
    # and the workers of a group its stages; 1 when the job has no pipeline.
    stages: int = 1
    # cluster.resources.memory_mb: each worker's memory limit (0: its slots' share of a node's).
    memory_mb: int = 0

    @property
    def workers(self) -> int:
        return self.nworker_groups * self.nworkers_per_group

    @property
    def servers(self) -> int:
        """Server shard processes to place (co-located servers run inside the workers)."""
        if not self.server_worker_separate:
            return 0
        return self.nserver_groups * self.nservers_per_group

    def to_dict(self) -> dict[str, object]:
        return {**asdict(self), "workers": self.workers, "servers": self.servers}

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> Topology:
        """The topology `to_dict` wrote (its derived counts are left out), or stored JSON."""
        return cls(**{f.name: raw[f.name] for f in fields(cls) if f.name in raw})


def resolve_topology(cluster: ClusterConfig, pipeline: PipelineConfig | None = None) -> Topology:
    """The job's topology; with a `pipeline`, each worker group is one pipeline of its stages."""
    framework = FRAMEWORK_SPECS.get(cluster.framework)
    preset = framework.preset
    stages = pipeline.count if pipeline is not None else 1
    if pipeline is not None:
        if framework.needs_servers and not framework.synchronous:
            # Asynchronous pipelines (replicas through the shards): the framework's replicas,
            # and a shard per stage, since each shard holds the layers of one stage.
            preset = replace(preset, nworkers_per_group=stages, nservers_per_group=stages)
        else:
            preset = replace(preset, nworker_groups=1, nworkers_per_group=stages)
        # Replicas of a pipeline exchange updates by all-reduce between their stages, never
        # through shards unless the framework is a parameter-server one.
        if not framework.needs_servers:
            preset = replace(
                preset, nserver_groups=0, nservers_per_group=0, server_worker_separate=False
            )

    def pick(value: int | bool | None, default: int | bool) -> int | bool:
        return default if value is None else value

    return Topology(
        framework=cluster.framework,
        nworker_groups=int(pick(cluster.nworker_groups, preset.nworker_groups)),
        nworkers_per_group=int(pick(cluster.nworkers_per_group, preset.nworkers_per_group)),
        nserver_groups=int(pick(cluster.nserver_groups, preset.nserver_groups)),
        nservers_per_group=int(pick(cluster.nservers_per_group, preset.nservers_per_group)),
        server_worker_separate=bool(
            pick(cluster.server_worker_separate, preset.server_worker_separate)
        ),
        slots_per_worker=cluster.resources.slots_per_worker,
        gpus_per_worker=cluster.resources.gpus_per_worker,
        stages=stages,
        memory_mb=cluster.resources.memory_mb or 0,
    )


def _device_problems(t: Topology) -> list[tuple[str, str, str]]:
    """A worker gets GPUs of its own, as many as its framework drives."""
    most = FRAMEWORK_SPECS.get(t.framework).devices_per_worker
    if t.gpus_per_worker <= most:
        return []
    return [
        (
            "resources.gpus_per_worker",
            f"cluster.resources.gpus_per_worker is {t.gpus_per_worker}, and a worker of "
            f"framework {t.framework} uses {most} GPU: the others would sit idle, held from "
            "other jobs",
            f"use gpus_per_worker: {most} with more workers (nworkers_per_group) instead",
        )
    ]


def topology_problems(topology: Topology) -> list[tuple[str, str, str]]:
    """Why a resolved topology cannot run, as (key below `cluster`, dotted; message; hint):
    checked when a job is validated, so that a job that could never run is refused at
    submission."""
    t = topology
    sync = FRAMEWORK_SPECS.get(t.framework).sync
    devices = _device_problems(t)
    if t.stages > 1:
        return devices + _pipeline_problems(t, sync)
    problems: list[tuple[str, str, str]] = devices
    if sync is Sync.NONE and (t.workers != 1 or t.servers):
        problems.append(
            (
                "framework",
                f"framework {t.framework} trains in one process, and the cluster section asks for "
                f"{t.workers} worker(s) and {t.servers} server shard(s)",
                "use framework sandblaster or allreduce for several workers, or drop the counts",
            )
        )
    if sync is Sync.SERVERS:
        if not t.server_worker_separate:
            problems.append(
                (
                    "server_worker_separate",
                    f"framework {t.framework} runs its server shards as processes of their "
                    "own; shards inside the workers (server_worker_separate: false) are not "
                    "built",
                    "drop server_worker_separate (true is the default), or use framework "
                    "allreduce to keep the parameters in the workers",
                )
            )
        elif t.nserver_groups < 1 or t.nservers_per_group < 1:
            problems.append(
                (
                    "nservers_per_group" if t.nserver_groups >= 1 else "nserver_groups",
                    f"framework {t.framework} needs server shards, and the cluster section "
                    f"gives {t.nserver_groups} server group(s) x {t.nservers_per_group}",
                    "set nserver_groups and nservers_per_group to 1 or more",
                )
            )
        elif t.nworker_groups < t.nserver_groups:
            problems.append(
                (
                    "nserver_groups",
                    f"{t.nserver_groups} server groups need at least as many worker groups "
                    f"(got {t.nworker_groups}): a server group without workers never updates",
                    f"set nworker_groups to {t.nserver_groups} or more",
                )
            )
    if sync is Sync.GROUP and (t.nworker_groups > 1 or t.servers):
        problems.append(
            (
                "nworker_groups" if t.nworker_groups > 1 else "nserver_groups",
                f"framework {t.framework} averages the replicas of one worker group, and the "
                f"cluster section asks for {t.nworker_groups} worker group(s) and "
                f"{t.servers} server shard(s)",
                "use one worker group (nworkers_per_group for more workers) and no server shards",
            )
        )
    if sync is Sync.GROUP_THEN_SERVERS:
        if t.nworker_groups > 1 and t.servers < 1:
            problems.append(
                (
                    "nserver_groups",
                    f"{t.framework} with {t.nworker_groups} worker groups exchanges updates "
                    "between the groups through parameter-server shards, and it has none",
                    "set nserver_groups >= 1, nservers_per_group >= 1 and "
                    "server_worker_separate: true",
                )
            )
        if t.nworker_groups == 1 and t.servers > 0:
            problems.append(
                (
                    "nserver_groups",
                    f"{t.framework} with one worker group keeps the parameters in the workers and "
                    "has no use for server shards",
                    "set nserver_groups: 0, or use framework sandblaster",
                )
            )
    return problems


def _pipeline_problems(t: Topology, sync: Sync) -> list[tuple[str, str, str]]:
    """The rules for a pipelined job's topology: groups are pipelines, workers are stages."""
    problems: list[tuple[str, str, str]] = []
    if t.nworkers_per_group != t.stages:
        problems.append(
            (
                "nworkers_per_group",
                f"each worker group of a pipelined job is one pipeline of {t.stages} stages, "
                f"one worker each, and the cluster section asks for {t.nworkers_per_group} "
                "workers per group",
                f"drop nworkers_per_group, or set it to {t.stages}",
            )
        )
    if sync is Sync.NONE and t.nworker_groups != 1:
        problems.append(
            (
                "nworker_groups",
                f"framework {t.framework} runs one pipeline, and the cluster section asks for "
                f"{t.nworker_groups} worker groups (replicas)",
                "use framework allreduce for replicas of the pipeline",
            )
        )
    if sync is not Sync.SERVERS and t.servers:
        problems.append(
            (
                "nserver_groups",
                f"framework {t.framework} keeps a pipeline's parameters in its stages and has no "
                "use for server shards",
                "drop the server counts",
            )
        )
    if sync is Sync.SERVERS:
        problems += _server_pipeline_problems(t)
    return problems


def _server_pipeline_problems(t: Topology) -> list[tuple[str, str, str]]:
    """Asynchronous pipelines: each replica's stages push and pull their own layers through
    shards that hold only that stage's layers."""
    if FRAMEWORK_SPECS.get(t.framework).synchronous:
        return [
            (
                "framework",
                f"pipelines that average every step through server shards (framework "
                f"{t.framework}) are not built",
                "use framework allreduce for synchronous replicas of the pipeline, or downpour "
                "or hogwild for asynchronous ones",
            )
        ]
    if not t.server_worker_separate:
        return [
            (
                "server_worker_separate",
                f"framework {t.framework} runs its server shards as processes of their own; "
                "shards inside the workers (server_worker_separate: false) are not built",
                "drop server_worker_separate (true is the default)",
            )
        ]
    if t.nserver_groups < 1 or t.nworker_groups < t.nserver_groups:
        return [
            (
                "nserver_groups",
                f"{t.nserver_groups} server groups for {t.nworker_groups} pipeline(s): each "
                "server group needs at least one pipeline, and there must be one server group",
                f"set nserver_groups between 1 and {t.nworker_groups}",
            )
        ]
    if t.nservers_per_group < t.stages:
        return [
            (
                "nservers_per_group",
                f"each of the {t.stages} stages keeps its layers on shards of its own, and the "
                f"cluster section gives {t.nservers_per_group} shard(s) per server group",
                f"drop nservers_per_group (one shard per stage), or set it to {t.stages} or more",
            )
        ]
    return []
