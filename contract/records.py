"""What the platform's processes exchange through Redis: key names, time-to-lives, the job
stream's records, the allocation record and the worker's exit codes.

Each job has one Redis stream of records (metrics, log lines, checkpoints, process states).
Workers and node agents append to it; the scheduler's ingester reads it into SQL in batches and
the API's live endpoint follows it. Every record is written by `encode_record` and read by
`decode_record`, nowhere else. Values are plain strings and JSON; nothing is pickled.
"""

from __future__ import annotations

import enum
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

STREAM_MAXLEN = 200_000

# -- time-to-lives: what an ended or abandoned job leaves in Redis, and for how long ----------
CANCEL_TTL_SECONDS = 24 * 3600  # a job's cancel key: its processes still running stop on it
STREAM_TTL_SECONDS = 24 * 3600  # a job's stream, once it has ended and the ingester drained it
FINISHED_TTL_SECONDS = 7 * 24 * 3600  # an allocation hash, after its agent reported the end
# A worker group's store address (workers.distributed.rendezvous): abandoned, kept a day at most.
RENDEZVOUS_TTL_SECONDS = 24 * 3600
NORMS_TTL_SECONDS = 3600  # the shards' parts of one update's gradient norm (workers.distributed)


class ExitCode(enum.IntEnum):  # how a worker process (`python -m workers.entry`) ends
    OK = 0  # trained to the end
    FAILED = 1
    INVALID = 2  # the job cannot run here
    CANCELLED = 3
    # Stopped to leave its node (the agent's SIGTERM); it saved a restart point if it could.
    DRAINED = 4
    DIVERGED = 5  # the loss became NaN or infinite: a restart would diverge again


@dataclass(frozen=True)
class Keys:
    """Every Redis key the platform uses, under one prefix so several stacks can share a server."""

    prefix: str = "trainyard"

    @property
    def pattern(self) -> str:
        """Every key of this stack (a SCAN pattern)."""
        return f"{self.prefix}:*"

    def job_stream(self, job_id: int) -> str:
        return f"{self.prefix}:job:{job_id}:stream"

    def cancel(self, job_id: int) -> str:
        return f"{self.prefix}:job:{job_id}:cancel"

    @property
    def streams_with_data(self) -> str:  # set of job ids whose streams the ingester reads
        return f"{self.prefix}:ingest:jobs"

    @property
    def ingested_points(self) -> str:  # metric points the ingester wrote (Prometheus /metrics)
        return f"{self.prefix}:stats:ingested_points"

    def allocation(self, allocation_id: int) -> str:
        return f"{self.prefix}:alloc:{allocation_id}"

    def node(self, name: str) -> str:
        return f"{self.prefix}:node:{name}"

    @property
    def nodes(self) -> str:
        return f"{self.prefix}:nodes"

    def node_claims(self, name: str) -> str:  # the allocations its agent claimed, not ended
        return f"{self.prefix}:node:{name}:claims"

    @property
    def scheduler_lease(self) -> str:  # held by the one scheduler that acts
        return f"{self.prefix}:scheduler:lease"

    @property
    def liveness(self) -> str:  # the scheduler's loops -> their last pass (/healthz)
        return f"{self.prefix}:scheduler:liveness"

    def job_scope(self, job_id: int) -> str:  # a job's own working keys (rendezvous, shards)
        return f"{self.prefix}:job:{job_id}"

    def ps_pattern(self, job_id: int) -> str:
        """Every parameter-server key of a job (PSKeys.pattern of its scope)."""
        return f"{self.job_scope(job_id)}:ps:*"

    def stream_ticket(self, ticket: str) -> str:
        """A short-lived ticket to one job's live stream: `<job id>:<user id>`, with a TTL."""
        return f"{self.prefix}:ticket:{ticket}"

    def submissions(self, user_id: int) -> str:
        """Sorted set of a user's recent submission times (the rate limit's window)."""
        return f"{self.prefix}:user:{user_id}:submissions"

    @property
    def tokens_revoked(self) -> str:  # pub/sub: revoked tokens' hashes, dropped from API caches
        return f"{self.prefix}:tokens:revoked"

    @property
    def announcements(self) -> str:  # pub/sub: `job <id>`, `sweep <id>` (contract/announcements.py)
        return f"{self.prefix}:announcements"


