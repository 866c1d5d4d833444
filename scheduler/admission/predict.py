"""Starting a batch prediction run: the one use case POST /jobs/{id}/predictions (and
POST /models/{ref}/predictions) calls.

    the model (a job's checkpoint, or a registered model's) -> the dataset (the caller's upload,
    its samples the model's shape) -> workers within the bound -> the owner's rate and quotas
    -> a placed job of its own, of kind prediction (dsl/run_kinds.py), and the run's row with
    its task (contract/prediction.py) -> commit -> announce (submit.py's `admit_run`, the end
    of every run's admission)

The run is placed work like any job: the scheduler places its workers on slots in fair-share
order, under the owner's quotas (running_jobs, slots, queued_jobs), shows it on the cluster
page, and restarts a failed worker alone (scheduler/recovery/actions.py job_facts). Refusals
are domain errors; only the API turns them into HTTP statuses.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from sqlalchemy.orm import Session

from dsl.model_card import read_model_card
from dsl.run_kinds import PREDICTION, RUN_KINDS
from dsl.schema import JobSpec
from dsl.topology import Topology
from scheduler.admission.quotas import check_new_job
from scheduler.admission.rate_limit import check_rate
from scheduler.admission.submit import NAME_LENGTH, Backends, admit_run
from scheduler.placement.preview import placement_preview
from scheduler.store import reports as report_store
from scheduler.store.datasets import dataset_file, get_dataset
from scheduler.store.errors import InvalidRequest, NotFound
from scheduler.store.jobs import NewJob
from scheduler.store.models import Job, Prediction, User
from scheduler.store.quotas import limits_for
from scheduler.store.registry import get_model, model_file, parse_ref
from workers.prediction import SampleError, sample_layout


@dataclass(frozen=True)
class PredictionRequest:
    dataset: str  # the caller's uploaded dataset, by name
    checkpoint: str | int | None = None  # best | latest | a step; None: best if kept, else latest
    workers: int = 1
    probabilities: bool = False
    batch_size: int = 1024  # samples a worker scores at once


@dataclass(frozen=True)
class _Model:
    checkpoint: Path
    step: int
    spec: dict[str, Any]  # the execution spec the checkpoint was trained by
    name: str
    job_id: int | None
    ref: str | None  # a registered model's "name@version"


def start_prediction(
    session: Session,
    owner: User,
    source: Job | str,
    request: PredictionRequest,
    backends: Backends,
) -> Prediction:
    """Check a prediction run of `source` (a job, or a model reference `model:name@3`), queue
    its workers as a job of their own, commit, announce it."""
    settings = backends.settings
    most = settings.max_prediction_workers
    if not 1 <= request.workers <= most:
        raise InvalidRequest(
            f"workers {request.workers}: ask for 1 to {most} (max_prediction_workers)"
        )
    model = _model(session, owner, source, request.checkpoint, settings.artifacts())
    card = read_model_card(model.checkpoint)
    if card is None:
        raise InvalidRequest(
            f"the checkpoint of {model.name} at step {model.step} has no model card"
        )
    if request.probabilities and not _ends_in_softmax(card.spec):
        raise InvalidRequest(
            f"probabilities are the softmax of class scores, and {model.name} does not end in "
            "a softmax_loss layer"
        )
    record = get_dataset(session, owner.id, request.dataset)
    if record is None:
        raise NotFound(f"you have no dataset named '{request.dataset}'; upload it first")
    path = dataset_file(record, settings.artifacts())
    try:
        layout = sample_layout(path, record.kind)
    except (SampleError, OSError, ValueError) as exc:
        raise InvalidRequest(f"dataset '{record.name}': {exc}") from None
    want = tuple(card.data.sample_shape)
    if math.prod(layout.row_shape) != math.prod(want):
        raise InvalidRequest(
            f"the model takes samples of shape {list(want)} ({math.prod(want)} values), and the "
            f"samples of dataset '{record.name}' have shape {list(layout.row_shape)}"
        )
    if layout.rows < request.workers:
        raise InvalidRequest(
            f"dataset '{record.name}' holds {layout.rows} sample(s): ask for at most as many "
            "workers"
        )
    limits = limits_for(session, owner, settings)
    check_rate(backends.redis, backends.keys, owner, limits)
    check_new_job(session, owner, limits, train_steps=0, slots=request.workers, gpus=0)
    topology = Topology(
        framework="",  # its workers exchange nothing
        nworker_groups=1,
        nworkers_per_group=request.workers,
        nserver_groups=0,
        nservers_per_group=0,
        server_worker_separate=False,
        slots_per_worker=1,
        gpus_per_worker=0,
    )
    preview = placement_preview(session, topology, 0)
    if preview.never:
        raise InvalidRequest(f"the prediction run {preview.reason}; ask for fewer workers")
    row = Prediction(
        owner_id=owner.id,
        job_id=model.job_id,
        model=model.ref,
        dataset=record.name,
        rows=layout.rows,
        step=model.step,
        workers=request.workers,
        probabilities=request.probabilities,
        checkpoint=str(model.checkpoint),
        dataset_file=str(path),
        dataset_format=record.kind,  # npz | csv, as the upload was checked
        sample_key=layout.key,
        batch_size=request.batch_size,
    )

    def keep(run: Job) -> None:
        row.run_job_id = run.id
        session.add(row)

    new = NewJob(
        name=f"predict-{model.name}"[:NAME_LENGTH],
        spec_yaml=yaml.safe_dump(model.spec, sort_keys=False),
        overrides={},
        spec=model.spec,
        topology=topology.to_dict(),
        kind=PREDICTION.name,
        framework="",
        train_steps=0,
        objective="",
    )
    admit_run(session, owner, new, preview, backends, keep=keep)
    return row


def _model(
    session: Session, owner: User, source: Job | str, choice: str | int | None, artifacts: Path
) -> _Model:
    if isinstance(source, Job):
        if source.owner_id != owner.id:  # others' jobs, an admin's view too: as if absent
            raise NotFound(f"no job {source.id}")
        kind = RUN_KINDS.get(source.kind)
        if not kind.trains:
            raise InvalidRequest(f"job {source.id} is a {kind.name} run; it has no model")
        step, path = report_store.model_checkpoint(session, source.id, choice, artifacts=artifacts)
        return _Model(path, step, dict(source.spec), source.name, source.id, None)
    name, which = parse_ref(source)
    version = get_model(session, owner, name, which)
    if choice is not None:
        raise InvalidRequest(
            f"model {version.name}@{version.version} is one checkpoint: name no checkpoint"
        )
    ref = f"{version.name}@{version.version}"
    # the job it was registered from (null once deleted): the run is listed on its page too
    return _Model(model_file(version), version.step, dict(version.spec), ref, version.job_id, ref)


def _ends_in_softmax(spec: JobSpec) -> bool:
    return any(layer.type == "softmax_loss" for layer in spec.neuralnet.expanded().layers)
