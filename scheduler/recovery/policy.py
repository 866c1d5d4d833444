"""What a job's failure means: one pure function, `decide`, from plain facts to a decision.

The callers gather the facts from SQL and carry the decision out (scheduler/recovery/actions.py
holds what changes rows and files):

- the ingester (scheduler/ingest/batch.py), when a process's state record says it `Ended`;
- the node sync (scheduler/daemon/nodes.py), for each job of a `NodeLost`, and for each job
  with a `Silent` process (its agent stopped vouching for it);
- the start watch (scheduler/daemon/starts.py), for each job with an `Unstarted` process (placed,
  and not reported started within the start timeout);
- the scheduler's pass (scheduler/daemon/placing.py), for a `Vacant` place: a failed process of a
  placed job that nothing replaced yet.

No database, no Redis, no files here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, overload

from contract.allocation import AllocationState, ExitCode
from scheduler.store.states import JobState, can_transition

# A job's server shards keep their state in Redis, so a dead one is placed again (by the
# scheduler) and continues where it stopped, this many times per placement of the job.
MAX_SHARD_REPLACEMENTS = 3
# How a worker process ends when a restart would end the same way: the job fails at once.
FINAL_EXITS = (ExitCode.INVALID, ExitCode.DIVERGED, ExitCode.OUT_OF_MEMORY)
MEMORY_HINT = (
    "not restarted, as it would pass its limit again: raise cluster.resources.memory_mb (up "
    "to its slots' share of a node's memory; more slots_per_worker bring more), or use a "
    "smaller batch_size or net"
)

# What a framework restarts after a worker fails (dsl.frameworks.FrameworkSpec.restart): the
# whole job from a restart point, or that worker alone from its last step.
Restart = Literal["gang", "alone"]


# -- the facts -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class JobFacts:
    """What recovery needs to know of a job (its row, read by the caller)."""

    state: JobState
    cancel_requested: bool
    restart: Restart  # its framework's
    pipelined: bool  # its workers are a pipeline's stages: none goes on without another
    restarts: int  # counted restarts so far
    max_restarts: int  # cluster.max_restarts


@dataclass(frozen=True)
class Ended:
    """A process of the job ended: its own state record, read by the ingester."""

    job: JobFacts
    who: str  # the process as the job's events name it: "worker 0/1 on node-a"
    role: str  # "worker" or "server"
    state: AllocationState  # how it ended: DONE, FAILED, DRAINED, CANCELLED
    exit_code: int | None
    reason: str  # its record's
    # The job's server processes that failed since the job was last placed, this one included.
    shard_failures: int
    # The state of the newest process of each of the job's workers, this one's included.
    workers: tuple[AllocationState, ...]
    step: int = 0  # the last training step the job reported


@dataclass(frozen=True)
class NodeLost:
    """The job had processes on a node that went silent or left: they are gone, and with them
    the gang."""

    job: JobFacts
    reason: str  # "node lost: n1 sent no heartbeat for 3s"
    counted: bool  # False: the node left cleanly (its agent drained), not a failure


@dataclass(frozen=True)
class Silent:
    """A running process of the job that its node agent no longer vouches for (the agent is
    stuck, or Redis restarted empty and lost its records), on a node still heard from."""

    job: JobFacts
    reason: str


@dataclass(frozen=True)
class Vacant:
    """The newest process in one place (role, group, rank) of a placed job failed, and the job
    runs on: no process took its place yet."""

    job: JobFacts
    role: str


@dataclass(frozen=True)
class Unstarted:
    """A placed process of the job that nothing reported started (nor failed to start) within
    the start timeout: its task or its agent is stuck, or what went wrong could not be said."""

    job: JobFacts
    reason: str


Event = Ended | NodeLost | Silent | Unstarted | Vacant


# -- the decisions -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Continue:
    """The job's state stays: it runs on (other workers still train), it has ended already, or
    its cancellation ends it."""


@dataclass(frozen=True)
class Finish:
    """The job ends: SUCCEEDED (every worker done) or CANCELLED."""

    state: JobState
    reason: str


@dataclass(frozen=True)
class Fail:
    """The job fails with `error`; `reason` is its FAILED event's."""

    error: str
    reason: str


@dataclass(frozen=True)
class Requeue:
    """The job is placed again from its latest restart point; `counted` against
    cluster.max_restarts (a failure) or not (a drain)."""

    cause: str
    counted: bool


@dataclass(frozen=True)
class RestartAlone:
    """The failed worker restarts alone (a counted restart) while the others train on; the
    scheduler places its new process (`PlaceAgain`). With `group`, the other workers of its
    group (a pipeline's stages, which train only together) are stopped and restart with it."""

    cause: str
    group: bool = False


@dataclass(frozen=True)
class ReplaceShard:
    """The failed server shard is placed again (`PlaceAgain`) and continues from Redis; the job
    runs on, its workers waiting for the shard's updates. `note` is the job's event."""

    note: str


@dataclass(frozen=True)
class PlaceAgain:
    """A new process is placed where the failed one was (what ReplaceShard and RestartAlone
    leave to the scheduler's pass)."""


Decision = Continue | Finish | Fail | Requeue | RestartAlone | ReplaceShard | PlaceAgain