def delete_matching(client: redis.Redis, pattern: str) -> int:
    """Delete the keys matching `pattern` (SCAN, so the server is never blocked long)."""
    removed = 0
    batch: list[Any] = []
    for key in client.scan_iter(match=pattern, count=1000):
        batch.append(key)
        if len(batch) == 1000:
            removed += int(client.delete(*batch))
            batch = []
    if batch:
        removed += int(client.delete(*batch))
    return removed


def decode(fields: Mapping[Any, Any]) -> dict[str, str]:
    """Redis returns bytes unless decode_responses; normalise to str."""
    return {
        (k.decode() if isinstance(k, bytes) else k): (v.decode() if isinstance(v, bytes) else v)
        for k, v in fields.items()
    }


# -- the job stream's records ------------------------------------------------------------------
@dataclass(frozen=True)
class MetricRecord:
    """Named scalars of one step, from one worker."""

    step: int
    values: dict[str, float]  # as sent: a reader skips what is not a finite number
    time: float = field(default_factory=time.time)
    group: int = 0
    rank: int = 0

    def to_json(self) -> dict[str, object]:
        """The line of metrics.jsonl."""
        return {
            "step": self.step,
            "time": round(self.time, 3),
            "group": self.group,
            "rank": self.rank,
            **self.values,
        }


@dataclass(frozen=True)
class LogRecord:
    line: str
    group: int = 0
    rank: int = 0
    time: float = field(default_factory=time.time)


@dataclass(frozen=True)
class CheckpointRecord:
    """A checkpoint written to the shared artifact directory (the path is the server's)."""

    step: int
    path: str
    size: int
    time: float = field(default_factory=time.time)

    @classmethod
    def of_file(cls, step: int, path: Path) -> CheckpointRecord:
        return cls(step, str(path), path.stat().st_size)


@dataclass(frozen=True)
class StateRecord:
    """A process of a job (an allocation) started or ended; `state` names an AllocationState."""

    allocation_id: int
    state: str
    reason: str = ""
    exit_code: int | None = None
    time: float = field(default_factory=time.time)


@dataclass(frozen=True)
class TimelineRecord:
    """When one stage of a pipeline computed in one step: (kind, micro-batch, start, end) with
    kind "F" (forward) or "B" (backward) and times in seconds from the step's start."""

    step: int
    events: tuple[tuple[str, int, float, float], ...]
    group: int = 0  # the pipeline (replica)
    rank: int = 0  # the stage
    time: float = field(default_factory=time.time)

    def to_json(self) -> dict[str, object]:
        """The line of timeline.jsonl."""
        return {
            "step": self.step,
            "group": self.group,
            "rank": self.rank,
            "events": [list(event) for event in self.events],
        }


TIMELINE_KINDS = ("F", "B")

Record = MetricRecord | LogRecord | CheckpointRecord | StateRecord | TimelineRecord

KINDS = ("metric", "log", "checkpoint", "state", "timeline")


class RecordError(ValueError):
    """A stream entry that is not a record of a known kind with well-formed fields."""


