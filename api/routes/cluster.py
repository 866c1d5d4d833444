"""/cluster: the node agents, the jobs running on them and the queue with its reasons."""

from __future__ import annotations

import re
from collections.abc import Callable

from fastapi import APIRouter

from api.deps import CurrentUser, ServicesDep, SessionDep
from api.schemas import (
    AllocationOut,
    ClusterOut,
    NodeOut,
    QueueEntryOut,
    RunningJob,
    errors,
)
from contract.allocation import AllocationState
from scheduler.placement.cluster import cluster_view, last_plan
from scheduler.store.models import Allocation, aware
from scheduler.store.quotas import Limits
from scheduler.store.states import JobState, NodeState

router = APIRouter(tags=["cluster"])


def allocation_out(node: str, alloc: Allocation) -> AllocationOut:
    return AllocationOut(
        node=node,
        role=alloc.role,
        group=alloc.group,
        rank=alloc.rank,
        state=AllocationState(alloc.state),
    )


JOB_ID = re.compile(r"\bjob (\d+)")


def visible_reason(reason: str, own: bool, shown: Callable[[int], bool]) -> str:
    """A waiting reason as the caller may read it: no id of a job they may not see, and of
    another user's job no more than the kind of wait (not its owner's quota use)."""
    if not own:
        if reason.startswith("waiting for its owner's quota"):
            return "waiting for its owner's quota"
        if reason.startswith("waiting behind job"):
            return "waiting behind another job"
    return JOB_ID.sub(
        lambda match: match[0] if shown(int(match[1])) else "another user's job", reason
    )


@router.get(
    "/cluster",
    response_model=ClusterOut,
    summary="Nodes, running jobs and the queue",
    description="Every node agent with its capacity and use, the processes of scheduled and "
    "running jobs, and the queue in placement order with why each job waits, as the "
    "scheduler planned it last. Other users' jobs show without id and name, and their waiting "
    "reasons without other jobs' ids or their owners' quota use, unless the caller is an admin.",
    responses=errors(401),
)
def cluster(session: SessionDep, user: CurrentUser, services: ServicesDep) -> ClusterOut:
    # The scheduler's last plan of the queue, not planned again for every request.
    plan = last_plan(services.redis, services.keys)
    view = cluster_view(session, quotas=Limits.defaults(services.settings), plan=plan)
    owners = {entry.job_id: entry.owner_id for entry in view.queue}
    owners.update({placed.job.id: placed.job.owner_id for placed in view.placed})

    def shown(job_id: int) -> bool:
        return user.is_admin or owners.get(job_id) == user.id

    return ClusterOut(
        nodes=[
            NodeOut(
                name=node.name,
                state=NodeState(node.state),
                slots=node.slots,
                gpus=node.gpus,
                slots_used=capacity.slots_used,
                gpus_used=capacity.gpus_used,
                memory_mb=node.memory_mb or 0,
                last_heartbeat=aware(node.last_heartbeat),
                ps_unreachable=node.ps_unreachable or [],
                plugins=node.plugins or {},
                plugin_error=node.plugin_error,
            )
            for node, capacity in view.nodes
        ],
        running=[
            RunningJob(
                job_id=placed.job.id if shown(placed.job.id) else None,
                name=placed.job.name if shown(placed.job.id) else None,
                state=JobState(placed.job.state),
                allocations=[allocation_out(node, alloc) for node, alloc in placed.allocations],
            )
            for placed in view.placed
        ],
        queue=[
            QueueEntryOut(
                job_id=entry.job_id if shown(entry.job_id) else None,
                name=entry.name if shown(entry.job_id) else None,
                priority=entry.priority,
                position=entry.position,
                slots=entry.slots,
                gpus=entry.gpus,
                reason=visible_reason(entry.reason, shown(entry.job_id), shown),
            )
            for entry in view.queue
        ],
    )
