"""Where a training run reports to: metric sinks.

The trainer emits named scalars at a step (`train/loss`, `val/accuracy`, `test/accuracy`, `lr`,
...), the job's events (a run that stopped early) and log lines; sinks write them to
metrics.jsonl, the console, or (in the service) the job's Redis stream. A sink gets every
record; it keeps what it wants.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import IO, Protocol

from contract.rundir import ENVIRONMENT, METRICS, TIMELINE, TRAIN_LOG
from contract.stream import (
    CheckpointRecord,
    EnvironmentRecord,
    EventRecord,
    JobStream,
    LogRecord,
    MetricRecord,
    TimelineRecord,
)

Emitted = MetricRecord | TimelineRecord | EventRecord | EnvironmentRecord


class MetricSink(Protocol):
    def emit(self, record: Emitted) -> None: ...

    def log(self, line: str) -> None: ...

    def checkpoint(self, step: int, path: Path, *, best: bool = False) -> None: ...

    def close(self) -> None: ...


class JsonlSink:
    """Appends one JSON object per record to metrics.jsonl (a pipeline stage's timelines to
    timeline.jsonl) and log lines to train.log (where the trainer logs its events too); the
    process's environment is environment.json."""

    def __init__(self, run_dir: Path) -> None:
        run_dir.mkdir(parents=True, exist_ok=True)
        self.run_dir = run_dir
        self._metrics: IO[str] = (run_dir / METRICS).open("a", buffering=1)
        self._log: IO[str] = (run_dir / TRAIN_LOG).open("a", buffering=1)

    def emit(self, record: Emitted) -> None:
        if isinstance(record, TimelineRecord):
            with (self.run_dir / TIMELINE).open("a") as out:
                out.write(json.dumps(record.to_json()) + "\n")
        elif isinstance(record, MetricRecord):
            self._metrics.write(json.dumps(record.to_json()) + "\n")
        elif isinstance(record, EnvironmentRecord):
            facts = {**record.facts(), "packages": list(record.packages)}
            (self.run_dir / ENVIRONMENT).write_text(json.dumps(facts, indent=1) + "\n")

    def log(self, line: str) -> None:
        self._log.write(line + "\n")

    def checkpoint(self, step: int, path: Path, *, best: bool = False) -> None:
        self.log(f"step {step}: checkpoint {path.name}" + (" (best so far)" if best else ""))

    def close(self) -> None:
        self._metrics.close()
        self._log.close()


class RedisSink:
    """Publishes metrics, log lines and checkpoints to the job's stream."""

    def __init__(self, stream: JobStream, *, group: int = 0, rank: int = 0) -> None:
        self.stream, self.group, self.rank = stream, group, rank

    def emit(self, record: Emitted) -> None:
        self.stream.publish(record)

    def log(self, line: str) -> None:
        self.stream.publish(LogRecord(line, group=self.group, rank=self.rank))

    def checkpoint(self, step: int, path: Path, *, best: bool = False) -> None:
        self.stream.publish(CheckpointRecord.of_file(step, path, best=best))

    def close(self) -> None:
        return None


def read_metrics(run_dir: Path) -> list[dict[str, float]]:
    path = run_dir / METRICS
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
