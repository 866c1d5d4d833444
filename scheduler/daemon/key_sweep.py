"""Clean-up of ended jobs' keys: their parameter-server keys on every Redis, their restart
points and their Redis users, deleted once their processes have all stopped."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

import redis
from sqlalchemy import select
from sqlalchemy.orm import Session

from contract.keys import Keys, delete_matching
from scheduler.daemon.job_users import drop_job_user
from scheduler.placement.cluster import ACTIVE_ALLOCATIONS
from scheduler.recovery.actions import prune_restart_points
from scheduler.store.models import Allocation, Job, utcnow
from scheduler.store.states import JobState

# Ended jobs' parameter-server keys are deleted by the scheduler that saw them end; one started
# later also sweeps the jobs that ended in this window before it.
KEY_SWEEP_WINDOW = timedelta(hours=24)
KEY_SWEEP_SECONDS = 5.0


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
