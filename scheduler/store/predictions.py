"""Batch prediction runs in the store: read them, their progress and their output.

A run's state is its placed job's (`Prediction.run_job_id`); its progress the rows its workers
reported scoring (contract/prediction.py `ROWS_METRIC`, each worker's newest report) over the
dataset's rows. A user sees only their own runs; another user's, an admin's too, is NotFound,
like the exports and the models.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from contract.prediction import ROWS_METRIC, PredictionTask, output_file
from contract.rundir import job_run_dir
from dsl.run_kinds import RUN_KINDS
from scheduler.store.errors import Conflict, NotFound
from scheduler.store.models import Job, Metric, Prediction, User
from scheduler.store.states import JobState


@dataclass(frozen=True)
class PredictionView:
    prediction: Prediction
    run: Job  # the placed job whose workers score
    progress: float  # 0..1
    rows_done: int


def get_prediction(session: Session, owner: User, prediction_id: int) -> Prediction:
    row = session.get(Prediction, prediction_id)
    if row is None or row.owner_id != owner.id:
        raise NotFound(f"no prediction run {prediction_id}")
    return row


def view(session: Session, row: Prediction) -> PredictionView:
    run = session.get_one(Job, row.run_job_id)
    done = rows_done(session, row) if run.state != JobState.SUCCEEDED else row.rows
    progress = done / row.rows if row.rows else 1.0
    return PredictionView(row, run, min(progress, 1.0), min(done, row.rows))


def rows_done(session: Session, row: Prediction) -> int:
    """The rows scored so far: each worker's newest report (a restarted worker reports again
    from zero, and its newest report is its new process's)."""
    newest = (
        select(func.max(Metric.id).label("id"))
        .where(Metric.job_id == row.run_job_id, Metric.name == ROWS_METRIC)
        .group_by(Metric.group, Metric.rank)
        .subquery()
    )
    total = session.scalar(select(func.sum(Metric.value)).join(newest, Metric.id == newest.c.id))
    return int(total or 0)


def job_predictions(session: Session, owner: User, job_id: int) -> list[PredictionView]:
    """The owner's prediction runs of one job, newest first."""
    rows = session.scalars(
        select(Prediction)
        .where(Prediction.owner_id == owner.id, Prediction.job_id == job_id)
        .order_by(Prediction.id.desc())
    )
    return [view(session, row) for row in rows]


def model_predictions(session: Session, owner: User, ref: str) -> list[PredictionView]:
    """The owner's prediction runs of one registered model version (`name@version`), newest
    first."""
    rows = session.scalars(
        select(Prediction)
        .where(Prediction.owner_id == owner.id, Prediction.model == ref)
        .order_by(Prediction.id.desc())
    )
    return [view(session, row) for row in rows]


def prediction_task(session: Session, run_job_id: int) -> PredictionTask:
    """What the workers of job `run_job_id`, a prediction run, score: its row's task."""
    row = session.scalars(select(Prediction).where(Prediction.run_job_id == run_job_id)).one()
    return PredictionTask(
        checkpoint=row.checkpoint,
        dataset=row.dataset_file,
        format=row.dataset_format,  # type: ignore[arg-type]  # npz | csv, as admission checked
        key=row.sample_key,
        rows=row.rows,
        probabilities=row.probabilities,
        batch_size=row.batch_size,
    )


def largest_shard(rows: int, workers: int) -> int:
    """The rows of a run's largest shard (contract/prediction.py shard_rows): the end of its
    job's progress, which its furthest worker's rows scored (the job's step) go to."""
    return -(-rows // workers) if workers else 0


def progress_ends(session: Session, jobs: Sequence[Job]) -> dict[int, int]:
    """Where each job's progress (its step over this) ends: a training run's train_steps, a
    prediction run's largest shard's rows (scheduler/store/job_page.py computes it alike)."""
    runs = [job.id for job in jobs if RUN_KINDS.get(job.kind).scores_rows]
    shards = (
        {
            run_job_id: largest_shard(rows, workers)
            for run_job_id, rows, workers in session.execute(
                select(Prediction.run_job_id, Prediction.rows, Prediction.workers).where(
                    Prediction.run_job_id.in_(runs)
                )
            )
        }
        if runs
        else {}
    )
    return {job.id: shards.get(job.id, job.train_steps) for job in jobs}


def run_prediction(session: Session, owner: User, run_job_id: int) -> Prediction:
    """The owner's prediction run that job `run_job_id` places; NotFound for any other job."""
    row = session.scalar(select(Prediction).where(Prediction.run_job_id == run_job_id))
    if row is None or row.owner_id != owner.id:
        raise NotFound(f"job {run_job_id} is not a prediction run")
    return row


def output(row: Prediction, run: Job, artifacts: Path) -> Path:
    """The run's assembled scores; Conflict before the run has succeeded."""
    if run.state != JobState.SUCCEEDED:
        raise Conflict(
            f"prediction run {row.id} is {run.state}; its output is ready once it has SUCCEEDED"
        )
    path = output_file(job_run_dir(artifacts, run.id))
    if not path.is_file():
        raise NotFound(f"the output of prediction run {row.id} is gone")
    return path
