"""The states of jobs, sweeps and nodes, and which way a job's state may move: plain enums, so
that pure decisions (scheduler/recovery/policy.py, placement) read them without SQL.

QUEUED -> SCHEDULED -> RUNNING -> SUCCEEDED | FAILED | CANCELLED. A job whose node is lost
goes back to QUEUED to be placed again; any live state may end in FAILED or CANCELLED. A
sweep's trial that trails the others is PRUNED by the sweep's pruner once placed.
"""

from __future__ import annotations

import enum


class JobState(enum.StrEnum):
    QUEUED = "QUEUED"
    SCHEDULED = "SCHEDULED"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    PRUNED = "PRUNED"  # a sweep's trial stopped early by the sweep's pruner

    @property
    def terminal(self) -> bool:
        return self in (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.PRUNED)


class SweepState(enum.StrEnum):
    RUNNING = "RUNNING"  # asking for trials, or waiting for them to end
    SUCCEEDED = "SUCCEEDED"  # every trial ended, and at least one completed
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"

    @property
    def terminal(self) -> bool:
        return self != SweepState.RUNNING


class NodeState(enum.StrEnum):
    ALIVE = "ALIVE"
    DRAINING = "DRAINING"  # its agent is stopping: takes no new work
    LOST = "LOST"


ALLOWED: dict[JobState, set[JobState]] = {
    JobState.QUEUED: {JobState.SCHEDULED, JobState.CANCELLED, JobState.FAILED},
    JobState.SCHEDULED: {
        JobState.RUNNING,
        JobState.QUEUED,
        JobState.SUCCEEDED,
        JobState.FAILED,
        JobState.CANCELLED,
        JobState.PRUNED,
    },
    JobState.RUNNING: {
        JobState.SUCCEEDED,
        JobState.FAILED,
        JobState.CANCELLED,
        JobState.QUEUED,
        JobState.PRUNED,
    },
    JobState.SUCCEEDED: set(),
    JobState.FAILED: set(),
    JobState.CANCELLED: set(),
    JobState.PRUNED: set(),
}


def can_transition(current: str, new: JobState) -> bool:
    return new in ALLOWED[JobState(current)]
