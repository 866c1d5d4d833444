"""Whether a job's workers fit the cluster: the memory each needs against its memory_mb and
against what a worker of its slots can get on any node."""

from __future__ import annotations

from dsl.errors import SpecIssue
from dsl.memory import MemoryEstimate
from dsl.source import SourceMap
from dsl.topology import Topology
from scheduler.placement.cluster import largest_memory_share
from scheduler.placement.plan import NodeCapacity


def memory_issues(
    memory: MemoryEstimate, topology: Topology, nodes: list[NodeCapacity], source: SourceMap
) -> list[SpecIssue]:
    """A worker that would pass its memory limit, or need more than any node could give it:
    refused now rather than killed (or queued forever) later."""
    need = memory.total_mb
    slots = topology.slots_per_worker
    largest = largest_memory_share(nodes, slots)
    where = ("cluster", "resources", "memory_mb")
    if topology.memory_mb and largest is not None and topology.memory_mb > largest[1]:
        node, most = largest
        return [
            source.issue(
                where,
                f"memory_mb {topology.memory_mb} is more than a worker of {slots} slot(s) can "
                f"get on any node (at most {most} MB, on {node})",
                f"ask for at most {most}, or more slots_per_worker (each brings a slot's share "
                "of its node's memory)",
            )
        ]
    if topology.memory_mb and need > topology.memory_mb:
        return [
            source.issue(
                where,
                f"each worker needs about {memory.describe()}, more than its memory_mb "
                f"{topology.memory_mb}",
                f"raise memory_mb to at least {need}, or use a smaller batch_size or net",
            )
        ]
    if not topology.memory_mb and largest is not None and need > largest[1]:
        node, most = largest
        return [
            source.issue(
                ("cluster", "resources"),
                f"each worker needs about {memory.describe()}, more than a worker of {slots} "
                f"slot(s) gets on any node (at most {most} MB, on {node})",
                "ask for more slots_per_worker (each brings a slot's share of its node's "
                "memory), or use a smaller batch_size, net or dataset",
            )
        ]
    return []
