"""Placed processes that never start: no job waits on a failure it cannot see.

A process the scheduler placed is PENDING until its node agent's RUNNING record is ingested. A
start that fails is reported as the process FAILED on the job's stream, with the step that
failed: by the node agent (scheduler/agent/node_agent.py: its claim, its Redis login, its memory
cgroup, the fork), or by the scheduler itself when it cannot dispatch it (`report_not_started`:
its job's Redis user, its record, its task). What is never reported (an agent stuck or stopped,
a record it may not read, a stream it may not write) is caught here: a process still PENDING
after `TRAINYARD_START_TIMEOUT_SECONDS` on the scheduler's clock is `Unstarted`, and the
recovery policy (scheduler/recovery/policy.py) places its job again or fails it. Its clock
starts again whenever its agent refreshes the allocation's `seen` time: an agent that
supervises the process is not stuck, its RUNNING record only late.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

import redis
from sqlalchemy import select
from sqlalchemy.orm import Session

from contract.allocation import AllocationInfo, AllocationState
from contract.keys import Keys
from contract.settings import Settings
from contract.stream import JobStream, StateRecord
from scheduler.daemon.nodes import seen_times, write_off_jobs
from scheduler.placement.cluster import LIVE_JOBS
from scheduler.recovery.policy import Unstarted
from scheduler.store.models import Allocation, Job

log = logging.getLogger("trainyard.scheduler")


@dataclass
class StartWatch:
    """How long each placed process has waited to start, on the scheduler's own clock: since
    this scheduler first saw it waiting, or since its agent last changed its `seen` time. A
    scheduler that starts again starts every clock again."""

    since: dict[int, tuple[str, float]] = field(default_factory=dict)  # id -> (seen, from)

    def overdue(self, waiting: Mapping[int, str], now: float, timeout: float) -> list[int]:
        """Of `waiting` (each waiting allocation's `seen` value, "" for none), those that have
        waited longer than `timeout`; allocations no longer waiting are forgotten."""
        kept: dict[int, tuple[str, float]] = {}
        late = []
        for alloc_id, seen in waiting.items():
            last = self.since.get(alloc_id)
            if last is None or last[0] != seen:
                last = (seen, now)
            kept[alloc_id] = last
            if now - last[1] > timeout:
                late.append(alloc_id)
        self.since = kept
        return sorted(late)


def unstarted_allocations(
    session: Session,
    client: redis.Redis,
    keys: Keys,
    watch: StartWatch,
    timeout: float,
    now: float | None = None,
) -> list[Allocation]:
    """The placed jobs' processes that have waited longer than `timeout` to start."""
    now = time.monotonic() if now is None else now
    pending = session.scalars(
        select(Allocation)
        .join(Job, Job.id == Allocation.job_id)
        .where(Allocation.state == AllocationState.PENDING, Job.state.in_(LIVE_JOBS))
        .order_by(Allocation.id)
    ).all()
    seen = seen_times(client, keys, pending)
    waiting = dict(zip((alloc.id for alloc in pending), seen, strict=True))
    late = set(watch.overdue(waiting, now, timeout))
    return [alloc for alloc in pending if alloc.id in late]


def write_off_unstarted(
    session: Session,
    client: redis.Redis,
    keys: Keys,
    watch: StartWatch,
    settings: Settings,
    now: float | None = None,
) -> list[int]:
    """Place the jobs of processes that never started within the start timeout again (a
    counted restart), or fail them, as the recovery policy decides; the allocations to stop."""
    timeout = settings.start_timeout_seconds
    late = unstarted_allocations(session, client, keys, watch, timeout, now)

    def reason(alloc: Allocation, where: str) -> str:
        return (
            f"{alloc.role} {alloc.group}/{alloc.rank}{where} did not start within {timeout:g}s "
            "(TRAINYARD_START_TIMEOUT_SECONDS): nothing reported it started or why it could "
            "not; its node agent may be stuck"
        )

    return write_off_jobs(session, late, Unstarted, reason, settings.artifacts())


def report_not_started(client: redis.Redis, keys: Keys, info: AllocationInfo, reason: str) -> None:
    """The scheduler could not dispatch a placed process (`reason`: contract.allocation's
    `not_started`): said on its job's stream as its agent would, so that the ingester hands it to
    the recovery policy. Where even that fails, the start timeout writes it off."""
    log.error("allocation %s (job %s) %s", info.allocation_id, info.job_id, reason)
    stream = JobStream(client, keys, info.job_id, info.attempt)
    try:
        stream.publish(StateRecord(info.allocation_id, AllocationState.FAILED, reason))
    except redis.RedisError as exc:
        log.error(
            "allocation %s: could not report it on its job's stream: %s", info.allocation_id, exc
        )
