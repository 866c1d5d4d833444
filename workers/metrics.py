"""Where a training run reports to: metric sinks.

The trainer emits named scalars at a step (`train/loss`, `val/accuracy`, `test/accuracy`, `lr`,
...), the job's events (a run that stopped early) and log lines; sinks write them to
metrics.jsonl, TensorBoard event files, the console, or (in the service) the job's Redis
stream. A sink gets every record; it keeps what it wants. In the service, the job's lead
worker also writes each report and evaluation to the job's log as a training line
(`training_line`): one per display window and per evaluation, so the log grows with the
metrics, not with the steps.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import IO, TYPE_CHECKING, Protocol

from contract.rundir import ENVIRONMENT, METRICS, TENSORBOARD, TIMELINE, TRAIN_LOG
from contract.stream import (
    CheckpointRecord,
    EnvironmentRecord,
    EventRecord,
    JobStream,
    LogRecord,
    MetricRecord,
    TimelineRecord,
)

if TYPE_CHECKING:
    from dsl.flatten import Scalar

Emitted = MetricRecord | TimelineRecord | EventRecord | EnvironmentRecord

# A training window's figures in a training line, as `trainyard submit --follow` shows them.
TRAINING_FIGURES = (
    ("train/loss", "loss", "{:.4f}"),
    ("train/accuracy", "acc", "{:.3f}"),
    ("train/recon_error", "recon", "{:.4f}"),
    ("lr", "lr", "{:.3g}"),
    ("samples_per_sec", "samples/s", "{:,.0f}"),
)
EVALUATIONS = ("val", "test")  # the splits an evaluation reports, `val/accuracy`


def training_line(record: MetricRecord) -> str | None:
    """The job log's line for a report: `step 100: loss 0.4321  acc 0.912  lr 0.05  samples/s
    12,345`, or an evaluation's `step 500: test loss 0.2100  test accuracy 0.9530`; None for a
    record of neither (a parameter server's counters)."""
    values = {
        name: value
        for name, value in record.values.items()
        if isinstance(value, int | float) and not isinstance(value, bool)
    }
    parts = [
        f"{label} {fmt.format(values[name]) if math.isfinite(values[name]) else values[name]}"
        for name, label, fmt in TRAINING_FIGURES
        if name in values
    ]
    if not any(name.startswith("train/") for name in values):
        parts = [
            f"{split} {name} {value:.4f}"
            for key, value in values.items()
            for split, _, name in [key.partition("/")]
            if split in EVALUATIONS and name
        ]
    return f"step {record.step}: {'  '.join(parts)}" if parts else None


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


class TensorBoardSink:
    """Writes the run's scalars, and its hyperparameters for TensorBoard's HParams plugin, as
    event files in <run_dir>/tensorboard (torch's SummaryWriter; tensorboard reads them).

    The hyperparameters (the job's document, flattened) go in at the start, so that a run that
    ends badly still shows them; the experiment's list of metrics at the close, once they are
    known. A worker that resumes writes a new event file beside the old ones: TensorBoard drops
    the old file's points from the resumed step on.
    """

    FLUSH_SECONDS = 10  # how stale a running job's downloaded event files may be

    def __init__(self, run_dir: Path, hparams: Mapping[str, Scalar]) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self._writer = SummaryWriter(str(run_dir / TENSORBOARD), flush_secs=self.FLUSH_SECONDS)
        self._hparams = dict(hparams)
        self._names: set[str] = set()
        self._add(self._summaries()[1])

    def _add(self, summary: object, step: int | None = None, walltime: float | None = None) -> None:
        file_writer = self._writer.file_writer
        assert file_writer is not None  # the SummaryWriter opened it when it was made
        file_writer.add_summary(summary, step, walltime)

    def _summaries(self) -> tuple[object, object, object]:
        """HParams' experiment, session-start and session-end summaries."""
        from torch.utils.tensorboard.summary import hparams

        experiment, start, end = hparams(self._hparams, dict.fromkeys(sorted(self._names), 0.0))
        return experiment, start, end

    def emit(self, record: Emitted) -> None:
        """A record's scalars as one event (a summary of several values): half the cost of
        an add_scalar per value."""
        from tensorboard.compat.proto.summary_pb2 import Summary

        if not isinstance(record, MetricRecord):
            return
        values = [
            Summary.Value(tag=name, simple_value=float(value))
            for name, value in record.values.items()
            if isinstance(value, int | float) and math.isfinite(value)
        ]
        if values:
            self._add(Summary(value=values), step=record.step, walltime=record.time)
            self._names.update(value.tag for value in values)

    def log(self, line: str) -> None:
        return None

    def checkpoint(self, step: int, path: Path, *, best: bool = False) -> None:
        return None

    def close(self) -> None:
        # No session-end summary: torch's always says "success", which a failed run is not.
        self._add(self._summaries()[0])
        self._writer.close()


class RedisSink:
    """Publishes metrics, log lines and checkpoints to the job's stream; with `training_lines`
    (the job's lead worker), each report and evaluation as a log line too."""

    def __init__(
        self, stream: JobStream, *, group: int = 0, rank: int = 0, training_lines: bool = False
    ) -> None:
        self.stream, self.group, self.rank = stream, group, rank
        self.training_lines = training_lines

    def emit(self, record: Emitted) -> None:
        self.stream.publish(record)
        if self.training_lines and isinstance(record, MetricRecord):
            line = training_line(record)
            if line is not None:
                self.stream.publish(
                    LogRecord(line, group=self.group, rank=self.rank, time=record.time)
                )

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
