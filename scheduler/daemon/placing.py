"""What a scheduling pass places, in SQL: the queued jobs, each whole, where the fair-share plan
(scheduler/placement/plan.py) puts them, and the vacant places of placed jobs (failed processes
the recovery policy places again). Each new allocation comes back as a `Dispatch`, sent once the
session is committed (scheduler/daemon/dispatch.py)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from contract.allocation import AllocationState
from contract.settings import Settings
from scheduler.daemon.dispatch import Dispatch, allocation_info
from scheduler.placement.cluster import (
    LIVE_JOBS,
    node_capacities,
    owner_shares,
    placement_request,
    queued_jobs,
)
from scheduler.placement.plan import QueueDecision, plan_queue
from scheduler.recovery.actions import alone_restart_step, forget_reports_past, job_facts
from scheduler.recovery.policy import PlaceAgain, Vacant, decide
from scheduler.store.lifecycle import transition
from scheduler.store.models import Allocation, Job, Node
from scheduler.store.quotas import Limits
from scheduler.store.states import JobState, NodeState


@dataclass
class PlanMemo:
    """The queue as the last pass planned it: a pass whose queue, nodes and owners' shares are
    the same plans nothing (it would place nothing new), and GET /cluster reads the plan saved
    last (`fresh`: this pass planned anew, to be saved) instead of planning again."""

    seen: object = None
    decision: QueueDecision | None = None
    fresh: bool = False


def schedule_once(
    session: Session, settings: Settings, memo: PlanMemo | None = None
) -> list[Dispatch]:
    """One placement pass; returns what to dispatch once the session is committed."""
    jobs = {}
    for job in queued_jobs(session, for_update=True):
        if job.cancel_requested:
            transition(session, job, JobState.CANCELLED, "cancelled by the user before it ran")
        else:
            jobs[job.id] = job
    memo = memo if memo is not None else PlanMemo()
    memo.fresh = False
    shares = owner_shares(
        session, Limits.defaults(settings), {job.owner_id for job in jobs.values()}
    )
    capacities = node_capacities(session)
    seen = (
        tuple((job.id, job.priority, job.owner_id) for job in jobs.values()),
        tuple(capacities),
        tuple(sorted(shares.items())),
    )
    if seen == memo.seen:
        return []  # nothing changed since the last plan, which placed what it could
    decision = plan_queue([placement_request(job) for job in jobs.values()], capacities, shares)
    # A plan that placed a job is not what the next pass will see, even when queue, nodes and
    # shares read the same then: the job may be back in the queue before it (its process failed
    # to start), and must be placed again.
    memo.seen = None if decision.placed else seen
    memo.decision, memo.fresh = decision, True
    if not jobs:
        return []
    for job_id, reason in decision.waiting.items():
        if jobs[job_id].pending_reason != reason:  # written when it changes, not every pass
            jobs[job_id].pending_reason = reason
    nodes = {
        node.name: node
        for node in session.scalars(select(Node).where(Node.state == NodeState.ALIVE))
    }
    dispatches: list[Dispatch] = []
    for request, plan in decision.placed:
        job = jobs[request.job_id]
        allocs = [
            Allocation(
                job_id=job.id,
                node_id=nodes[a.node].id,
                role=a.role,
                group=a.group,
                rank=a.rank,
                slots=a.slots,
                gpus=a.gpus,
                devices=list(a.devices) or None,
                state=AllocationState.PENDING,
            )
            for a in plan.assignments
        ]
        session.add_all(allocs)
        session.flush()
        job.pending_reason = None
        transition(session, job, JobState.SCHEDULED, f"placed on {plan.describe()}")
        for alloc, a in zip(allocs, plan.assignments, strict=True):
            info = allocation_info(session, settings, job, alloc, nodes[a.node])
            dispatches.append(Dispatch(alloc.id, nodes[a.node].queue, info))
    return dispatches


Room = dict[str, list[int]]  # node -> [free slots, free GPUs]


def replace_processes(session: Session, settings: Settings) -> list[Dispatch]:
    """Failed processes of placed jobs are placed again where the recovery policy says so
    (policy.Vacant): server shards (policy.ReplaceShard), whose new process reads the shard's
    parameters, version and updater state from Redis, and the workers of asynchronous jobs
    (policy.RestartAlone), whose new process goes on from the worker's last reported step with
    the shards' parameters. Each goes on its node when it is alive and has room, else on the
    alive node with the most free slots, or waits for the next pass. Every one of them uses the
    parameter-server Redis: nodes that cannot reach it take none."""
    newest: dict[tuple[int, str, int, int], Allocation] = {}
    for alloc in session.scalars(
        select(Allocation)
        .join(Job, Job.id == Allocation.job_id)
        .where(Job.state.in_(LIVE_JOBS))
        .order_by(Allocation.id)
    ):
        newest[(alloc.job_id, alloc.role, alloc.group, alloc.rank)] = alloc
    dead: list[tuple[Allocation, Job]] = []
    for alloc in newest.values():
        job = session.get(Job, alloc.job_id) if alloc.state == AllocationState.FAILED else None
        if job is not None and isinstance(decide(Vacant(job_facts(job), alloc.role)), PlaceAgain):
            dead.append((alloc, job))
    if not dead:
        return []
    capacities = {
        node.name: node
        for node in node_capacities(session)
        if node.alive and not node.ps_unreachable
    }
    free = {
        name: [node.slots - node.slots_used, node.gpus - node.gpus_used]
        for name, node in capacities.items()
    }
    alive = {
        node.id: node
        for node in session.scalars(select(Node).where(Node.state == NodeState.ALIVE))
        if node.name in free
    }
    # A pipeline's stages go on only together: they are placed in one pass or not at all,
    # from one step worked out before any of them forgets its later reports.
    gangs: dict[tuple[int, str, int], list[tuple[Allocation, Job]]] = {}
    for old, job in dead:
        together = old.role == "worker" and job_facts(job).pipelined
        key = (old.job_id, old.role, old.group if together else -1 - old.id)
        gangs.setdefault(key, []).append((old, job))
    dispatches: list[Dispatch] = []
    for gang in gangs.values():
        spots: list[tuple[Allocation, Job, Node]] = []
        taken = {name: list(room) for name, room in free.items()}
        for old, job in gang:

            def fits(node: Node, old: Allocation = old, taken: Room = taken) -> bool:
                room = taken.get(node.name, [0, 0])
                return room[0] >= old.slots and room[1] >= old.gpus

            same = alive.get(old.node_id)
            others = sorted(
                alive.values(), key=lambda node: (-taken.get(node.name, [0])[0], node.name)
            )
            node = same if same is not None and fits(same) else next(filter(fits, others), None)
            if node is None:
                break
            taken[node.name][0] -= old.slots
            taken[node.name][1] -= old.gpus
            spots.append((old, job, node))
        if len(spots) < len(gang):
            continue
        free = taken
        starts = {
            (old.group, old.rank): alone_restart_step(session, job, old.group, old.rank)
            for old, job in gang
            if old.role == "worker"
        }
        for old, job, node in spots:
            devices = capacities[node.name].free_devices(old.gpus)
            capacities[node.name] = replace(
                capacities[node.name],
                devices_used=capacities[node.name].devices_used | set(devices),
            )
            alloc = Allocation(
                job_id=old.job_id,
                node_id=node.id,
                role=old.role,
                group=old.group,
                rank=old.rank,
                slots=old.slots,
                gpus=old.gpus,
                devices=list(devices) or None,
                state=AllocationState.PENDING,
            )
            session.add(alloc)
            session.flush()
            start = starts.get((old.group, old.rank), 0)
            if old.role == "worker":  # a worker restarted alone reports its last step again
                forget_reports_past(session, job, old.group, old.rank, start)
            before = session.scalar(
                select(func.count(Allocation.id)).where(
                    Allocation.job_id == old.job_id,
                    Allocation.role == old.role,
                    Allocation.group == old.group,
                    Allocation.rank == old.rank,
                    Allocation.id < alloc.id,
                )
            )
            info = allocation_info(
                session, settings, job, alloc, node, start_step=start, replacement=int(before or 0)
            )
            dispatches.append(Dispatch(alloc.id, node.queue, info))
    return dispatches
