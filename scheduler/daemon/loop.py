"""The scheduler process: its passes and the threads beside them.

Every pass: sync the nodes the agents registered in Redis into SQL (marking the silent ones
lost, their jobs placed again once: scheduler/daemon/nodes.py), then place queued jobs whole in
fair-share order and fill the vacant places of placed jobs (scheduler/daemon/placing.py), and
dispatch each new allocation (scheduler/daemon/dispatch.py); every few seconds also send again
what may be lost, write off silent and unstarted processes and sweep ended jobs' keys
(scheduler/daemon/key_sweep.py). The ingester (job streams into SQL rows and job states) and
the sweeps (trials asked of each sweep's study, results told) run beside it in threads of their
own. A sweep's next trial does not wait for their periods: the ingester wakes the sweep thread
when a trial ends, and the sweep thread wakes placement when it has created trials.
"""

from __future__ import annotations

import logging
import threading
import time

import redis
from celery import Celery

from contract.announcements import JOB, SWEEP, relay
from contract.keys import Keys
from contract.liveness import record_pass
from contract.settings import Settings
from scheduler.celery_app import create_celery
from scheduler.daemon.dispatch import dispatch, stop_allocations, undispatched
from scheduler.daemon.key_sweep import KeySweeper
from scheduler.daemon.lease import SchedulerLease
from scheduler.daemon.nodes import (
    NodeTracker,
    read_nodes,
    silent_allocations,
    sync_nodes,
    write_off_silent,
)
from scheduler.daemon.placing import PlanMemo, replace_processes, schedule_once
from scheduler.daemon.starts import StartWatch, write_off_unstarted
from scheduler.daemon.sweep_thread import TrialPruning, run_sweeps
from scheduler.daemon.webhooks import run_webhooks
from scheduler.ingest.ingester import Ingester
from scheduler.placement.cluster import save_plan
from scheduler.store.database import Database

log = logging.getLogger("trainyard.scheduler")


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
