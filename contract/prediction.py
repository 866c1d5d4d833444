"""A prediction run on the cluster: what the scheduler hands its workers and the files they write.

A prediction run is placed work like a job: a row of `jobs` of kind prediction
(dsl/run_kinds.py), with N workers in one group (placed, counted against quotas and fair
share, restarted like any job's). Its `PredictionTask` is kept in the run's own row and handed
to each worker in its allocation record (`AllocationInfo.prediction`); worker `rank` of
`world` scores the rows `shard_rows(rows, world, rank)` of the dataset with the job's inference
net (dsl/inference.py) and writes them to `shard_file(run_dir, rank)`. The worker that finds
every shard written assembles them, in input order, into `output_file(run_dir)`.

    <artifacts>/jobs/<run id>/predictions/shard-00000.npy   worker 0's rows' scores
    <artifacts>/jobs/<run id>/predictions.npy               the assembled output
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

ROWS_METRIC = "predict/rows"  # a worker's rows scored so far (its stream's metric records)
SHARDS = "predictions"
OUTPUT = "predictions.npy"


@dataclass(frozen=True)
class PredictionTask:
    """What every worker of a prediction run needs: the model, the samples and how to score."""

    checkpoint: str  # the safetensors file (its model card rebuilds the net)
    dataset: str  # the uploaded dataset's file
    format: Literal["npz", "csv"]
    key: str  # the .npz array holding the samples ("" for a .csv: every column)
    rows: int  # samples in the dataset
    probabilities: bool
    batch_size: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PredictionTask:
        return cls(**data)


def shard_rows(rows: int, world: int, rank: int) -> tuple[int, int]:
    """The rows [start, stop) worker `rank` of `world` scores: disjoint, in order, covering all,
    their sizes differing by at most one."""
    base, extra = divmod(rows, world)
    start = rank * base + min(rank, extra)
    return start, start + base + (1 if rank < extra else 0)


def shard_file(run_dir: Path, rank: int) -> Path:
    return run_dir / SHARDS / f"shard-{rank:05d}.npy"


def output_file(run_dir: Path) -> Path:
    return run_dir / OUTPUT
