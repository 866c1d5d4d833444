"""What workers tell the platform, through Redis: the keys and the stream record format.

Each job has one Redis stream of records (metrics, log lines, checkpoints, process states).
Workers and node agents append to it; the scheduler's ingester reads it into SQL in batches and
the API's live endpoint follows it. Values are plain strings and JSON; nothing is pickled.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

from workers.metrics import MetricRecord

STREAM_MAXLEN = 200_000


@dataclass(frozen=True)
class Keys:
    """Every Redis key the platform uses, under one prefix so several stacks can share a server."""

    prefix: str = "trainyard"

    def job_stream(self, job_id: int) -> str:
        return f"{self.prefix}:job:{job_id}:stream"

    def cancel(self, job_id: int) -> str:
        return f"{self.prefix}:job:{job_id}:cancel"

    @property
    def streams_with_data(self) -> str:
        """Set of job ids whose streams the ingester should read."""
        return f"{self.prefix}:ingest:jobs"

    def allocation(self, allocation_id: int) -> str:
        return f"{self.prefix}:alloc:{allocation_id}"

    def node(self, name: str) -> str:
        return f"{self.prefix}:node:{name}"

    @property
    def nodes(self) -> str:
        return f"{self.prefix}:nodes"

    def job_scope(self, job_id: int) -> str:
        """Prefix of a job's own working keys (rendezvous, parameter-server shards)."""
        return f"{self.prefix}:job:{job_id}"

    def ps_pattern(self, job_id: int) -> str:
        """Every parameter-server key of a job (PSKeys.pattern of its scope)."""
        return f"{self.job_scope(job_id)}:ps:*"


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


def encode_metric(record: MetricRecord) -> dict[str, str]:
    return {
        "kind": "metric",
        "step": str(record.step),
        "group": str(record.group),
        "rank": str(record.rank),
        "time": repr(record.time),
        "values": json.dumps(record.values),
    }


def encode_log(line: str, *, group: int = 0, rank: int = 0) -> dict[str, str]:
    return {
        "kind": "log",
        "group": str(group),
        "rank": str(rank),
        "time": repr(time.time()),
        "line": line,
    }


def encode_checkpoint(step: int, path: Path) -> dict[str, str]:
    return {
        "kind": "checkpoint",
        "step": str(step),
        "path": str(path),
        "size": str(path.stat().st_size),
        "time": repr(time.time()),
    }


def encode_state(
    allocation_id: int, state: str, *, reason: str = "", exit_code: int | None = None
) -> dict[str, str]:
    return {
        "kind": "state",
        "alloc": str(allocation_id),
        "state": state,
        "reason": reason,
        "exit_code": "" if exit_code is None else str(exit_code),
        "time": repr(time.time()),
    }


def decode(fields: dict[Any, Any]) -> dict[str, str]:
    """Redis returns bytes unless decode_responses; normalise to str."""
    return {
        (k.decode() if isinstance(k, bytes) else k): (v.decode() if isinstance(v, bytes) else v)
        for k, v in fields.items()
    }


class JobStream:
    """Appends records to one job's stream."""

    def __init__(self, client: redis.Redis, keys: Keys, job_id: int) -> None:
        self.client, self.keys, self.job_id = client, keys, job_id
        self.stream = keys.job_stream(job_id)

    def publish(self, fields: dict[str, str]) -> None:
        pipe = self.client.pipeline(transaction=False)
        pipe.xadd(self.stream, fields, maxlen=STREAM_MAXLEN, approximate=True)  # type: ignore[arg-type]
        pipe.sadd(self.keys.streams_with_data, str(self.job_id))
        pipe.execute()

    def cancelled(self) -> bool:
        return bool(self.client.exists(self.keys.cancel(self.job_id)))


class RedisSink:
    """A trainer sink that publishes metrics, log lines and checkpoints to the job's stream."""

    def __init__(self, stream: JobStream, *, group: int = 0, rank: int = 0) -> None:
        self.stream, self.group, self.rank = stream, group, rank

    def emit(self, record: MetricRecord) -> None:
        self.stream.publish(encode_metric(record))

    def log(self, line: str) -> None:
        self.stream.publish(encode_log(line, group=self.group, rank=self.rank))

    def checkpoint(self, step: int, path: Path) -> None:
        self.stream.publish(encode_checkpoint(step, path))

    def close(self) -> None:
        return None
