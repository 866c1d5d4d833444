"""The ingester: job streams in Redis -> metrics, logs, checkpoints, timelines and states in SQL.

One consumer group ("ingest") reads each job's stream in batches of up to 5000 records. A
batch is written in ONE transaction (bulk inserts) and acknowledged (XACK) only after the
commit, so a crash loses nothing: unacknowledged records are read again from the group's
pending list when the ingester starts (at-least-once). Allocation state records drive the
job's state: the first RUNNING starts it, all workers DONE finish it, one FAILED fails it. A
sweep's trial sends its metric to the sweep's pruner (`Pruning`), which may end it PRUNED.
"""

from __future__ import annotations

import logging
import math
import threading
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol, cast

import redis
from sqlalchemy import Table, insert, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from contract import records
from contract.records import (
    CANCEL_TTL_SECONDS,
    STREAM_TTL_SECONDS,
    Keys,
    decode,
    decode_record,
)
from scheduler.db import Database
from scheduler.lifecycle import can_transition, transition
from scheduler.models import (
    Allocation,
    AllocationState,
    CheckpointRecord,
    Job,
    JobEvent,
    JobState,
    LogLine,
    Metric,
    Node,
    PipelineTimeline,
    utcnow,
)
from scheduler.paths import confine

log = logging.getLogger("trainyard.ingest")

GROUP = "ingest"
CONSUMER = "ingester"
BATCH = 5000
IDLE_SECONDS = 0.05  # between passes that found nothing to write
MAX_NAME = 64  # Metric.name's column width
SUMMARY_METRIC = "test/accuracy"
# A job's server shards keep their state in Redis, so a dead one is placed again (by the
# scheduler) and continues where it stopped, this many times per placement of the job.
MAX_SHARD_REPLACEMENTS = 3
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
    checkpoints: dict[int, tuple[str, int]] = field(default_factory=dict)  # step -> (path, size)
    # (group, rank) -> the stage's last timeline in the batch: only the latest is stored
    timelines: dict[tuple[int, int], records.TimelineRecord] = field(default_factory=dict)
    states: list[records.StateRecord] = field(default_factory=list)
    max_step: int | None = None
    latest: dict[str, float] = field(default_factory=dict)  # group 0 rank 0, finite values
    best: float | None = None
    # Checkpoint paths must lie in here (UnsafePath, a ValueError, drops the record); None: any
    artifacts: Path | None = None

    def add(self, job_id: int, record: records.Record) -> None:
        match record:
            case records.MetricRecord():
                self._metric(job_id, record)
            case records.LogRecord():
                self.logs.append(
                    {
                        "job_id": job_id,
                        "at": record.time,
                        "grp": record.group,
                        "rank": record.rank,
                        "line": record.line,
                    }
                )
            case records.CheckpointRecord():
                path = record.path
                if self.artifacts is not None:
                    what = f"job {job_id}'s checkpoint at step {record.step}"
                    path = str(confine(path, self.artifacts, what=what))
                self.checkpoints[record.step] = (path, record.size)
            case records.TimelineRecord():
                self.timelines[(record.group, record.rank)] = record
            case records.StateRecord():
                # An unknown state makes the record malformed (ValueError).
                self.states.append(replace(record, state=AllocationState(record.state)))

    def _metric(self, job_id: int, record: records.MetricRecord) -> None:
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
                if name == SUMMARY_METRIC:
                    self.best = value if self.best is None else max(self.best, value)
        self.max_step = step if self.max_step is None else max(self.max_step, step)


def parse_batch(
    job_id: int, entries: list[tuple[Any, Any]], artifacts: Path | None = None
) -> Batch:
    batch = Batch(artifacts=artifacts)
    for entry_id, raw in entries:
        if not raw:  # trimmed from the stream while pending
            continue
        try:
            batch.add(job_id, decode_record(raw))
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


