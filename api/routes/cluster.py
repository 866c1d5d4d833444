"""/cluster: the node agents, the jobs running on them and the queue with its reasons."""

from __future__ import annotations

from fastapi import APIRouter
from sqlalchemy import select

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
from scheduler.admission.quotas import Limits
from scheduler.placement.cluster import LIVE_JOBS, PLACEMENT_COLUMNS, node_capacities, queue_view
from scheduler.store.models import Allocation, Job, JobState, Node, NodeState, aware

router = APIRouter(tags=["cluster"])

# Allocations of earlier attempts (before a lost node sent the job back to the queue) ended
# FAILED or CANCELLED; the current attempt's are live or done.
SHOWN_ALLOCATIONS = (AllocationState.PENDING, AllocationState.RUNNING, AllocationState.DONE)


@router.get(
    "/cluster",
    response_model=ClusterOut,
    summary="Nodes, running jobs and the queue",
    description="Every node agent with its capacity and use, the processes of scheduled and "
    "running jobs, and the queue in placement order with why each job waits. Other users' "
    "jobs show without id and name, unless the caller is an admin.",
    responses=errors(401),
)
def cluster(session: SessionDep, user: CurrentUser, services: ServicesDep) -> ClusterOut:
    capacities = node_capacities(session)
    capacity = {node.name: node for node in capacities}
    nodes = list(session.scalars(select(Node).order_by(Node.name)))
    node_names = {node.id: node.name for node in nodes}
    jobs = list(
        session.scalars(
            select(Job).options(PLACEMENT_COLUMNS).where(Job.state.in_(LIVE_JOBS)).order_by(Job.id)
        )
    )
    allocations: dict[int, list[AllocationOut]] = {job.id: [] for job in jobs}
    if jobs:
        rows = session.scalars(
            select(Allocation)
            .where(Allocation.job_id.in_(allocations), Allocation.state.in_(SHOWN_ALLOCATIONS))
            .order_by(Allocation.job_id, Allocation.role.desc(), Allocation.group, Allocation.rank)
        )
        for alloc in rows:
            allocations[alloc.job_id].append(
                AllocationOut(
                    node=node_names.get(alloc.node_id, "?"),
                    role=alloc.role,
                    group=alloc.group,
                    rank=alloc.rank,
                    state=AllocationState(alloc.state),
                )
            )
    queue = queue_view(session, capacities, quotas=Limits.defaults(services.settings))
    owners = {entry.job_id: entry.owner_id for entry in queue}
    owners.update({job.id: job.owner_id for job in jobs})

    def shown(job_id: int) -> bool:
        return user.is_admin or owners.get(job_id) == user.id

    return ClusterOut(
        nodes=[
            NodeOut(
                name=node.name,
                state=NodeState(node.state),
                slots=node.slots,
                gpus=node.gpus,
                slots_used=capacity[node.name].slots_used,
                gpus_used=capacity[node.name].gpus_used,
                last_heartbeat=aware(node.last_heartbeat),
                ps_unreachable=node.ps_unreachable or [],
            )
            for node in nodes
        ],
        running=[
            RunningJob(
                job_id=job.id if shown(job.id) else None,
                name=job.name if shown(job.id) else None,
                state=JobState(job.state),
                allocations=allocations[job.id],
            )
            for job in jobs
        ],
        queue=[
            QueueEntryOut(
                job_id=entry.job_id if shown(entry.job_id) else None,
                name=entry.name if shown(entry.job_id) else None,
                priority=entry.priority,
                position=entry.position,
                slots=entry.slots,
                gpus=entry.gpus,
                reason=entry.reason,
            )
            for entry in queue
        ],
    )
