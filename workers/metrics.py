"""Where a training run reports to: metric sinks.

The trainer emits named scalars at a step (`train/loss`, `test/accuracy`, `lr`, ...) and log
lines; sinks write them to metrics.jsonl, the console, or (in the service) Redis. A sink gets
every record; it keeps what it wants.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Protocol


@dataclass(frozen=True)
class MetricRecord:
    step: int
    values: dict[str, float]
    time: float = field(default_factory=time.time)
    group: int = 0
    rank: int = 0

    def to_json(self) -> dict[str, object]:
        return {
            "step": self.step,
            "time": round(self.time, 3),
            "group": self.group,
            "rank": self.rank,
            **self.values,
        }


class MetricSink(Protocol):
    def emit(self, record: MetricRecord) -> None: ...

    def log(self, line: str) -> None: ...

    def checkpoint(self, step: int, path: Path) -> None: ...

    def close(self) -> None: ...


class JsonlSink:
    """Appends one JSON object per record to metrics.jsonl and log lines to train.log."""

    def __init__(self, run_dir: Path) -> None:
        run_dir.mkdir(parents=True, exist_ok=True)
        self._metrics: IO[str] = (run_dir / "metrics.jsonl").open("a", buffering=1)
        self._log: IO[str] = (run_dir / "train.log").open("a", buffering=1)

    def emit(self, record: MetricRecord) -> None:
        self._metrics.write(json.dumps(record.to_json()) + "\n")

    def log(self, line: str) -> None:
        self._log.write(line + "\n")

    def checkpoint(self, step: int, path: Path) -> None:
        self.log(f"step {step}: checkpoint {path.name}")

    def close(self) -> None:
        self._metrics.close()
        self._log.close()


def read_metrics(run_dir: Path) -> list[dict[str, float]]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