def apply_state(session: Session, job: Job, record: records.StateRecord) -> None:
    """One process's state change, and what it means for its job."""
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
    if JobState(job.state).terminal:
        return
    if record.state == AllocationState.FAILED:
        reason = record.reason or f"{who} failed"
        if alloc.role == "server" and _may_replace_shard(session, job):
            # Not a transition: the job runs on, its workers waiting for the shard's updates.
            note = f"{who} failed: {reason}; it is placed again and continues from Redis"
            session.add(JobEvent(job_id=job.id, at=utcnow(), state=job.state, reason=note))
            return
        job.error = reason
        _move(session, job, JobState.FAILED, f"{who} failed: {job.error}")
    elif record.state == AllocationState.CANCELLED:
        reason = "cancelled by the user" if job.cancel_requested else f"{who}: {record.reason}"
        _move(session, job, JobState.CANCELLED, reason)
    elif record.state == AllocationState.DONE:
        session.flush()
        workers = session.scalars(
            select(Allocation).where(Allocation.job_id == job.id, Allocation.role == "worker")
        ).all()
        # FAILED allocations here belong to an earlier attempt (a failure in this one would
        # have failed the job already).
        current = [a for a in workers if a.state != AllocationState.FAILED]
        if current and all(a.state == AllocationState.DONE for a in current):
            _move(session, job, JobState.SUCCEEDED, f"all {len(current)} worker(s) finished")


def _may_replace_shard(session: Session, job: Job) -> bool:
    """Whether a shard of `job` that just failed is placed again: not for a job being
    cancelled, and at most MAX_SHARD_REPLACEMENTS times since the job was last placed."""
    if job.cancel_requested or job.state not in (JobState.SCHEDULED, JobState.RUNNING):
        return False
    session.flush()
    query = select(Allocation.id).where(
        Allocation.job_id == job.id,
        Allocation.role == "server",
        Allocation.state == AllocationState.FAILED,
    )
    if job.scheduled_at is not None:  # earlier placements' shards do not count
        query = query.where(Allocation.ended_at >= job.scheduled_at)
    return len(session.scalars(query).all()) <= MAX_SHARD_REPLACEMENTS


def apply_batch(session: Session, job: Job, batch: Batch, pruned: Pruned | None = None) -> None:
    # Core inserts (executemany) of plain rows: about twice as fast as the ORM's bulk path.
    if batch.metrics:
        session.execute(insert(METRICS), batch.metrics)
    if batch.logs:
        session.execute(insert(LOGS), batch.logs)
    for step, (path, size) in sorted(batch.checkpoints.items()):
        existing = session.scalar(
            select(CheckpointRecord).where(
                CheckpointRecord.job_id == job.id, CheckpointRecord.step == step
            )
        )
        if existing is None:
            session.add(CheckpointRecord(job_id=job.id, step=step, path=path, size=size))
        else:  # the same step saved again by a later attempt
            existing.path, existing.size, existing.created_at = path, size, utcnow()
    if batch.timelines:
        upsert_timelines(session, job.id, list(batch.timelines.values()))
    if batch.max_step is not None:
        job.step = batch.max_step
    if batch.latest:
        job.summary = {**(job.summary or {}), **batch.latest}
    if batch.best is not None:
        job.best_metric = (
            batch.best if job.best_metric is None else max(job.best_metric, batch.best)
        )
    for record in batch.states:
        apply_state(session, job, record)
    if pruned is not None and can_transition(job.state, JobState.PRUNED):
        job.pruned_step = pruned.step
        transition(session, job, JobState.PRUNED, pruned.reason)


def upsert_timelines(
    session: Session, job_id: int, timelines: list[records.TimelineRecord]
) -> None:
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