def encode_record(record: Record) -> dict[str, str]:
    """The stream fields of a record. Times are repr() so that they read back exactly."""
    match record:
        case MetricRecord():
            return {
                "kind": "metric",
                "step": str(record.step),
                "group": str(record.group),
                "rank": str(record.rank),
                "time": repr(record.time),
                "values": json.dumps(record.values),
            }
        case LogRecord():
            return {
                "kind": "log",
                "group": str(record.group),
                "rank": str(record.rank),
                "time": repr(record.time),
                "line": record.line,
            }
        case CheckpointRecord():
            return {
                "kind": "checkpoint",
                "step": str(record.step),
                "path": record.path,
                "size": str(record.size),
                "time": repr(record.time),
            }
        case StateRecord():
            return {
                "kind": "state",
                "alloc": str(record.allocation_id),
                "state": str(record.state),
                "reason": record.reason,
                "exit_code": "" if record.exit_code is None else str(record.exit_code),
                "time": repr(record.time),
            }
        case TimelineRecord():
            return {
                "kind": "timeline",
                "step": str(record.step),
                "group": str(record.group),
                "rank": str(record.rank),
                "time": repr(record.time),
                "events": json.dumps([list(event) for event in record.events]),
            }
    raise TypeError(f"{type(record).__name__} is not a stream record")


def decode_record(raw: Mapping[Any, Any]) -> Record:
    """The record of one stream entry (bytes or str fields); RecordError when it is none."""
    fields = decode(raw)
    kind = fields.get("kind")
    if kind is None or kind not in KINDS:
        raise RecordError(f"unknown record kind {kind!r} (known: {', '.join(KINDS)})")
    try:
        return _decode_fields(kind, fields)
    except KeyError as exc:
        raise RecordError(f"a {kind} record lacks the field {exc}: {fields!r}") from exc
    except (ValueError, TypeError) as exc:
        raise RecordError(f"malformed {kind} record {fields!r}: {exc}") from exc


def _decode_fields(kind: str, fields: dict[str, str]) -> Record:
    if kind == "metric":
        values = json.loads(fields["values"])
        if not isinstance(values, dict):
            raise ValueError("values is not a JSON object")
        return MetricRecord(
            step=int(fields["step"]),
            values=values,
            time=float(fields["time"]),
            group=int(fields["group"]),
            rank=int(fields["rank"]),
        )
    if kind == "log":
        return LogRecord(
            line=fields["line"],
            group=int(fields["group"]),
            rank=int(fields["rank"]),
            time=float(fields["time"]),
        )
    if kind == "checkpoint":
        return CheckpointRecord(
            step=int(fields["step"]),
            path=fields["path"],
            size=int(fields["size"]),
            time=float(fields["time"]),
        )
    if kind == "timeline":
        events = tuple(
            (str(k), int(m), float(a), float(b)) for k, m, a, b in json.loads(fields["events"])
        )
        if any(event[0] not in TIMELINE_KINDS for event in events):
            raise ValueError("an event's kind is neither F (forward) nor B (backward)")
        return TimelineRecord(
            step=int(fields["step"]),
            events=events,
            group=int(fields["group"]),
            rank=int(fields["rank"]),
            time=float(fields["time"]),
        )
    # "reason" and "exit_code" may be left out (records of older agents).
    code = fields.get("exit_code", "")
    return StateRecord(
        allocation_id=int(fields["alloc"]),
        state=fields["state"],
        reason=fields.get("reason", ""),
        exit_code=int(code) if code else None,
        time=float(fields["time"]),
    )


ATTEMPT = "attempt"  # a stream entry's envelope field: which placement of the job wrote it


def entry_attempt(raw: Mapping[Any, Any]) -> int:
    """The attempt a stream entry was written by (0 when it does not say)."""
    value = raw.get(b"attempt", raw.get(ATTEMPT, "0"))  # no decode of the whole entry
    text = value.decode() if isinstance(value, bytes) else str(value)
    return int(text) if text.isdigit() else 0


class JobStream:
    """Appends records to one job's stream, each marked with the attempt (placement) of the job
    that wrote it: the ingester drops the metrics of attempts the job has restarted from."""

    def __init__(self, client: redis.Redis, keys: Keys, job_id: int, attempt: int = 0) -> None:
        self.client, self.keys, self.job_id, self.attempt = client, keys, job_id, attempt
        self.stream = keys.job_stream(job_id)

    def publish(self, record: Record) -> None:
        fields = {**encode_record(record), ATTEMPT: str(self.attempt)}
        pipe = self.client.pipeline(transaction=False)
        pipe.xadd(self.stream, fields, maxlen=STREAM_MAXLEN, approximate=True)  # type: ignore[arg-type]
        pipe.sadd(self.keys.streams_with_data, str(self.job_id))
        pipe.execute()

    def cancelled(self) -> bool:
        return bool(self.client.exists(self.keys.cancel(self.job_id)))


