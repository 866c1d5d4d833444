"""Resolve a job's cluster section into a concrete topology (SINGA's worker and server groups).

The four named frameworks are presets of one topology; explicit fields override them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from dsl.schema import ClusterConfig


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


# framework -> (worker groups, workers per group, server groups, servers per group, separate)
PRESETS: dict[str, tuple[int, int, int, int, bool]] = {
    "local": (1, 1, 0, 0, False),
    "sandblaster": (1, 2, 1, 1, True),
    "allreduce": (1, 2, 0, 0, False),
    "downpour": (2, 1, 1, 1, True),
    "hogwild": (2, 1, 2, 1, True),
}


def resolve_topology(cluster: ClusterConfig) -> Topology:
    groups, per_group, sgroups, per_sgroup, separate = PRESETS[cluster.framework]

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
    )
