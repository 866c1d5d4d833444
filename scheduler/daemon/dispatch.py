"""Dispatch: what the scheduler sends a node agent for each placed process. Its allocation
record in Redis (contract/allocation.py), with the job's Redis user's password when jobs have
users of their own (scheduler/daemon/job_users.py), then a Celery task with the allocation's id
on the node's queue; a task sent again when it may be lost; and the stop flag of allocations
given up."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import redis
from celery import Celery
from sqlalchemy import select
from sqlalchemy.orm import Session

from contract.allocation import (
    CLAIMED,
    DISPATCHED,
    REDIS_PASSWORD,
    STOP,
    AllocationInfo,
    AllocationState,
    not_started,
)
from contract.codec import decode
from contract.keys import Keys
from contract.rundir import job_run_dir
from contract.settings import Settings
from dsl.run_kinds import RUN_KINDS
from scheduler.celery_app import RUN_ALLOCATION
from scheduler.daemon.job_users import grant_job_user
from scheduler.daemon.starts import report_not_started
from scheduler.placement.cluster import job_topology
from scheduler.store.models import Allocation, Job, Node
from scheduler.store.predictions import prediction_task
from scheduler.store.states import JobState


@dataclass(frozen=True)
class Dispatch:
    allocation_id: int
    queue: str
    info: AllocationInfo


def allocation_info(
    session: Session,
    settings: Settings,
    job: Job,
    alloc: Allocation,
    node: Node,
    *,
    start_step: int = 0,
    replacement: int = 0,
) -> AllocationInfo:
    topology = job_topology(job)
    scores = RUN_KINDS.get(job.kind).scores_rows
    return AllocationInfo(
        allocation_id=alloc.id,
        job_id=job.id,
        role=alloc.role,
        group=alloc.group,
        rank=alloc.rank,
        world=int(topology.get("nworkers_per_group", 1)),
        slots=alloc.slots,
        gpus=alloc.gpus,
        node=node.name,
        kind=job.kind,
        framework=job.framework,
        topology=topology,
        spec=job.spec,  # the execution spec: files absolute, datasets resolved at submission
        run_dir=job_run_dir(settings.artifacts(), job.id),
        attempt=job.attempt,
        resume_from=job.restart_from or "",
        restart_seconds=settings.restart_point_seconds,
        start_step=start_step,
        replacement=replacement,
        memory_mb=memory_limit(topology, alloc.slots, node),
        devices=tuple(int(i) for i in alloc.devices or ()),
        # what a prediction run's workers score, from the run's own row
        prediction=prediction_task(session, job.id).to_dict() if scores else None,
    )


def memory_limit(topology: dict[str, Any], slots: int, node: Node) -> int:
    """A process's memory limit (MB): the job's cluster.resources.memory_mb, else its slots'
    share of its node's memory (0: neither is known, no limit)."""
    asked = int(topology.get("memory_mb") or 0)
    if asked:
        return asked
    return (node.memory_mb or 0) // node.slots * slots if node.slots else 0


def dispatch(
    celery: Celery,
    client: redis.Redis,
    keys: Keys,
    items: list[Dispatch],
    *,
    job_users: bool,
    ps_clients: Sequence[redis.Redis] = (),
) -> None:
    """Write each allocation's record (with its Redis password when jobs have users of their
    own), then send its task (IDs only) to its node's queue. One that cannot be is reported
    not started, with the step that failed (scheduler/daemon/starts.py)."""
    for item in items:
        key = keys.allocation(item.allocation_id)
        step = "the scheduler could not make its job's Redis user"
        try:
            fields: dict[Any, Any] = item.info.to_hash()
            if job_users:
                fields[REDIS_PASSWORD] = grant_job_user(client, keys, item.info, ps_clients)
            step = "the scheduler could not write its allocation record"
            pipe = client.pipeline(transaction=True)
            pipe.delete(key)  # an id reused after a deleted job must not look claimed
            pipe.hset(key, mapping=fields)
            pipe.execute()
            step = "the scheduler could not send its task"
            celery.send_task(RUN_ALLOCATION, args=[item.allocation_id], queue=item.queue)
        except Exception as exc:
            report_not_started(client, keys, item.info, not_started(step, exc))
            continue
        client.hset(key, DISPATCHED, repr(time.time()))


def undispatched(
    session: Session, settings: Settings, client: redis.Redis, now: float | None = None
) -> list[Dispatch]:
    """Pending allocations whose task may not have been sent (the scheduler stopped between
    its commit and the dispatch), or was sent and not claimed within the node timeout (the
    message was lost with Redis, or with an agent that died holding it): sent again; the
    agent's claim makes that safe."""
    keys = Keys(settings.redis_prefix)
    now = time.time() if now is None else now
    items = []
    pending = session.scalars(
        select(Allocation).where(Allocation.state == AllocationState.PENDING)
    ).all()
    for alloc in pending:
        fields = decode(client.hgetall(keys.allocation(alloc.id)))
        same_job = fields.get("job_id") == str(alloc.job_id)
        if same_job and CLAIMED in fields:
            continue
        sent = fields.get(DISPATCHED, "")
        waited = now - float(sent) if sent.replace(".", "", 1).isdigit() else 0.0
        if same_job and sent and waited <= settings.node_timeout_seconds:
            continue
        job, node = session.get(Job, alloc.job_id), session.get(Node, alloc.node_id)
        if job is None or node is None or JobState(job.state).terminal:
            continue
        info = allocation_info(session, settings, job, alloc, node)
        items.append(Dispatch(alloc.id, node.queue, info))
    return items


def stop_allocations(client: redis.Redis, keys: Keys, allocation_ids: list[int]) -> None:
    if not allocation_ids:
        return
    pipe = client.pipeline(transaction=False)
    for alloc_id in allocation_ids:
        pipe.hset(keys.allocation(alloc_id), STOP, "1")
    pipe.execute()