# -- the policy ----------------------------------------------------------------------------------
@overload
def decide(event: Ended) -> Continue | Finish | Fail | Requeue | RestartAlone | ReplaceShard: ...
@overload
def decide(event: NodeLost | Silent | Unstarted) -> Continue | Finish | Fail | Requeue: ...
@overload
def decide(event: Vacant) -> Continue | PlaceAgain: ...
def decide(event: Event) -> Decision:
    """What `event` means for its job."""
    if isinstance(event, Ended):
        return _ended(event)
    if isinstance(event, Vacant):
        return _vacant(event)
    return _lost(event)


def _ended(event: Ended) -> Continue | Finish | Fail | Requeue | RestartAlone | ReplaceShard:
    job = event.job
    if job.state.terminal:
        return Continue()
    if event.state == AllocationState.FAILED:
        return _failed(event)
    if event.state == AllocationState.DRAINED:
        if job.cancel_requested:
            return Finish(JobState.CANCELLED, "cancelled by the user")
        if can_transition(job.state, JobState.QUEUED):
            return Requeue(f"{event.who}: {event.reason}", counted=False)
        return Continue()
    if event.state == AllocationState.CANCELLED:
        reason = "cancelled by the user" if job.cancel_requested else f"{event.who}: {event.reason}"
        return Finish(JobState.CANCELLED, reason)
    done = event.state == AllocationState.DONE
    if done and event.workers and all(s == AllocationState.DONE for s in event.workers):
        return Finish(JobState.SUCCEEDED, f"all {len(event.workers)} worker(s) finished")
    return Continue()


def _failed(event: Ended) -> Fail | Requeue | RestartAlone | ReplaceShard:
    job, who = event.job, event.who
    reason = event.reason or f"{who} failed"
    if event.exit_code == ExitCode.OUT_OF_MEMORY and not job.cancel_requested:
        # Deterministic: the same job passes the same limit at about the same step again.
        # Not a lost machine: the limit did its work, and only this process died.
        error = f"{who} {headline(event.reason, None)} at step {event.step}; {MEMORY_HINT}"
        return Fail(error=error, reason=error)
    placed = job.state in (JobState.SCHEDULED, JobState.RUNNING)
    if (
        event.role == "server"
        and placed
        and not job.cancel_requested
        and event.shard_failures <= MAX_SHARD_REPLACEMENTS
    ):
        return ReplaceShard(f"{who} failed: {reason}; it is placed again and continues from Redis")
    # A job that cannot be built or read its data here (ExitCode.INVALID), or whose loss
    # diverged (ExitCode.DIVERGED: its restart point holds the same parameters and data
    # order), would fail the same way again; any other failure (a killed process, a peer's)
    # is restarted.
    if not job.cancel_requested and event.exit_code not in FINAL_EXITS:
        cause = f"{who} {headline(event.reason, event.exit_code)}" if event.reason else reason
        left = job.restarts < job.max_restarts
        if event.role == "worker" and job.restart == "alone" and left:
            return RestartAlone(cause, group=job.pipelined)
        if left and can_transition(job.state, JobState.QUEUED):
            return Requeue(cause, counted=True)
    return Fail(error=reason, reason=f"{who} failed: {reason}")


def _lost(event: NodeLost | Silent | Unstarted) -> Continue | Finish | Fail | Requeue:
    """A lost process cannot report its end: the caller writes off what still runs of the job
    whatever the decision (a requeue does it as its first step)."""
    job = event.job
    if job.state.terminal:
        return Continue()
    may_requeue = can_transition(job.state, JobState.QUEUED)
    left = job.restarts < job.max_restarts
    if isinstance(event, Silent):
        if job.cancel_requested:
            return Continue()
        if may_requeue and left:
            return Requeue(event.reason, counted=True)
        return Fail(error=event.reason, reason=event.reason)
    if isinstance(event, Unstarted):
        if job.cancel_requested:  # nothing of it runs: the cancellation is done
            return Finish(JobState.CANCELLED, f"cancelled by the user ({event.reason})")
        if may_requeue and left:
            return Requeue(event.reason, counted=True)
        error = f"{event.reason} (no restarts left: cluster.max_restarts is {job.max_restarts})"
        return Fail(error=error, reason=error)
    if job.cancel_requested:
        # Its processes went with the node: the cancellation its user asked for is done.
        return Finish(JobState.CANCELLED, f"cancelled by the user ({event.reason})")
    if may_requeue and (left or not event.counted):
        return Requeue(event.reason, counted=event.counted)
    error = f"{event.reason} (no restarts left: cluster.max_restarts is {job.max_restarts})"
    return Fail(error=error, reason=error)


def _vacant(event: Vacant) -> Continue | PlaceAgain:
    job = event.job
    if job.cancel_requested:
        return Continue()
    if event.role == "server" or (event.role == "worker" and job.restart == "alone"):
        return PlaceAgain()
    return Continue()


def headline(reason: str, exit_code: int | None) -> str:
    """A failure's first line (how the process ended) and, for a process that exited on its
    own, the last line of its output (the exception), so a restarted job's event still says
    why. A killed process's last output says nothing of its end."""
    lines = [line.strip() for line in reason.splitlines() if line.strip()]
    if not lines:
        return reason
    if len(lines) == 1 or exit_code is None or exit_code < 0:
        return lines[0]
    return f"{lines[0]}: {lines[-1]}"
