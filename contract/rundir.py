"""The artifact directory's layout, as workers write it and the scheduler and API read it:
every file name of a run directory is here.

    <artifacts>/jobs/<id>/          the run directory (worker 0 of group 0 writes it)
        metrics.jsonl                    every metric record, a JSON object a line
        timeline.jsonl                   a pipeline's stage timelines
        train.log                        the run's log lines
        summary.json                     how the run ended: status, steps, final metrics
        environment.json                 what its first worker trained with (Python, torch,
                                         devices, packages: contract/stream.py)
        tensorboard/                     the run's scalars and hyperparameters as TensorBoard
                                         event files
        workers/g<G>r<R>/                the same files of another worker of the job
        checkpoints/step-N.safetensors   the user's checkpoints (checkpoint.freq, keep)
        restart/step-N.safetensors       restart points (every few minutes; the service's own;
                                         the newest two kept)
        restart/attempt-K.safetensors    the point attempt K of the job resumes from
    <artifacts>/datasets/<user id>/<name>.<kind>   uploaded datasets (npz, csv, txt)
    <artifacts>/datasets/<user id>/<name>/         ... converted tables: NNNNN.x.npy,
                                                   NNNNN.y.npy, categories.json
    <artifacts>/uploads/<user id>/<upload id>/NNNNN.part   the parts of an open upload
    <artifacts>/models/<user id>/<name>-v<version>.safetensors   registered models' checkpoints

Restart points are kept apart from the user's checkpoints: they are not listed as the job's
checkpoints and are deleted when the job ends.
"""

from __future__ import annotations

import re
from pathlib import Path

RUNS = "jobs"
DATASETS = "datasets"
UPLOADS = "uploads"
CATEGORIES = "categories.json"
MODELS = "models"
METRICS = "metrics.jsonl"
TIMELINE = "timeline.jsonl"
TRAIN_LOG = "train.log"
SUMMARY = "summary.json"
ENVIRONMENT = "environment.json"
TENSORBOARD = "tensorboard"
WORKERS = "workers"
CHECKPOINTS = "checkpoints"
RESTART = "restart"
_NAME = re.compile(r"^step-(\d{8,})\.safetensors$")


def job_run_dir(artifacts: Path, job_id: int) -> Path:
    """Where a job's processes write checkpoints, metrics and logs."""
    return artifacts / RUNS / str(job_id)


def dataset_dir(artifacts: Path, owner_id: int) -> Path:
    """Where a user's uploaded datasets are kept."""
    return artifacts / DATASETS / str(owner_id)


def upload_dir(artifacts: Path, owner_id: int, upload_id: str) -> Path:
    """Where the parts of one of a user's chunked uploads wait for its completion."""
    return artifacts / UPLOADS / str(owner_id) / upload_id


def shard_names(index: int) -> tuple[str, str]:
    """The x and y files of a shard folder's shard `index`: 00000.x.npy, 00000.y.npy."""
    return f"{index:05d}.x.npy", f"{index:05d}.y.npy"


def model_dir(artifacts: Path, owner_id: int) -> Path:
    """Where a user's registered models' checkpoints are kept."""
    return artifacts / MODELS / str(owner_id)


def checkpoint_path(directory: Path, step: int) -> Path:
    return directory / f"step-{step:08d}.safetensors"


def list_checkpoints(directory: Path) -> list[tuple[int, Path]]:
    """(step, path) of every checkpoint in `directory`, oldest first."""
    if not directory.is_dir():
        return []
    found = []
    for entry in directory.iterdir():
        match = _NAME.match(entry.name)
        if match:
            found.append((int(match.group(1)), entry))
    return sorted(found)


def latest_restart_point(run_dir: Path, below: int | None = None) -> tuple[int, Path] | None:
    """The newest checkpoint or restart point of a run, at a step below `below` if given:
    (step, path), or None."""
    found = list_checkpoints(run_dir / CHECKPOINTS) + list_checkpoints(run_dir / RESTART)
    return max((f for f in found if below is None or f[0] < below), default=None)


def attempt_point(run_dir: Path, attempt: int) -> Path:
    """Where attempt `attempt`'s restart point is kept (a link to the file it resumes from)."""
    return run_dir / RESTART / f"attempt-{attempt}.safetensors"
