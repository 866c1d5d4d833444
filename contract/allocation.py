"""The allocation record: one placed process of a job, as the scheduler writes it to Redis and
the node agent and the worker process read it, with the states a process goes through and the
codes it exits with. A node agent needs nothing else of the scheduler.

The scheduler fills the hash `Keys.allocation(id)` before it dispatches the Celery task that
carries only the id. Besides the `AllocationInfo` fields, the agent and the scheduler keep the
fields named below in that hash.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from contract.codec import from_fields, to_fields
from contract.keys import Keys

CLAIMED = "claimed"  # set once (HSETNX) by the agent that runs it: redeliveries are no-ops
FINISHED = "finished"  # the final state the agent reported
STOP = "stop"  # the scheduler wants this one process stopped (its node was lost)
DISPATCHED = "dispatched"  # when the Celery task was sent (unix time)
SEEN = "seen"  # when the agent last saw its process alive (every heartbeat)
PID = "pid"  # the process's id on its node
# The memory cgroup the agent made for the process (its folder; absent: none could be made),
# which the process joins before it does anything else (workers/confine.py).
CGROUP = "cgroup"
# The password of the allocation's own Redis login as its job's user (Keys.job_user), when the
# scheduler creates job users: the agent hands its process a URL with it, and no other.
REDIS_PASSWORD = "redis_password"


class ExitCode(enum.IntEnum):
    """How a worker process (`python -m workers.entry`) ends."""

    OK = 0  # trained to the end
    FAILED = 1
    INVALID = 2  # the job cannot run here
    CANCELLED = 3
    # Stopped to leave its node (the agent's SIGTERM); it saved a restart point if it could.
    DRAINED = 4
    DIVERGED = 5  # the loss became NaN or infinite: a restart would diverge again
    # Past its memory limit (memory_mb): killed by its memory cgroup (the agent reports this
    # code for it) or refused an allocation under RLIMIT_DATA. A restart would do the same.
    OUT_OF_MEMORY = 6


class AllocationState(enum.StrEnum):
    """A placed process's state, as its agent reports it (StateRecord) and SQL keeps it."""

    PENDING = "PENDING"  # dispatched, its process not started yet
    RUNNING = "RUNNING"
    DONE = "DONE"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    DRAINED = "DRAINED"  # stopped by its node agent leaving; the job is placed again

    @property
    def active(self) -> bool:
        return self in (AllocationState.PENDING, AllocationState.RUNNING)


@dataclass(frozen=True)
class AllocationInfo:
    """One placed process of a job, as the scheduler writes it and a worker reads it."""

    allocation_id: int = field(metadata={"wire": None})  # the hash's key holds it
    job_id: int
    role: str  # worker | server
    group: int
    rank: int
    world: int  # workers in this worker group
    slots: int
    gpus: int
    node: str
    framework: str  # a training run's ("" for a prediction run)
    topology: dict[str, Any]
    spec: dict[str, Any]  # the execution spec: validated, dataset names resolved to paths
    run_dir: Path
    # What its job's processes do, a run kind's name (dsl/run_kinds.py): train, or score a
    # dataset's rows as `prediction` says; an older scheduler's records are a training run's.
    kind: str = "training"
    attempt: int = 0  # the job's placements before this one (restarts, drains, lost nodes)
    resume_from: str = ""  # the restart point this attempt continues from ("": step 0)
    restart_seconds: float = 0.0  # restart points every this many seconds (0: none)
    # An asynchronous framework's worker restarted alone continues from this step, with the
    # parameters the server shards hold.
    start_step: int = 0
    # How many processes held this place (role, group, rank) before this one: 0 when the job
    # is placed, n for its n-th replacement. A pipeline restarted alone meets under a key of
    # its own, never the one of its stopped stages.
    replacement: int = 0
    # The most memory (MB) the process may use: the job's cluster.resources.memory_mb, else
    # its slots' share of its node's memory (0: no limit, a node that does not say).
    memory_mb: int = 0
    # The node's GPUs this process alone uses, by index (its CUDA_VISIBLE_DEVICES): placement
    # never gives one to two processes at once.
    devices: tuple[int, ...] = ()
    # A prediction run's task (contract/prediction.py PredictionTask.to_dict()): the model, the
    # dataset and how to score it. None for a training run's processes.
    prediction: dict[str, Any] | None = None

    def to_hash(self) -> dict[str, str]:
        return to_fields(self)

    @classmethod
    def from_hash(cls, allocation_id: int, fields: dict[str, str]) -> AllocationInfo:
        return from_fields(cls, fields, allocation_id=allocation_id)


NOT_STARTED = "did not start: "


def not_started(step: str, error: BaseException) -> str:
    """The reason a placed process never ran, as its node agent or the scheduler reports it (a
    FAILED StateRecord without an exit code): the step of its start that failed, and the error.
    The job's events and error name it after the process ("worker 0/0 on n1 did not start: ...")."""
    return f"{NOT_STARTED}{step} ({type(error).__name__}: {error})"


def never_started(state: str, exit_code: int | None, reason: str) -> bool:
    """Whether a process's end record says it never ran (`not_started`'s report)."""
    return state == AllocationState.FAILED and exit_code is None and reason.startswith(NOT_STARTED)


def stop_requested(client: redis.Redis, keys: Keys, job_id: int, allocation_id: int) -> bool:
    """The user cancelled the job, or the scheduler stopped this allocation."""
    pipe = client.pipeline(transaction=False)
    pipe.exists(keys.cancel(job_id))
    pipe.hexists(keys.allocation(allocation_id), STOP)
    cancelled, stopped = pipe.execute()
    return bool(cancelled) or bool(stopped)