class Ingester:
    """Reads every job stream listed in Keys.streams_with_data; one instance per process."""

    def __init__(
        self,
        db: Database,
        client: redis.Redis,
        keys: Keys,
        *,
        count: int = BATCH,
        consumer: str = CONSUMER,
        pruning: Pruning | None = None,
        artifacts: Path | None = None,
    ) -> None:
        self.db, self.client, self.keys = db, client, keys
        self.artifacts = artifacts  # where checkpoint records may point
        self.count, self.consumer = count, consumer
        self.pruning = pruning  # a sweep's trials: their intermediate values to its pruner
        self._groups: set[str] = set()
        self._recovered: set[str] = set()  # streams whose pending records were re-read

    def run_once(self) -> int:
        """One batch from each job stream; the number of metric points written."""
        total = 0
        members: set[bytes] = self.client.smembers(self.keys.streams_with_data)  # type: ignore[assignment]
        for raw in sorted(members):
            text = raw.decode()
            if not text.isdigit():
                self.client.srem(self.keys.streams_with_data, raw)
                continue
            total += self.ingest_job(int(text))
        return total

    def run_until(self, stop: threading.Event) -> None:
        """Ingest until `stop` is set (the scheduler's ingest thread)."""
        while not stop.is_set():
            try:
                written = self.run_once()
            except Exception:
                log.exception("ingest pass failed; retrying")
                stop.wait(1.0)
                continue
            if written == 0:
                stop.wait(IDLE_SECONDS)

    def _read(self, stream: str) -> list[tuple[Any, Any]]:
        if stream not in self._groups:
            try:
                self.client.xgroup_create(stream, GROUP, id="0", mkstream=True)
            except redis.ResponseError as exc:
                if "BUSYGROUP" not in str(exc):
                    raise
            self._groups.add(stream)
        if stream not in self._recovered:
            # Records read before a crash or a failed commit are pending: read them again.
            pending = self._xread(stream, "0")
            if pending:
                return pending
            self._recovered.add(stream)
        return self._xread(stream, ">")

    def _xread(self, stream: str, start: str) -> list[tuple[Any, Any]]:
        reply: Any = self.client.xreadgroup(GROUP, self.consumer, {stream: start}, count=self.count)
        return list(reply[0][1]) if reply else []

    def ingest_job(self, job_id: int) -> int:
        stream = self.keys.job_stream(job_id)
        entries = self._read(stream)
        if not entries:  # nothing new: no transaction, only a look at whether the job ended
            with self.db.session() as session:
                state = session.scalar(select(Job.state).where(Job.id == job_id))
            if state is None or JobState(state).terminal:
                self._retire(job_id, stream)
            return 0
        batch = parse_batch(job_id, entries, self.artifacts)
        pruned = None
        if self.pruning is not None and batch.metrics:
            pruned = self.pruning.pruned_at(job_id, batch.metrics)
        found = ended = False  # the job exists; it became terminal in this batch
        try:
            with self.db.session() as session:
                job = session.get(Job, job_id, with_for_update=True)
                if job is not None:
                    found = True
                    was_terminal = JobState(job.state).terminal
                    apply_batch(session, job, batch, pruned)
                    terminal = JobState(job.state).terminal
                    ended = terminal and not was_terminal
        except Exception:
            self._recovered.discard(stream)
            raise
        pipe = self.client.pipeline(transaction=False)
        pipe.xack(stream, GROUP, *[entry_id for entry_id, _ in entries])
        written = len(batch.metrics) if found else 0
        if written:
            pipe.incrby(self.keys.ingested_points, written)
        if ended:
            # Processes of the job still running (siblings, servers) stop on this key.
            pipe.set(self.keys.cancel(job_id), "1", ex=CANCEL_TTL_SECONDS)
        pipe.execute()
        if (not found or terminal) and len(entries) < self.count:
            self._retire(job_id, stream)
        return written

    def _retire(self, job_id: int, stream: str) -> None:
        """Stop reading a finished job's stream once it is drained.

        A record published after the SREM adds the job back; one published just before it
        shows as undelivered, and then we add the job back ourselves.
        """
        self.client.srem(self.keys.streams_with_data, str(job_id))
        if not self._drained(stream):
            self.client.sadd(self.keys.streams_with_data, str(job_id))
            return
        self.client.expire(stream, STREAM_TTL_SECONDS)
        self._groups.discard(stream)
        self._recovered.discard(stream)

    def _drained(self, stream: str) -> bool:
        try:
            groups: Any = self.client.xinfo_groups(stream)
            info: Any = self.client.xinfo_stream(stream)
        except redis.ResponseError:  # the stream expired
            return True
        last = decode({"id": info["last-generated-id"]})["id"]
        for group in groups:
            values = decode(group)
            if values["name"] == GROUP:
                return int(values["pending"]) == 0 and values["last-delivered-id"] == last
        return False


def ingest_once(db: Database, client: redis.Redis, keys: Keys) -> int:
    """One pass over every job stream (pending records first); metric points written."""
    return Ingester(db, client, keys).run_once()
