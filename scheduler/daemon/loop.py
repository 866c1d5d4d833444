"""The scheduler process: node sync, gang placement and dispatch, and the ingester.

Every pass: sync the nodes the agents registered in Redis into SQL (marking the silent ones
lost, their jobs placed again once), then place queued jobs whole in (-priority, id) order,
write each allocation's record to Redis and send its Celery task to the node's queue. The
ingester (job streams into SQL rows and job states) and the sweeps (trials asked of each
sweep's study, results told) run beside it in threads of their own. A sweep's next trial does
not wait for their periods: the ingester wakes the sweep thread when a trial ends, and the
sweep thread wakes placement when it has created trials.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import redis
from celery import Celery
from sqlalchemy import func, select
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
from contract.announcements import JOB, SWEEP, relay
from contract.codec import decode
from contract.keys import Keys, delete_matching
from contract.liveness import record_pass
from contract.rundir import job_run_dir
from contract.settings import Settings
from dsl.run_kinds import RUN_KINDS
from scheduler.celery_app import RUN_ALLOCATION, create_celery
from scheduler.daemon.lease import SchedulerLease
from scheduler.daemon.nodes import (
    NodeTracker,
    read_nodes,
    silent_allocations,
    sync_nodes,
    write_off_silent,
)
from scheduler.daemon.starts import StartWatch, report_not_started, write_off_unstarted
from scheduler.daemon.sweep_thread import TrialPruning, run_sweeps
from scheduler.daemon.webhooks import run_webhooks
from scheduler.ingest.ingester import Ingester
from scheduler.placement.cluster import (
    ACTIVE_ALLOCATIONS,
    LIVE_JOBS,
    job_topology,
    node_capacities,
    owner_shares,
    placement_request,
    queued_jobs,
    save_plan,
)
from scheduler.placement.plan import QueueDecision, plan_queue
from scheduler.recovery.actions import (
    alone_restart_step,
    forget_reports_past,
    job_facts,
    prune_restart_points,
)
from scheduler.recovery.policy import PlaceAgain, Vacant, decide
from scheduler.store.database import Database
from scheduler.store.lifecycle import transition
from scheduler.store.models import Allocation, Job, Node, utcnow
from scheduler.store.predictions import prediction_task
from scheduler.store.quotas import Limits
from scheduler.store.states import JobState, NodeState

log = logging.getLogger("trainyard.scheduler")

# Ended jobs' parameter-server keys are deleted by the scheduler that saw them end; one started
# later also sweeps the jobs that ended in this window before it.
KEY_SWEEP_WINDOW = timedelta(hours=24)
KEY_SWEEP_SECONDS = 5.0


# -- placement and dispatch ----------------------------------------------------------------------
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


@dataclass
class KeySweeper:
    """Deletes the parameter-server keys of ended jobs whose processes have all stopped, from
    the main Redis and every REDIS_PS_URLS server, their restart points and their Redis users,
    once per job (per scheduler process)."""

    clients: list[redis.Redis]
    keys: Keys
    artifacts: Path | None = None  # ended jobs' restart points are deleted there
    job_users: bool = False  # ended jobs' Redis users are deleted from every server too
    swept: set[int] = field(default_factory=set)
    last: float = 0.0

    def due(self, now: float) -> bool:
        return now - self.last >= KEY_SWEEP_SECONDS

    def ended_jobs(self, session: Session) -> list[int]:
        still_running = select(Allocation.job_id).where(Allocation.state.in_(ACTIVE_ALLOCATIONS))
        ended = session.scalars(
            select(Job.id).where(
                Job.state.in_([state for state in JobState if state.terminal]),
                Job.ended_at >= utcnow() - KEY_SWEEP_WINDOW,
                Job.id.not_in(still_running),
            )
        ).all()
        self.swept &= set(ended)  # jobs that left the window are not asked about again
        return [job_id for job_id in ended if job_id not in self.swept]

    def sweep(self, job_ids: list[int]) -> int:
        removed = 0
        for job_id in job_ids:
            for client in self.clients:
                removed += delete_matching(client, self.keys.ps_pattern(job_id))
            if self.artifacts is not None:
                prune_restart_points(self.artifacts, job_id)
            if self.job_users:
                drop_job_user(self.clients[0], self.keys, job_id)
                for client in self.clients[1:]:
                    with contextlib.suppress(redis.RedisError):  # a parameter-server Redis down
                        drop_job_user(client, self.keys, job_id)
            self.swept.add(job_id)
        return removed


def grant_job_user(
    client: redis.Redis,
    keys: Keys,
    info: AllocationInfo,
    ps_clients: Sequence[redis.Redis] = (),
) -> str:
    """Let one more allocation in as its job's Redis user (created with the first), on the
    main Redis and, for a job with server shards, on every parameter-server Redis; the
    password of its own login, the same on each."""
    password = secrets.token_urlsafe(24)
    rules = keys.job_user_rules(info.job_id, info.allocation_id, password)
    client.execute_command("ACL", "SETUSER", keys.job_user(info.job_id), *rules)
    if int(info.topology.get("nserver_groups", 0)) > 0:
        for ps_client in ps_clients:
            try:
                ps_client.execute_command("ACL", "SETUSER", keys.job_user(info.job_id), *rules)
            except redis.RedisError as exc:  # its shards there fail to log in, as if it were down
                log.warning("job %s: no user on a parameter-server Redis: %s", info.job_id, exc)
    return password


def drop_job_user(client: redis.Redis, keys: Keys, job_id: int) -> None:
    """The job's Redis user is deleted, and the connections logged in as it closed."""
    client.execute_command("ACL", "DELUSER", keys.job_user(job_id))


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


