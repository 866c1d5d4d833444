"""Jobs and sweeps exported to an MLflow tracking server (`trainyard mlflow export`;
`pip install 'trainyard[mlflow]'`).

A job becomes one MLflow run: its parameters (the submitted document flattened, overrides
applied: dsl/flatten.py, as TensorBoard's HParams get them), every metric point with its step
and time, tags (state, framework, objective, the Trainyard job and server), and as artifacts
its YAML and its best checkpoint (the newest where it kept no best). A sweep becomes a parent
run (the sweep's document, its state and best value) with one nested run per trial.

Each export makes new runs: exporting a job twice gives two runs, each tagged with the job.
Only MLflow's client is needed (mlflow-skinny); the server stores what it is sent.
"""

from __future__ import annotations

import csv
import io
import math
import re
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, redirect_stdout
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

import yaml

from contract.rundir import CHECKPOINTS
from dsl.flatten import flatten_document
from trainyard.errors import NotFound, TrainyardError

if TYPE_CHECKING:
    from mlflow import MlflowClient

    from trainyard.client import Client
    from trainyard.jobs import Job
    from trainyard.sweeps import Sweep

# MLflow's run statuses for a job's end; a job still running stays RUNNING (a snapshot).
RUN_STATUS = {
    "SUCCEEDED": "FINISHED",
    "FAILED": "FAILED",
    "CANCELLED": "KILLED",
    "PRUNED": "KILLED",
}
_KEY_CHARS = re.compile(r"[^\w\-./ ]")  # what MLflow allows in a param, metric or tag key
T = TypeVar("T")


@dataclass(frozen=True)
class Exported:
    """What an export made: the MLflow experiment and run ids, and the nested runs' ids by
    job id (a sweep's trials)."""

    experiment_id: str
    run_id: str
    trials: dict[int, str]


def tracking_client(tracking_uri: str) -> MlflowClient:
    try:
        from mlflow import MlflowClient
    except ImportError:
        raise TrainyardError(
            "exporting to MLflow needs its client: pip install 'trainyard[mlflow]'"
        ) from None
    return MlflowClient(tracking_uri=tracking_uri)


def export_job(
    client: Client, job_id: int, *, tracking_uri: str, experiment: str | None = None
) -> Exported:
    """One job as one run of `experiment` (default: the job's name)."""
    job = client.job(job_id)
    tracker = tracking_client(tracking_uri)
    with _mlflow_errors(tracking_uri):
        experiment_id = _experiment(tracker, experiment or job.name)
        run_id = _export_job(client, job, tracker, experiment_id, parent=None)
    return Exported(experiment_id, run_id, {})


def export_sweep(
    client: Client, sweep_id: int, *, tracking_uri: str, experiment: str | None = None
) -> Exported:
    """A sweep as a parent run of `experiment` (default: the sweep's name) and each of its
    trials as a nested run."""
    sweep = client.sweep(sweep_id)
    detail = sweep.detail()
    tracker = tracking_client(tracking_uri)
    with _mlflow_errors(tracking_uri):
        experiment_id = _experiment(tracker, experiment or sweep.name)
        parent = tracker.create_run(
            experiment_id,
            run_name=f"{sweep.name}-sweep{sweep.id}",
            start_time=_millis(detail.created_at),
            tags=_tags(
                {
                    "trainyard.sweep_id": sweep.id,
                    "trainyard.server": client.url,
                    "state": detail.state,
                    "algorithm": detail.algorithm,
                    "pruner": detail.pruner,
                    "objective": ",".join(f"{o.metric} ({o.mode})" for o in detail.objectives),
                }
            ),
        ).info.run_id
        _log_params(tracker, parent, _document_params(detail.spec_yaml, {}))
        if detail.best_value is not None and math.isfinite(detail.best_value):
            tracker.log_metric(parent, "best_value", detail.best_value)
        tracker.log_text(parent, detail.spec_yaml, "sweep.yaml")
        trials = {
            trial.job_id: _export_job(
                client, client.job(trial.job_id), tracker, experiment_id, parent=parent, sweep=sweep
            )
            for trial in detail.trials
        }
        _finish(tracker, parent, detail.state, detail.ended_at)
    return Exported(experiment_id, parent, trials)


def _export_job(
    client: Client,
    job: Job,
    tracker: MlflowClient,
    experiment_id: str,
    *,
    parent: str | None,
    sweep: Sweep | None = None,
) -> str:
    info = job.info
    spec_yaml = getattr(info, "spec_yaml", "")
    tags: dict[str, Any] = {
        "trainyard.job_id": job.id,
        "trainyard.server": client.url,
        "state": info.state,
        "framework": info.framework,
        "objective": info.objective,
        "objective_mode": info.objective_mode,
    }
    if parent is not None:
        tags["mlflow.parentRunId"] = parent
    if sweep is not None:
        tags["trainyard.sweep_id"] = sweep.id
        tags["trainyard.trial_number"] = info.trial_number
    run_id: str = tracker.create_run(
        experiment_id,
        run_name=f"{job.name}-job{job.id}",
        start_time=_millis(info.started_at or info.created_at),
        tags=_tags(tags),
    ).info.run_id
    _log_params(tracker, run_id, _document_params(spec_yaml, info.overrides))
    _log_metrics(tracker, run_id, client.request("GET", f"/jobs/{job.id}/metrics.csv").text)
    tracker.log_text(run_id, spec_yaml, "job.yaml")
    _log_checkpoint(job, tracker, run_id)
    _finish(tracker, run_id, info.state, info.ended_at)
    return run_id


