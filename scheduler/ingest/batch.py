"""Stream records -> SQL rows and job states: what the ingester (scheduler/ingest/ingester.py)
writes for one batch of a job's stream, in one transaction.

Allocation state records drive the job's state: the first RUNNING starts it; what a process's
end means for its job (finished, placed again from its restart point, a worker restarted alone, a
shard replaced, failed) is the recovery policy's decision (scheduler/recovery/policy.py), carried
out here by scheduler/recovery/actions.py. A sweep's trial sends its metric to the sweep's
pruner (`Pruning`), which may end it PRUNED. The job's objective (its row's, resolved when it was
checked) gives its best metric and step; a job's event (a run that stopped early) joins its
events; the checkpoint of the objective's best step is marked; each worker's environment is
kept.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol, cast

from sqlalchemy import Table, func, insert, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from contract import stream
from contract.allocation import AllocationState, never_started
from scheduler.recovery.actions import (
    best_of,
    fail,
    job_facts,
    replace_shard,
    requeue,
    restart_alone,
)
from scheduler.recovery.policy import (
    Ended,
    Fail,
    Finish,
    ReplaceShard,
    Requeue,
    RestartAlone,
    decide,
)
from scheduler.store.artifacts import confine_to_job
from scheduler.store.environments import save_environments
from scheduler.store.lifecycle import transition
from scheduler.store.models import (
    Allocation,
    CheckpointRecord,
    Job,
    JobEvent,
    LogLine,
    Metric,
    Node,
    PipelineTimeline,
    utcnow,
)
from scheduler.store.states import JobState, can_transition

log = logging.getLogger("trainyard.ingest")

MAX_NAME = 64  # Metric.name's column width
METRICS = cast(Table, Metric.__table__)
LOGS = cast(Table, LogLine.__table__)
TIMELINES = cast(Table, PipelineTimeline.__table__)


@dataclass(frozen=True)
class Pruned:
    """A trial the sweep's pruner stopped: at which step (the rung), and why."""

    step: int
    reason: str


class Pruning(Protocol):
    """Decides, from a job's new metric rows, whether its sweep's pruner stops it (asked before
    the batch's transaction; None for a job that is no sweep's trial)."""

    def pruned_at(self, job_id: int, rows: list[dict[str, Any]]) -> Pruned | None: ...


@dataclass
class Batch:
    """One read of a job's stream, parsed into rows."""

    metrics: list[dict[str, Any]] = field(default_factory=list)
    logs: list[dict[str, Any]] = field(default_factory=list)
    # step -> (path, size, the objective's best so far)
    checkpoints: dict[int, tuple[str, int, bool]] = field(default_factory=dict)
    # (group, rank) -> the stage's last timeline in the batch: only the latest is stored
    timelines: dict[tuple[int, int], stream.TimelineRecord] = field(default_factory=dict)
    states: list[stream.StateRecord] = field(default_factory=list)
    events: list[stream.EventRecord] = field(default_factory=list)
    environments: list[stream.EnvironmentRecord] = field(default_factory=list)
    max_step: int | None = None
    latest: dict[str, float] = field(default_factory=dict)  # group 0 rank 0, finite values
    # A checkpoint's path must lie in its job's run directory in here (UnsafePath, a
    # ValueError, drops the record); None: any
    artifacts: Path | None = None

    def add(self, job_id: int, record: stream.Record) -> None:
        match record:
            case stream.MetricRecord():
                self._metric(job_id, record)
            case stream.LogRecord():
                self.logs.append(
                    {
                        "job_id": job_id,
                        "at": record.time,
                        "grp": record.group,
                        "rank": record.rank,
                        "line": record.line,
                    }
                )
            case stream.CheckpointRecord():
                path = record.path
                if self.artifacts is not None:
                    what = f"job {job_id}'s checkpoint at step {record.step}"
                    path = str(confine_to_job(path, self.artifacts, job_id, what=what))
                best = record.best or self.checkpoints.get(record.step, ("", 0, False))[2]
                self.checkpoints[record.step] = (path, record.size, best)
            case stream.TimelineRecord():
                self.timelines[(record.group, record.rank)] = record
            case stream.StateRecord():
                # An unknown state makes the record malformed (ValueError).
                self.states.append(replace(record, state=AllocationState(record.state)))
            case stream.EventRecord():
                self.events.append(record)
            case stream.EnvironmentRecord():
                self.environments.append(record)

    def _metric(self, job_id: int, record: stream.MetricRecord) -> None:
        step, group, rank, at = record.step, record.group, record.rank, record.time
        for name, value in record.values.items():
            # SQLite turns NaN into NULL and JSON carries neither NaN nor infinity: a value
            # that is not a finite number is not stored.
            if isinstance(value, bool) or not isinstance(value, int | float):
                continue
            if not math.isfinite(value):
                continue
            value = float(value)
            self.metrics.append(
                {
                    "job_id": job_id,
                    "name": name[:MAX_NAME],
                    "step": step,
                    "value": value,
                    "grp": group,
                    "rank": rank,
                    "at": at,
                }
            )
            if group == 0 and rank == 0:
                self.latest[name] = value
        self.max_step = step if self.max_step is None else max(self.max_step, step)