# -- the process -----------------------------------------------------------------------------
def run_scheduler(settings: Settings, stop: threading.Event) -> None:
    """Place jobs, track nodes and ingest job streams until `stop` is set, while this
    scheduler holds the lease (scheduler/daemon/lease.py); a second one waits for it.

    The database must be migrated already (`trainyard scheduler` and `trainyard up` do it).
    """
    if not settings.redis_url:
        raise RuntimeError("the scheduler needs Redis: set REDIS_URL (or TRAINYARD_REDIS_URL)")
    # RESP2: redis-py parses its replies about twice as fast as RESP3's (ingest throughput).
    client = redis.Redis.from_url(settings.redis_url, protocol=2)
    keys = Keys(settings.redis_prefix)
    lease = SchedulerLease(client, keys, settings.scheduler_lease_seconds)
    try:
        while lease.wait(stop):
            act(settings, client, keys, lease, stop)
    finally:
        lease.release()
        client.close()


def act(
    settings: Settings,
    client: redis.Redis,
    keys: Keys,
    lease: SchedulerLease,
    stop: threading.Event,
) -> None:
    """The scheduler's work, until `stop` is set or the lease is lost (a pause longer than
    the lease let another scheduler take over: this one goes back to waiting)."""
    db = Database(settings.sql_url())
    celery = create_celery(settings)
    settings.artifacts().mkdir(parents=True, exist_ok=True)
    pruning = TrialPruning(db, settings.sql_url())  # sweeps' trials: metrics to their pruners
    # The sweep thread's wake-up: the ingester saw a trial end, or the API announced a sweep.
    trial_ended = threading.Event()
    # The sweep thread's word to this loop (trials to place), the ingester's (slots freed) and
    # the API's (a job submitted).
    placement_due = threading.Event()
    ingester = Ingester(
        db,
        client,
        keys,
        pruning=pruning,
        artifacts=settings.artifacts(),
        trial_ended=trial_ended,
        slots_freed=placement_due,
    )
    halt = threading.Event()
    sweeps_args = (db, settings, client, keys, halt, trial_ended, placement_due)
    threads = [
        threading.Thread(target=ingester.run_until, args=(halt,), name="ingest"),
        threading.Thread(target=run_sweeps, args=sweeps_args, name="sweeps"),
        threading.Thread(target=run_webhooks, args=(db, settings, halt), name="webhooks"),
        threading.Thread(
            target=relay,
            args=(client, keys, halt, {JOB: placement_due, SWEEP: trial_ended}),
            name="announcements",
        ),
    ]
    for thread in threads:
        thread.start()
    tracker = NodeTracker()
    ps_clients = [
        redis.Redis.from_url(url) for url in settings.ps_urls() if url != settings.redis_url
    ]
    sweeper = KeySweeper(
        [client, *ps_clients],
        keys,
        artifacts=settings.artifacts(),
        job_users=settings.redis_job_users,
    )
    memo = PlanMemo()
    starts = StartWatch()
    try:
        while not stop.is_set():
            started = time.monotonic()
            try:
                if not lease.hold():
                    log.error("lost the scheduler lease to %s; waiting again", lease.holder_now())
                    return
                scheduling_pass(db, client, keys, celery, settings, tracker, sweeper, memo, starts)
                record_pass(client, keys, "schedule")
            except Exception:
                log.exception("scheduling pass failed; retrying")
            # `stop` is seen within a period; new trials and freed slots are used at once.
            placement_due.wait(max(settings.schedule_seconds - (time.monotonic() - started), 0))
            placement_due.clear()
    finally:
        halt.set()
        trial_ended.set()  # the sweep thread's wait ends too
        for thread in threads:
            thread.join()
        db.dispose()
        for ps_client in ps_clients:
            ps_client.close()


