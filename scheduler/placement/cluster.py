"""The cluster as placement sees it, read from SQL: node capacities, queued jobs, the queue.

The scheduler loop and the API (GET /cluster, POST /jobs/validate) share these, so the queue
the API shows and the reasons it gives are the ones the scheduler acts on. Queued jobs are read
by (-priority, id); placement orders them fairly between users (scheduler/placement/plan.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import redis
from sqlalchemy import Row, func, select
from sqlalchemy.orm import Session, load_only

from contract.allocation import AllocationState
from contract.keys import Keys
from scheduler.placement.plan import (
    NodeCapacity,
    OwnerShare,
    PlacementRequest,
    QueueDecision,
    plan_queue,
)
from scheduler.store.models import QUEUE_ORDER, Allocation, Job, Node, UserQuota
from scheduler.store.quotas import Limits
from scheduler.store.states import JobState, NodeState

ACTIVE_ALLOCATIONS = (AllocationState.PENDING, AllocationState.RUNNING)
LIVE_JOBS = (JobState.SCHEDULED, JobState.RUNNING)  # placed: their processes run or start


def node_capacities(session: Session) -> list[NodeCapacity]:
    """Every known node with what its live allocations use (lost nodes come back not alive)."""
    used = {
        node_id: (int(slots or 0), int(gpus or 0))
        for node_id, slots, gpus in session.execute(
            select(Allocation.node_id, func.sum(Allocation.slots), func.sum(Allocation.gpus))
            .where(Allocation.state.in_(ACTIVE_ALLOCATIONS))
            .group_by(Allocation.node_id)
        )
    }
    devices: dict[int, set[int]] = {}
    for node_id, taken in session.execute(
        select(Allocation.node_id, Allocation.devices).where(
            Allocation.state.in_(ACTIVE_ALLOCATIONS), Allocation.gpus > 0
        )
    ):
        devices.setdefault(node_id, set()).update(int(i) for i in taken or ())
    return [
        NodeCapacity(
            name=node.name,
            queue=node.queue,
            slots=node.slots,
            gpus=node.gpus,
            slots_used=used.get(node.id, (0, 0))[0],
            gpus_used=used.get(node.id, (0, 0))[1],
            alive=node.state == NodeState.ALIVE,
            ps_unreachable=tuple(node.ps_unreachable or ()),
            plugins=dict(node.plugins or {}),
            plugin_error=node.plugin_error or "",
            memory_mb=node.memory_mb or 0,
            devices_used=frozenset(devices.get(node.id, ())),
        )
        for node in session.scalars(select(Node).order_by(Node.name))
    ]


def largest_memory_share(capacities: list[NodeCapacity], slots: int) -> tuple[str, int] | None:
    """The alive node that gives a worker of `slots` slots the most memory, and that memory
    (MB: its share per slot times `slots`); None when no alive node with as many slots says
    how much memory it has."""
    shares = [
        (node.memory_per_slot_mb * slots, node.name)
        for node in capacities
        if node.alive and node.memory_mb > 0 and node.slots >= slots
    ]
    if not shares:
        return None
    mb, name = max(shares)
    return name, mb


def job_topology(job: Job | Row[Any]) -> dict[str, Any]:
    """The job's resolved topology (Topology.to_dict() form)."""
    if job.topology:
        return job.topology
    from dsl.schema import JobSpec  # the job language imports torch; only for old rows
    from dsl.topology import resolve_topology

    spec = JobSpec.model_validate(job.spec)
    return resolve_topology(spec.cluster, spec.pipeline).to_dict()


def placement_request(job: Job | Row[Any]) -> PlacementRequest:
    """What `job` asks of the cluster; a plain row must carry id, owner_id, priority and a
    topology."""
    return PlacementRequest.from_topology(
        job.id,
        job_topology(job),
        priority=job.priority,
        owner_id=job.owner_id,
        plugins=job.plugins or (),
        avoided=job.avoided_nodes or (),
    )