def parse_batch(
    job_id: int,
    entries: list[tuple[Any, Any]],
    attempt: int = 0,
    artifacts: Path | None = None,
) -> Batch:
    """The batch's records; metrics and timelines of attempts before `attempt` (processes of
    a placement the job restarted from, still stopping) are dropped."""
    batch = Batch(artifacts=artifacts)
    for entry_id, raw in entries:
        if not raw:  # trimmed from the stream while pending
            continue
        try:
            record = stream.decode_record(raw)
            stale = stream.entry_attempt(raw) < attempt
            if stale and isinstance(record, stream.MetricRecord | stream.TimelineRecord):
                continue
            batch.add(job_id, record)
        except ValueError as exc:  # RecordError, or a state that is no AllocationState
            log.warning("job %s: dropped malformed record %r: %s", job_id, entry_id, exc)
    return batch


def _who(session: Session, alloc: Allocation) -> str:
    node = session.get(Node, alloc.node_id)
    where = f" on {node.name}" if node else ""
    return f"{alloc.role} {alloc.group}/{alloc.rank}{where}"


def _move(session: Session, job: Job, state: JobState, reason: str) -> None:
    if can_transition(job.state, state):
        transition(session, job, state, reason)
    else:
        log.warning("job %s: ignored %s -> %s (%s)", job.id, job.state, state, reason)


@dataclass
class Effects:
    """What applying a batch asks of Redis once it is committed: processes to stop."""

    stops: list[int] = field(default_factory=list)
    artifacts: Path | None = None  # where run directories (and restart points) are


def apply_state(
    session: Session, job: Job, record: stream.StateRecord, effects: Effects | None = None
) -> None:
    """One process's state change, and what the recovery policy makes of it for its job."""
    effects = effects or Effects()
    alloc = session.get(Allocation, record.allocation_id)
    # Records of processes already written off (lost node, earlier attempt) change nothing.
    if alloc is None or alloc.job_id != job.id or not AllocationState(alloc.state).active:
        return
    who = _who(session, alloc)
    if record.state == AllocationState.RUNNING:
        alloc.state = AllocationState.RUNNING
        if job.state == JobState.SCHEDULED:
            _move(session, job, JobState.RUNNING, f"{who} started")
        return
    alloc.state, alloc.exit_code, alloc.ended_at = record.state, record.exit_code, utcnow()
    event = Ended(
        job=job_facts(job),
        who=who,
        role=alloc.role,
        state=AllocationState(record.state),
        exit_code=record.exit_code,
        reason=record.reason,
        shard_failures=_shard_failures(session, job),
        workers=_current_workers(session, job),
        step=job.step,
    )
    match decide(event):
        case Finish(state=state, reason=reason):
            _move(session, job, state, reason)
        case Fail() as failure:
            fail(session, job, failure)
        case Requeue(cause=cause, counted=counted):
            # A process that never started: the job goes elsewhere if another node can take it.
            unstarted = never_started(record.state, record.exit_code, record.reason)
            node = session.get(Node, alloc.node_id) if unstarted else None
            effects.stops += requeue(
                session,
                job,
                cause,
                artifacts=effects.artifacts,
                counted=counted,
                avoid=[node.name] if node is not None else [],
            )
        case RestartAlone() as alone:
            effects.stops += restart_alone(session, job, alloc, alone)
        case ReplaceShard() as shard:
            replace_shard(session, job, shard)


