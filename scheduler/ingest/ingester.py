"""The ingester: job streams in Redis -> metrics, logs, checkpoints, timelines and states in SQL.

One consumer group ("ingest") reads each job's stream in batches of up to 5000 records. A
batch is written in ONE transaction (bulk inserts, scheduler/ingest/batch.py) and acknowledged
(XACK) only after the commit, so a crash loses nothing: unacknowledged records are read again
from the group's pending list when the ingester starts (at-least-once). One job's stream that
cannot be read or written does not stop the others'; a stream that vanished (Redis restarted
empty) is made again.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any

import redis
from sqlalchemy import select

from contract.allocation import STOP, AllocationState
from contract.codec import decode
from contract.keys import CANCEL_TTL_SECONDS, STREAM_TTL_SECONDS, Keys
from contract.liveness import record_pass
from scheduler.ingest.batch import Effects, Pruning, apply_batch, parse_batch
from scheduler.store.database import Database
from scheduler.store.models import Job
from scheduler.store.states import JobState

log = logging.getLogger("trainyard.ingest")

GROUP = "ingest"
CONSUMER = "ingester"
BATCH = 5000
IDLE_SECONDS = 0.05  # between passes that found nothing to write


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
        trial_ended: threading.Event | None = None,
        slots_freed: threading.Event | None = None,
    ) -> None:
        self.db, self.client, self.keys = db, client, keys
        self.count, self.consumer = count, consumer
        self.pruning = pruning  # a sweep's trials: their intermediate values to its pruner
        # Set when a sweep's trial ends, so that the sweep thread asks for the next one now.
        self.trial_ended = trial_ended
        # Set when a process's end is recorded, so that placement uses its slots now (a
        # sweep's next trial, created as the last one ended, waits for them).
        self.slots_freed = slots_freed
        # Run directories: restarts continue from their points, checkpoint records point there.
        self.artifacts = artifacts
        self._groups: set[str] = set()
        self._recovered: set[str] = set()  # streams whose pending records were re-read
        self.last_pass = 0.0  # time.time() of the last completed pass (/healthz)

    def run_once(self) -> int:
        """One batch from each job stream; the number of metric points written."""
        total = 0
        members: set[bytes] = self.client.smembers(self.keys.streams_with_data)  # type: ignore[assignment]
        for raw in sorted(members):
            text = raw.decode()
            if not text.isdigit():
                self.client.srem(self.keys.streams_with_data, raw)
                continue
            try:
                total += self.ingest_job(int(text))
            except redis.ConnectionError:
                raise  # Redis itself is away: the whole pass waits for it
            except Exception:  # one job's stream or rows must not stop the others'
                log.exception("job %s: ingest failed; the other jobs go on", text)
        self.last_pass = time.time()
        return total

    def run_until(self, stop: threading.Event) -> None:
        """Ingest until `stop` is set (the scheduler's ingest thread)."""
        recorded = 0.0
        while not stop.is_set():
            try:
                written = self.run_once()
                if self.last_pass - recorded >= 1.0:  # /healthz: the ingester is alive
                    record_pass(self.client, self.keys, "ingest")
                    recorded = self.last_pass
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
        try:
            reply: Any = self.client.xreadgroup(
                GROUP, self.consumer, {stream: start}, count=self.count
            )
        except redis.ResponseError as exc:
            if "NOGROUP" not in str(exc):
                raise
            # The stream or its group is gone (Redis restarted empty): made again next pass.
            self._groups.discard(stream)
            self._recovered.discard(stream)
            return []
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
        with self.db.session() as session:
            attempt = session.scalar(select(Job.attempt).where(Job.id == job_id)) or 0
        batch = parse_batch(job_id, entries, attempt, self.artifacts)
        pruned = None
        if self.pruning is not None and batch.metrics:
            pruned = self.pruning.pruned_at(job_id, batch.metrics)
        found = ended = trial = False  # the job exists; it ended in this batch; it is a trial
        effects = Effects(artifacts=self.artifacts)
        try:
            with self.db.session() as session:
                job = session.get(Job, job_id, with_for_update=True)
                if job is not None:
                    found = True
                    if job.attempt != attempt:  # placed again since the look above
                        batch = parse_batch(job_id, entries, job.attempt, self.artifacts)
                    was_terminal = JobState(job.state).terminal
                    apply_batch(session, job, batch, pruned, effects)
                    terminal = JobState(job.state).terminal
                    ended = terminal and not was_terminal
                    trial = job.sweep_id is not None
        except Exception:
            self._recovered.discard(stream)
            raise
        pipe = self.client.pipeline(transaction=False)
        pipe.xack(stream, GROUP, *[entry_id for entry_id, _ in entries])
        for alloc_id in effects.stops:  # an attempt's processes, the job placed again
            pipe.hset(self.keys.allocation(alloc_id), STOP, "1")
        written = len(batch.metrics) if found else 0
        if written:
            pipe.incrby(self.keys.ingested_points, written)
        if ended:
            # Processes of the job still running (siblings, servers) stop on this key.
            pipe.set(self.keys.cancel(job_id), "1", ex=CANCEL_TTL_SECONDS)
        pipe.execute()
        if ended and trial and self.trial_ended is not None:
            self.trial_ended.set()  # after the commit: the sweep's pass sees the trial ended
        freed = any(not AllocationState(record.state).active for record in batch.states)
        if found and freed and self.slots_freed is not None:
            self.slots_freed.set()
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