def scheduling_pass(
    db: Database,
    client: redis.Redis,
    keys: Keys,
    celery: Celery,
    settings: Settings,
    tracker: NodeTracker,
    sweeper: KeySweeper | None = None,
    memo: PlanMemo | None = None,
    starts: StartWatch | None = None,
) -> list[int]:
    """Node sync, then placement and dispatch; returns the ids of the allocations sent. With
    `memo`, the queue is planned again only when it, the nodes or the owners' shares changed,
    and each new plan is saved for GET /cluster; with `starts`, placed processes that never
    start are written off after the start timeout."""
    memo = memo if memo is not None else PlanMemo()
    reported = read_nodes(client, keys)
    with db.session() as session:
        stops = sync_nodes(
            session,
            reported,
            tracker,
            settings.node_timeout_seconds,
            artifacts=settings.artifacts(),
        )
    stop_allocations(client, keys, stops)
    try:
        with db.session() as session:
            items = replace_processes(session, settings) + schedule_once(session, settings, memo)
    except Exception:
        memo.seen = None  # not committed: the next pass plans again
        raise
    if memo.fresh and memo.decision is not None:
        save_plan(client, keys, memo.decision)
    ps_clients = [] if sweeper is None else sweeper.clients[1:]
    job_users = settings.redis_job_users
    dispatch(celery, client, keys, items, job_users=job_users, ps_clients=ps_clients)
    if sweeper is not None and sweeper.due(time.monotonic()):
        sweeper.last = time.monotonic()
        with db.session() as session:
            # Records or task messages lost (Redis restarted empty) are sent again; processes
            # nobody reports on any more are written off and their jobs placed again.
            resent = undispatched(session, settings, client)
            dispatch(celery, client, keys, resent, job_users=job_users, ps_clients=ps_clients)
            timeout = settings.node_timeout_seconds
            silent = silent_allocations(session, client, keys, tracker, timeout)
            stop_allocations(
                client,
                keys,
                write_off_silent(session, silent, timeout, settings.artifacts()),
            )
            if starts is not None:  # placed processes that never started
                late = write_off_unstarted(session, client, keys, starts, settings)
                stop_allocations(client, keys, late)
            ended = sweeper.ended_jobs(session)
        if ended:
            removed = sweeper.sweep(ended)
            log.info("deleted %d parameter-server key(s) of ended job(s) %s", removed, ended)
    return [item.allocation_id for item in items]
