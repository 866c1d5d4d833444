"""A job's stream: the records its processes append to one Redis stream (metrics, log lines,
checkpoints, process states, pipeline timelines, the job's events, each worker's environment),
which the scheduler's ingester reads into SQL in batches and the API's live endpoint follows.

Every record is written by `encode_record` and read by `decode_record`, nowhere else; both go
through the one codec of contract/codec.py, so a field added to a record is one line of its
class. Values are plain strings and JSON; nothing is pickled.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, ClassVar

import redis

from contract.codec import decode, from_fields, to_fields
from contract.keys import Keys

STREAM_MAXLEN = 200_000
ATTEMPT = "attempt"  # an entry's envelope field: which placement of the job wrote it
TIMELINE_KINDS = ("F", "B", "W")


@dataclass(frozen=True)
class MetricRecord:
    """Named scalars of one step, from one worker."""

    kind: ClassVar[str] = "metric"
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
    """One line a process printed."""

    kind: ClassVar[str] = "log"
    line: str
    group: int = 0
    rank: int = 0
    time: float = field(default_factory=time.time)


@dataclass(frozen=True)
class CheckpointRecord:
    """A checkpoint written to the shared artifact directory (the path is the server's)."""

    kind: ClassVar[str] = "checkpoint"
    step: int
    path: str
    size: int
    time: float = field(default_factory=time.time)
    best: bool = False  # the job objective's best step so far (checkpoint.keep_best keeps it)

    @classmethod
    def of_file(cls, step: int, path: Path, *, best: bool = False) -> CheckpointRecord:
        return cls(step, str(path), path.stat().st_size, best=best)


@dataclass(frozen=True)
class StateRecord:
    """A process of a job (an allocation) started or ended; `state` names an AllocationState
    (contract/allocation.py). `reason` and `exit_code` may be missing in records of older
    agents."""

    kind: ClassVar[str] = "state"
    allocation_id: int = field(metadata={"wire": "alloc"})
    state: str
    reason: str = ""
    exit_code: int | None = None
    time: float = field(default_factory=time.time)


@dataclass(frozen=True)
class TimelineRecord:
    """When one stage of a pipeline computed in one step: (kind, micro-batch, start, end, piece)
    with kind "F" (forward), "B" (backward; input gradients only where the schedule splits the
    backward) or "W" (weight gradients), times in seconds from the step's start, and the piece
    of the net it ran (the stage itself, without virtual stages)."""

    kind: ClassVar[str] = "timeline"
    step: int
    events: tuple[tuple[str, int, float, float, int], ...]
    group: int = 0  # the pipeline (replica)
    rank: int = 0  # the stage
    time: float = field(default_factory=time.time)

    def __post_init__(self) -> None:
        if any(event[0] not in TIMELINE_KINDS for event in self.events):
            raise ValueError(
                "an event's kind is none of F (forward), B (backward), W (weight gradients)"
            )

    def to_json(self) -> dict[str, object]:
        """The line of timeline.jsonl."""
        return {
            "step": self.step,
            "group": self.group,
            "rank": self.rank,
            "events": [list(event) for event in self.events],
        }


@dataclass(frozen=True)
class EventRecord:
    """Something that happened to the job as a whole, which its events list shows (a run that
    stopped early, and why), written by the job's first worker."""

    kind: ClassVar[str] = "event"
    step: int
    message: str
    time: float = field(default_factory=time.time)


MAX_PACKAGES = 4000  # an environment record lists at most this many installed packages
MAX_PACKAGE_TEXT = 200  # characters of one "name==version" line


@dataclass(frozen=True)
class EnvironmentRecord:
    """What one worker process trains with, reported once as it starts: the interpreter,
    torch and its accelerator libraries ("" where there are none), the devices, the machine and
    the Trainyard install. `packages` is the installed distributions as sorted "name==version"
    lines (at most MAX_PACKAGES; `packages_total` says how many there were), `packages_hash`
    the SHA-256 of the whole list, one line each: two processes with the same hash have the same
    packages."""

    kind: ClassVar[str] = "environment"
    python: str
    torch: str
    cuda: str
    cudnn: str
    nccl: str
    devices: tuple[str, ...]
    cpu_model: str
    cpu_count: int
    hostname: str
    trainyard_version: str
    trainyard_commit: str  # "" when the install is not a git checkout
    packages_hash: str
    packages: tuple[str, ...]
    packages_total: int
    group: int = 0
    rank: int = 0
    time: float = field(default_factory=time.time)

    def facts(self) -> dict[str, object]:
        """Everything but the package list and where it came from: what two runs differ by."""
        skip = {"packages", "group", "rank", "time"}
        return {
            f.name: getattr(self, f.name) if f.name != "devices" else list(self.devices)
            for f in fields(self)
            if f.name not in skip
        }


Record = (
    MetricRecord
    | LogRecord
    | CheckpointRecord
    | StateRecord
    | TimelineRecord
    | EventRecord
    | EnvironmentRecord
)
RECORD_TYPES: dict[str, type[Record]] = {
    cls.kind: cls
    for cls in (
        MetricRecord,
        LogRecord,
        CheckpointRecord,
        StateRecord,
        TimelineRecord,
        EventRecord,
        EnvironmentRecord,
    )
}
KINDS = tuple(RECORD_TYPES)


class RecordError(ValueError):
    """A stream entry that is not a record of a known kind with well-formed fields."""


def encode_record(record: Record) -> dict[str, str]:
    """The stream fields of a record: its kind, then its fields (contract/codec.py)."""
    if type(record) not in RECORD_TYPES.values():
        raise TypeError(f"{type(record).__name__} is not a stream record")
    return {"kind": record.kind, **to_fields(record)}


def decode_record(raw: Mapping[Any, Any]) -> Record:
    """The record of one stream entry (bytes or str fields); RecordError when it is none."""
    fields = decode(raw)
    kind = fields.get("kind")
    if kind is None or kind not in RECORD_TYPES:
        raise RecordError(f"unknown record kind {kind!r} (known: {', '.join(KINDS)})")
    try:
        return from_fields(RECORD_TYPES[kind], fields)
    except KeyError as exc:
        raise RecordError(f"a {kind} record lacks the field {exc}: {fields!r}") from exc
    except (ValueError, TypeError) as exc:
        raise RecordError(f"malformed {kind} record {fields!r}: {exc}") from exc


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