def _shard_failures(session: Session, job: Job) -> int:
    """The job's server processes that failed since it was last placed (earlier placements'
    shards do not count)."""
    session.flush()
    query = select(func.count(Allocation.id)).where(
        Allocation.job_id == job.id,
        Allocation.role == "server",
        Allocation.state == AllocationState.FAILED,
    )
    if job.scheduled_at is not None:
        query = query.where(Allocation.ended_at >= job.scheduled_at)
    return session.scalar(query) or 0


def _current_workers(session: Session, job: Job) -> tuple[AllocationState, ...]:
    """The state of the newest process of each of the job's workers: the others belong to
    earlier attempts."""
    session.flush()
    workers = session.scalars(
        select(Allocation)
        .where(Allocation.job_id == job.id, Allocation.role == "worker")
        .order_by(Allocation.id)
    ).all()
    current = {(a.group, a.rank): a for a in workers}.values()
    return tuple(AllocationState(a.state) for a in current)


def apply_batch(
    session: Session,
    job: Job,
    batch: Batch,
    pruned: Pruned | None = None,
    effects: Effects | None = None,
) -> None:
    # Core inserts (executemany) of plain rows: about twice as fast as the ORM's bulk path.
    if batch.metrics:
        session.execute(insert(METRICS), batch.metrics)
    if batch.logs:
        session.execute(insert(LOGS), batch.logs)
    for step, (path, size, best) in sorted(batch.checkpoints.items()):
        if best:  # the objective's new best: the one checkpoint of the job marked so
            session.execute(
                update(CheckpointRecord)
                .where(CheckpointRecord.job_id == job.id, CheckpointRecord.best)
                .values(best=False)
            )
        existing = session.scalar(
            select(CheckpointRecord).where(
                CheckpointRecord.job_id == job.id, CheckpointRecord.step == step
            )
        )
        if existing is None:
            session.add(CheckpointRecord(job_id=job.id, step=step, path=path, size=size, best=best))
        else:  # the same step saved again by a later attempt, or marked the best
            existing.path, existing.size, existing.created_at = path, size, utcnow()
            existing.best = existing.best or best
    if batch.timelines:
        upsert_timelines(session, job.id, list(batch.timelines.values()))
    if batch.max_step is not None:
        job.step = batch.max_step
    if batch.latest:
        job.summary = {**(job.summary or {}), **batch.latest}
    found = best_of(
        ((row["step"], row["value"]) for row in batch.metrics if _counts(job, row)),
        job.objective_mode,
        (job.best_step, job.best_metric) if job.best_metric is not None else None,
    )
    if found is not None:
        job.best_step, job.best_metric = found
    if batch.environments:
        save_environments(session, job.id, batch.environments)
    for event in batch.events:
        session.add(JobEvent(job_id=job.id, at=utcnow(), state=job.state, reason=event.message))
    for record in batch.states:
        apply_state(session, job, record, effects)
    if pruned is not None and can_transition(job.state, JobState.PRUNED):
        job.pruned_step = pruned.step
        transition(session, job, JobState.PRUNED, pruned.reason)


def _counts(job: Job, row: dict[str, Any]) -> bool:
    """Whether a metric row is a value of the job's objective, as its first worker reported."""
    return row["name"] == job.objective and row["grp"] == 0 and row["rank"] == 0


def upsert_timelines(session: Session, job_id: int, timelines: list[stream.TimelineRecord]) -> None:
    """Each stage's row becomes its newest timeline. The stream's order decides, not the step:
    a job placed again (its node was lost) goes on from its last checkpoint, at a lower step.
    One record per (group, rank): PostgreSQL refuses to update a row twice in one statement."""
    dialect = session.get_bind().dialect.name
    statement = (postgresql.insert if dialect == "postgresql" else sqlite.insert)(TIMELINES)
    upsert = statement.on_conflict_do_update(
        index_elements=[TIMELINES.c.job_id, TIMELINES.c.grp, TIMELINES.c.rank],
        set_={"step": statement.excluded.step, "events": statement.excluded.events},
    )
    rows = [
        {
            "job_id": job_id,
            "grp": record.group,
            "rank": record.rank,
            "step": record.step,
            "events": [list(event) for event in record.events],
        }
        for record in timelines
    ]
    session.execute(upsert, rows)