# -- the allocation record -----------------------------------------------------------------------
# The scheduler fills the hash Keys.allocation(id) before it dispatches the Celery task that
# carries only the id; the node agent and the worker process read everything else from there.
# Besides the AllocationInfo fields, the agent and the scheduler keep these in the hash:
CLAIMED = "claimed"  # set once (HSETNX) by the agent that runs it: redeliveries are no-ops
FINISHED = "finished"  # the final state the agent reported
STOP = "stop"  # the scheduler wants this one process stopped (its node was lost)
DISPATCHED = "dispatched"  # when the Celery task was sent (unix time)
SEEN = "seen"  # when the agent last saw its process alive (every heartbeat)
# A field of a node's registration hash (Keys.node): its agent is stopping and takes no work.
DRAINING = "draining"


@dataclass(frozen=True)
class AllocationInfo:
    """One placed process of a job, as the scheduler writes it and a worker reads it."""

    allocation_id: int
    job_id: int
    role: str  # worker | server
    group: int
    rank: int
    world: int  # workers in this worker group
    slots: int
    gpus: int
    node: str
    framework: str
    topology: dict[str, Any]
    spec: dict[str, Any]  # the execution spec: validated, dataset names resolved to paths
    run_dir: Path
    attempt: int = 0  # the job's placements before this one (restarts, drains, lost nodes)
    resume_from: str = ""  # the restart point this attempt continues from ("": step 0)
    restart_seconds: float = 0.0  # restart points every this many seconds (0: none)
    # An asynchronous framework's worker restarted alone continues from this step, with the
    # parameters the server shards hold.
    start_step: int = 0

    def to_hash(self) -> dict[str, str]:
        return {
            "job_id": str(self.job_id),
            "role": self.role,
            "group": str(self.group),
            "rank": str(self.rank),
            "world": str(self.world),
            "slots": str(self.slots),
            "gpus": str(self.gpus),
            "node": self.node,
            "framework": self.framework,
            "topology": json.dumps(self.topology),
            "spec": json.dumps(self.spec),
            "run_dir": str(self.run_dir),
            "attempt": str(self.attempt),
            "resume_from": self.resume_from,
            "restart_seconds": repr(self.restart_seconds),
            "start_step": str(self.start_step),
        }

    @classmethod
    def from_hash(cls, allocation_id: int, fields: dict[str, str]) -> AllocationInfo:
        return cls(
            allocation_id=allocation_id,
            job_id=int(fields["job_id"]),
            role=fields["role"],
            group=int(fields["group"]),
            rank=int(fields["rank"]),
            world=int(fields["world"]),
            slots=int(fields["slots"]),
            gpus=int(fields["gpus"]),
            node=fields["node"],
            framework=fields["framework"],
            topology=json.loads(fields["topology"]),
            spec=json.loads(fields["spec"]),
            run_dir=Path(fields["run_dir"]),
            attempt=int(fields.get("attempt", "0")),
            resume_from=fields.get("resume_from", ""),
            restart_seconds=float(fields.get("restart_seconds", "0")),
            start_step=int(fields.get("start_step", "0")),
        )


def stop_requested(client: redis.Redis, keys: Keys, job_id: int, allocation_id: int) -> bool:
    """The user cancelled the job, or the scheduler stopped this allocation."""
    pipe = client.pipeline(transaction=False)
    pipe.exists(keys.cancel(job_id))
    pipe.hexists(keys.allocation(allocation_id), STOP)
    cancelled, stopped = pipe.execute()
    return bool(cancelled) or bool(stopped)