# What placing a job reads of it. The documents (spec and the YAML) are its heavy part: loaded
# only when used (a placed job's spec, an old row without a topology), not for every queued job
# at every scheduling pass or GET /cluster.
PLACEMENT_COLUMNS = load_only(
    Job.id,
    Job.owner_id,
    Job.name,
    Job.state,
    Job.priority,
    Job.topology,
    Job.plugins,
    Job.avoided_nodes,
    Job.cancel_requested,
)


def queued_jobs(session: Session, *, for_update: bool = False) -> list[Job]:
    query = (
        select(Job)
        .options(PLACEMENT_COLUMNS)
        .where(Job.state == JobState.QUEUED)
        .order_by(*QUEUE_ORDER)
    )
    if for_update:
        query = query.with_for_update()
    return list(session.scalars(query))


@dataclass(frozen=True)
class QueueEntry:
    job_id: int
    owner_id: int
    name: str
    priority: int
    position: int  # 1-based, in placement order
    slots: int
    gpus: int
    reason: str


# The queue as shown (GET /cluster, which the dashboard polls, and POST /jobs/validate): plain
# rows, not ORM objects, in placement order.
def owner_shares(session: Session, defaults: Limits, owner_ids: set[int]) -> dict[int, OwnerShare]:
    """What each owner's placed jobs hold now, and their placement quotas (`defaults` unless
    set for the owner), for plan_queue."""
    if not owner_ids:
        return {}
    rows = {
        row.user_id: row
        for row in session.scalars(select(UserQuota).where(UserQuota.user_id.in_(owner_ids)))
    }
    running = {
        owner: int(count)
        for owner, count in session.execute(
            select(Job.owner_id, func.count())
            .where(Job.owner_id.in_(owner_ids), Job.state.in_(LIVE_JOBS))
            .group_by(Job.owner_id)
        )
    }
    held = {
        owner: (int(slots or 0), int(gpus or 0))
        for owner, slots, gpus in session.execute(
            select(Job.owner_id, func.sum(Allocation.slots), func.sum(Allocation.gpus))
            .join(Job, Job.id == Allocation.job_id)
            .where(Job.owner_id.in_(owner_ids), Allocation.state.in_(ACTIVE_ALLOCATIONS))
            .group_by(Job.owner_id)
        )
    }
    shares = {}
    for owner in owner_ids:
        limits = defaults.with_overrides(rows.get(owner))
        slots, gpus = held.get(owner, (0, 0))
        shares[owner] = OwnerShare(
            jobs=int(running.get(owner, 0)),
            slots=slots,
            gpus=gpus,
            max_jobs=limits.running_jobs,
            max_slots=limits.slots,
            max_gpus=limits.gpus,
        )
    return shares


_QUEUED_ROWS = (
    select(
        Job.id, Job.owner_id, Job.name, Job.priority, Job.topology, Job.plugins, Job.avoided_nodes
    )
    .where(Job.state == JobState.QUEUED)
    .order_by(*QUEUE_ORDER)
)


@dataclass(frozen=True)
class QueuePlan:
    """The scheduler's last plan of the queue: job ids in placement order, why each waits."""

    order: list[int]
    waiting: dict[int, str]


# Said of a job submitted since the scheduler's last plan.
NOT_PLANNED = "submitted since the scheduler's last pass; placed or given a reason at its next"


def save_plan(client: redis.Redis, keys: Keys, decision: QueueDecision) -> None:
    """The scheduler's plan, kept for GET /cluster."""
    waiting = {str(job_id): reason for job_id, reason in decision.waiting.items()}
    client.set(keys.queue_plan, json.dumps({"order": decision.order, "waiting": waiting}))


def last_plan(client: redis.Redis, keys: Keys) -> QueuePlan | None:
    """The plan the scheduler saved last; None before it saved one."""
    raw = client.get(keys.queue_plan)
    if raw is None:
        return None
    data = json.loads(raw)
    return QueuePlan(
        order=[int(i) for i in data["order"]],
        waiting={int(k): str(v) for k, v in data["waiting"].items()},
    )