def _experiment(tracker: MlflowClient, name: str) -> str:
    found = tracker.get_experiment_by_name(name)
    if found is not None:
        return str(found.experiment_id)
    return str(tracker.create_experiment(name))


def _document_params(spec_yaml: str, overrides: dict[str, Any]) -> dict[str, str]:
    """The document flattened, then each override on its dotted path, as MLflow's text
    params (cut to MLflow's longest value)."""
    from mlflow.utils.validation import MAX_PARAM_VAL_LENGTH

    document = yaml.safe_load(spec_yaml) if spec_yaml else {}
    flat: dict[str, Any] = flatten_document(document if isinstance(document, dict) else {})
    flat.update(flatten_document(overrides))
    return {_key(k): str(v)[:MAX_PARAM_VAL_LENGTH] for k, v in flat.items()}


def _log_params(tracker: MlflowClient, run_id: str, params: dict[str, str]) -> None:
    from mlflow.entities import Param
    from mlflow.utils.validation import MAX_PARAMS_TAGS_PER_BATCH

    entries = [Param(key, value) for key, value in sorted(params.items())]
    for batch in _batches(entries, MAX_PARAMS_TAGS_PER_BATCH):
        tracker.log_batch(run_id, params=batch)


def _log_metrics(tracker: MlflowClient, run_id: str, points_csv: str) -> None:
    """Every point of GET /jobs/{id}/metrics.csv; worker (0, 0)'s under the metric's name,
    another worker's under `workers/g<G>r<R>/<name>`."""
    from mlflow.entities import Metric
    from mlflow.utils.validation import MAX_METRICS_PER_BATCH

    metrics = []
    for row in csv.DictReader(io.StringIO(points_csv)):
        name = row["name"]
        if (row["group"], row["rank"]) != ("0", "0"):
            name = f"workers/g{row['group']}r{row['rank']}/{name}"
        stamp = round(float(row["time"]) * 1000)
        metrics.append(Metric(_key(name), float(row["value"]), stamp, int(row["step"])))
    for batch in _batches(metrics, MAX_METRICS_PER_BATCH):
        tracker.log_batch(run_id, metrics=batch)


def _log_checkpoint(job: Job, tracker: MlflowClient, run_id: str) -> None:
    """The best checkpoint (the newest where the job kept no best) under `checkpoints/`, and
    which it was as the tag `trainyard.checkpoint`."""
    known = job.checkpoints()
    if not known:
        tracker.set_tag(run_id, "trainyard.checkpoint", "none")
        return
    best = any(c.best for c in known)
    with tempfile.TemporaryDirectory() as scratch:
        try:
            path = job.download_checkpoint(scratch, best=best)
        except NotFound:  # deleted between the listing and the download (checkpoint.keep)
            tracker.set_tag(run_id, "trainyard.checkpoint", "none")
            return
        tracker.log_artifact(run_id, str(path), CHECKPOINTS)
    which = "best" if best else "latest"
    tracker.set_tag(run_id, "trainyard.checkpoint", f"{which} ({path.name})")


def _finish(tracker: MlflowClient, run_id: str, state: str, ended_at: datetime | None) -> None:
    status = RUN_STATUS.get(state)
    if status is not None:
        # MLflow prints each ended run's address on stdout, which is `--json`'s.
        with redirect_stdout(io.StringIO()):
            tracker.set_terminated(run_id, status, end_time=_millis(ended_at) if ended_at else None)


def _tags(values: dict[str, Any]) -> dict[str, str]:
    return {key: str(value) for key, value in values.items() if value is not None}


def _key(name: str) -> str:
    return _KEY_CHARS.sub("_", name)[:250]


def _millis(when: datetime) -> int:
    return round(when.timestamp() * 1000)


def _batches(items: Sequence[T], size: int) -> Iterator[list[T]]:
    for start in range(0, len(items), size):
        yield list(items[start : start + size])


@contextmanager
def _mlflow_errors(tracking_uri: str) -> Iterator[None]:
    """MLflow's failures (an unreachable server, a refused value) as TrainyardErrors."""
    from mlflow.exceptions import MlflowException

    try:
        yield
    except MlflowException as error:
        raise TrainyardError(f"MLflow at {tracking_uri}: {error.message}") from None


__all__ = ["Exported", "export_job", "export_sweep"]
