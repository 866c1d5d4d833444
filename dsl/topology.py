"""Resolve a job's cluster section into a concrete topology (SINGA's worker and server groups).

The four named frameworks are presets of one topology; explicit fields override them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

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


# framework -> (worker groups, workers per group, server groups, servers per group, separate)
PRESETS: dict[str, tuple[int, int, int, int, bool]] = {
    "local": (1, 1, 0, 0, False),
    "sandblaster": (1, 2, 1, 1, True),
    "allreduce": (1, 2, 0, 0, False),
    "downpour": (2, 1, 1, 1, True),
    "hogwild": (2, 1, 2, 1, True),
}


def resolve_topology(cluster: ClusterConfig, pipeline: PipelineConfig | None = None) -> Topology:
    """The job's topology; with a `pipeline`, each worker group is one pipeline of its stages."""
    groups, per_group, sgroups, per_sgroup, separate = PRESETS[cluster.framework]
    stages = pipeline.count if pipeline is not None else 1
    if pipeline is not None:
        # Replicas of a pipeline exchange updates by all-reduce between their stages, never
        # through shards unless the framework is a parameter-server one.
        groups, per_group = (1, stages)
        if cluster.framework == "allreduce":
            sgroups, per_sgroup, separate = 0, 0, False

    def pick(value: int | bool | None, default: int | bool) -> int | bool:
        return default if value is None else value

    return Topology(
        framework=cluster.framework,
        nworker_groups=int(pick(cluster.nworker_groups, groups)),
        nworkers_per_group=int(pick(cluster.nworkers_per_group, per_group)),
        nserver_groups=int(pick(cluster.nserver_groups, sgroups)),
        nservers_per_group=int(pick(cluster.nservers_per_group, per_sgroup)),
        server_worker_separate=bool(pick(cluster.server_worker_separate, separate)),
        slots_per_worker=cluster.resources.slots_per_worker,
        gpus_per_worker=cluster.resources.gpus_per_worker,
        stages=stages,
    )


PS_FRAMEWORKS = ("sandblaster", "downpour", "hogwild")


def topology_problems(topology: Topology) -> list[tuple[str, str, str]]:
    """Why a resolved topology cannot run, as (cluster key, message, hint): checked when a job
    is validated, so that a job that could never run is refused at submission."""
    t = topology
    if t.stages > 1:
        return _pipeline_problems(t)
    problems: list[tuple[str, str, str]] = []
    if t.framework == "local" and (t.workers != 1 or t.servers):
        problems.append(
            (
                "framework",
                f"framework local trains in one process, and the cluster section asks for "
                f"{t.workers} worker(s) and {t.servers} server shard(s)",
                "use framework sandblaster or allreduce for several workers, or drop the counts",
            )
        )
    if t.framework in PS_FRAMEWORKS:
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
    if t.framework == "allreduce":
        if t.nworker_groups > 1 and t.servers < 1:
            problems.append(
                (
                    "nserver_groups",
                    f"allreduce with {t.nworker_groups} worker groups exchanges updates between "
                    "the groups through parameter-server shards, and it has none",
                    "set nserver_groups >= 1, nservers_per_group >= 1 and "
                    "server_worker_separate: true",
                )
            )
        if t.nworker_groups == 1 and t.servers > 0:
            problems.append(
                (
                    "nserver_groups",
                    "allreduce with one worker group keeps the parameters in the workers and "
                    "has no use for server shards",
                    "set nserver_groups: 0, or use framework sandblaster",
                )
            )
    return problems


def _pipeline_problems(t: Topology) -> list[tuple[str, str, str]]:
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
    if t.framework == "local" and t.nworker_groups != 1:
        problems.append(
            (
                "nworker_groups",
                f"framework local runs one pipeline, and the cluster section asks for "
                f"{t.nworker_groups} worker groups (replicas)",
                "use framework allreduce for replicas of the pipeline",
            )
        )
    if t.framework in ("local", "allreduce") and t.servers:
        problems.append(
            (
                "nserver_groups",
                f"framework {t.framework} keeps a pipeline's parameters in its stages and has no "
                "use for server shards",
                "drop the server counts",
            )
        )
    if t.framework in PS_FRAMEWORKS:
        problems.append(
            (
                "framework",
                f"pipelines whose replicas exchange updates through server shards (framework "
                f"{t.framework}) are not built yet",
                "use framework local (one pipeline) or allreduce (replicas by all-reduce)",
            )
        )
    return problems