def queue_view(
    session: Session,
    capacities: list[NodeCapacity] | None = None,
    *,
    quotas: Limits | None = None,
    plan: QueuePlan | None = None,
) -> list[QueueEntry]:
    """The queue in placement order, each job with why it is waiting (`capacities`: the nodes'
    as node_capacities gives them, when the caller has them already; `quotas`: the default
    quotas, Limits.defaults(settings), none if not given). With the scheduler's last `plan`,
    its order and reasons, not planned again (jobs it has not seen yet come last)."""
    jobs = {row.id: row for row in session.connection().execute(_QUEUED_ROWS)}
    requests = {
        # an old row without a topology: the whole job, to resolve it from its spec
        job_id: placement_request(row if row.topology else session.get_one(Job, job_id))
        for job_id, row in jobs.items()
    }
    if plan is not None:
        order = [job_id for job_id in plan.order if job_id in jobs]
        order += sorted(set(jobs) - set(order))
        seen = set(plan.order)
        waiting = {
            job_id: plan.waiting[job_id] if job_id in seen else NOT_PLANNED
            for job_id in jobs
            if job_id in plan.waiting or job_id not in seen
        }
        decision = QueueDecision([], waiting, order)
    else:
        if capacities is None:
            capacities = node_capacities(session)
        shares = owner_shares(session, quotas or Limits(), {row.owner_id for row in jobs.values()})
        decision = plan_queue(requests.values(), capacities, shares)
    return [
        QueueEntry(
            job_id=job_id,
            owner_id=jobs[job_id].owner_id,
            name=jobs[job_id].name,
            priority=jobs[job_id].priority,
            position=position,
            slots=requests[job_id].slots,
            gpus=requests[job_id].gpus,
            reason=decision.waiting.get(job_id, "fits now; placed at the next scheduling pass"),
        )
        for position, job_id in enumerate(decision.order, start=1)
    ]


# Allocations of earlier attempts (before a lost node sent the job back to the queue) ended
# FAILED or CANCELLED; the current attempt's are live or done.
SHOWN_ALLOCATIONS = (AllocationState.PENDING, AllocationState.RUNNING, AllocationState.DONE)


@dataclass(frozen=True)
class PlacedJob:
    job: Job  # placement's columns only (PLACEMENT_COLUMNS)
    allocations: list[tuple[str, Allocation]]  # (node name, allocation), workers by rank


@dataclass(frozen=True)
class ClusterView:
    """The cluster as GET /cluster shows it: nodes, placed jobs, the queue with its reasons."""

    nodes: list[tuple[Node, NodeCapacity]]
    placed: list[PlacedJob]
    queue: list[QueueEntry]


def cluster_view(session: Session, *, quotas: Limits, plan: QueuePlan | None = None) -> ClusterView:
    """Every node with its capacity and use, the processes of scheduled and running jobs, and
    the queue in placement order (`quotas`: the default quotas, Limits.defaults(settings);
    `plan`: the scheduler's last, shown as it is; planned here only before there is one)."""
    capacities = node_capacities(session)
    capacity = {node.name: node for node in capacities}
    nodes = list(session.scalars(select(Node).order_by(Node.name)))
    node_names = {node.id: node.name for node in nodes}
    jobs = list(
        session.scalars(
            select(Job).options(PLACEMENT_COLUMNS).where(Job.state.in_(LIVE_JOBS)).order_by(Job.id)
        )
    )
    allocations: dict[int, list[tuple[str, Allocation]]] = {job.id: [] for job in jobs}
    if jobs:
        rows = session.scalars(
            select(Allocation)
            .where(Allocation.job_id.in_(allocations), Allocation.state.in_(SHOWN_ALLOCATIONS))
            .order_by(Allocation.job_id, Allocation.role.desc(), Allocation.group, Allocation.rank)
        )
        for alloc in rows:
            allocations[alloc.job_id].append((node_names.get(alloc.node_id, "?"), alloc))
    return ClusterView(
        nodes=[(node, capacity[node.name]) for node in nodes],
        placed=[PlacedJob(job, allocations[job.id]) for job in jobs],
        queue=queue_view(session, capacities, quotas=quotas, plan=plan),
    )
