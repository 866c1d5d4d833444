"""The SQL schema of the job store (SQLAlchemy 2 declarative models).

Changes to these models go through an Alembic migration in scheduler/store/migrations/versions.
"""

from __future__ import annotations

import types
import typing
from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import BaseModel, Field
from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from contract.allocation import AllocationState
from dsl.run_kinds import TRAINING
from scheduler.store.states import JobState, NodeState, SweepState


def utcnow() -> datetime:
    return datetime.now(UTC)


def aware(moment: datetime) -> datetime:
    """SQLite hands back naive datetimes; every time we store is UTC."""
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


class Base(DeclarativeBase):
    pass


class User(Base):
    __tablename__ = "users"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(100), unique=True)
    is_admin: Mapped[bool] = mapped_column(Boolean, default=False)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class ApiToken(Base):
    __tablename__ = "api_tokens"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    label: Mapped[str] = mapped_column(String(100), default="")
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    last_used_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    expires_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    # The token that created this one (revoking it revokes this); None: made on the server.
    parent_id: Mapped[int | None] = mapped_column(
        ForeignKey("api_tokens.id", ondelete="CASCADE"), nullable=True, index=True
    )


# The quotas a user has: each is the operator's default (contract/settings.py, `quota_<name>`)
# unless an admin set the user's own (a UserQuota column); None means no limit.
QUOTA_NAMES = (
    "running_jobs",
    "slots",
    "gpus",
    "train_steps",
    "dataset_bytes",
    "artifact_bytes",
    "submissions_per_minute",
    "validations_per_minute",
    "queued_jobs",
    "sweep_trials",
)


class UserQuota(Base):
    """One user's quotas where an admin changed them; a null column is the default."""

    __tablename__ = "user_quotas"
    user_id: Mapped[int] = mapped_column(
        ForeignKey("users.id", ondelete="CASCADE"), primary_key=True
    )
    running_jobs: Mapped[int | None] = mapped_column(Integer, nullable=True)
    slots: Mapped[int | None] = mapped_column(Integer, nullable=True)
    gpus: Mapped[int | None] = mapped_column(Integer, nullable=True)
    train_steps: Mapped[int | None] = mapped_column(Integer, nullable=True)
    dataset_bytes: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    artifact_bytes: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    submissions_per_minute: Mapped[int | None] = mapped_column(Integer, nullable=True)
    validations_per_minute: Mapped[int | None] = mapped_column(Integer, nullable=True)
    queued_jobs: Mapped[int | None] = mapped_column(Integer, nullable=True)
    sweep_trials: Mapped[int | None] = mapped_column(Integer, nullable=True)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class Sweep(Base):
    """A hyperparameter search: trials of a base job (the document without `search`), each an
    ordinary job with `sweep_id` and `trial_number` set. Optuna's study (named `study_name`)
    holds the sampler's history beside these tables (scheduler/sweeps/study.py)."""

    __tablename__ = "sweeps"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    owner_id: Mapped[int] = mapped_column(ForeignKey("users.id"), index=True)
    name: Mapped[str] = mapped_column(String(100), index=True)
    state: Mapped[str] = mapped_column(String(16), index=True, default=SweepState.RUNNING)
    priority: Mapped[int] = mapped_column(Integer, default=0)
    spec_yaml: Mapped[str] = mapped_column(Text)  # the document as submitted
    overrides: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    base_job: Mapped[dict[str, Any]] = mapped_column(JSON)  # overrides applied, no search
    search: Mapped[dict[str, Any]] = mapped_column(JSON)  # the validated search section
    base_dir: Mapped[str | None] = mapped_column(Text, nullable=True)  # relative files' folder
    study_name: Mapped[str] = mapped_column(String(100), unique=True)
    best_trial: Mapped[int | None] = mapped_column(Integer, nullable=True)
    best_value: Mapped[float | None] = mapped_column(Float, nullable=True)
    pareto_trials: Mapped[list[int]] = mapped_column(JSON, default=list)  # several objectives
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False)  # no new trials
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    ended_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)


class Job(Base):
    __tablename__ = "jobs"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    owner_id: Mapped[int] = mapped_column(ForeignKey("users.id"), index=True)
    name: Mapped[str] = mapped_column(String(100), index=True)
    state: Mapped[str] = mapped_column(String(16), index=True, default=JobState.QUEUED)
    priority: Mapped[int] = mapped_column(Integer, default=0)
    spec_yaml: Mapped[str] = mapped_column(Text)  # the document as submitted
    overrides: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    # The document with the overrides applied (dsl/overrides.py effective_document); null only
    # for a job from before it was kept whose overrides could not be applied again.
    effective_yaml: Mapped[str | None] = mapped_column(Text, nullable=True)
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)  # validated, overrides applied
    topology: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)  # resolved cluster
    # The plugin types it uses, each {kind, type, plugin, version}: placed only on nodes whose
    # processes load those plugins (dsl/plugins.py); null: none.
    plugins: Mapped[list[dict[str, str]] | None] = mapped_column(JSON, nullable=True)
    # What its processes do (dsl/run_kinds.py): a training run's have a framework and train
    # train_steps; a prediction run's score a dataset, as its `Prediction` row says (its
    # framework is "", its train_steps 0, its objective "").
    kind: Mapped[str] = mapped_column(String(16), default=TRAINING.name)
    framework: Mapped[str] = mapped_column(String(32), default="local")
    train_steps: Mapped[int] = mapped_column(Integer)
    step: Mapped[int] = mapped_column(Integer, default=0)
    summary: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)  # final metrics
    # The job's objective (dsl/objective.py, resolved when it was checked), its best value
    # among group 0 rank 0's reports and the step of that value.
    objective: Mapped[str] = mapped_column(String(64), default="test/accuracy")
    objective_mode: Mapped[str] = mapped_column(String(3), default="max")
    best_metric: Mapped[float | None] = mapped_column(Float, nullable=True)
    best_step: Mapped[int | None] = mapped_column(Integer, nullable=True)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    scheduled_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    ended_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    sweep_id: Mapped[int | None] = mapped_column(ForeignKey("sweeps.id"), nullable=True, index=True)
    trial_number: Mapped[int | None] = mapped_column(Integer, nullable=True)  # Optuna's
    pruned_step: Mapped[int | None] = mapped_column(Integer, nullable=True)  # the rung
    # Placements before the current one (restarts, drains, lost nodes); its records carry it.
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    restarts: Mapped[int] = mapped_column(Integer, default=0)  # failures restarted from
    restart_from: Mapped[str | None] = mapped_column(Text, nullable=True)  # this attempt's point
    # The nodes its processes failed to start on (or were stuck on): placed again, it goes to
    # other nodes while one of those could take it. Null: none.
    avoided_nodes: Mapped[list[str] | None] = mapped_column(JSON, nullable=True)
    # Its compiled net as admission found it (dsl.compiler.CompiledJob.graph), which
    # GET /jobs/{id}/graph serves without compiling the job again. Null: stored before, or a
    # prediction run.
    graph: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True, deferred=True)
    pending_reason: Mapped[str | None] = mapped_column(Text, nullable=True)  # why not placed
    # Population-based training: [{"step", "params", "from_trial"}] (scheduler/sweeps/pbt.py).
    pbt_schedule: Mapped[list[dict[str, Any]] | None] = mapped_column(JSON, nullable=True)
    __table_args__ = (UniqueConstraint("sweep_id", "trial_number", name="uq_jobs_sweep_trial"),)


# What clients see of a job: the API's JobOut (api/schemas.py serves it, the SDK and the
# dashboard get it generated), defined here because the job list's SQL is built from its fields
# (scheduler/store/job_page.py): a field that is a Job column of the same name needs no other
# change.
class JobOut(BaseModel):
    id: int
    name: str
    owner: str = Field(description="the submitting user's name")
    state: JobState
    priority: int
    kind: str = Field(description="its run kind: training, or prediction (a prediction run's)")
    framework: str = Field(
        description="cluster.framework of a training run; '' for a prediction run"
    )
    train_steps: int = Field(description="the steps a training run trains; 0 for a prediction run")
    step: int = Field(
        description="the last training step reported; a prediction run's furthest worker's rows"
    )
    progress: float = Field(
        description="step / train_steps, 0..1; a prediction run's: step / its largest shard's rows"
    )
    created_at: datetime
    scheduled_at: datetime | None
    started_at: datetime | None
    ended_at: datetime | None
    duration_seconds: float | None = Field(
        description="running time so far (from start to end, or to now)"
    )
    summary: dict[str, Any] = Field(description="final metrics once the job ends")
    objective: str = Field(
        description="the metric 'best' is judged by (job language `objective`), e.g. val/accuracy"
    )
    objective_mode: Literal["min", "max"] = Field(
        description="max: a higher objective is better; min: a lower one"
    )
    best_metric: float | None = Field(
        description="the objective's best value so far (highest for max, lowest for min)"
    )
    best_step: int | None = Field(description="the step best_metric was reported at")
    error: str | None = Field(description="why the job failed")
    cancel_requested: bool
    overrides: dict[str, Any]
    topology: dict[str, Any] = Field(description="the resolved cluster: worker and server groups")
    queue_position: int | None = Field(description="1-based place in the queue while QUEUED")
    sweep_id: int | None = Field(description="the sweep the job is a trial of, if any")
    trial_number: int | None = Field(description="its number in the sweep, from 0")
    pruned_step: int | None = Field(description="PRUNED: the step (rung) its sweep stopped it at")
    restarts: int = Field(description="times it was restarted after a process or node failed")
    pending_reason: str | None = Field(
        description="QUEUED: why the cluster cannot place it now (e.g. not enough free slots)"
    )


# JobOut's fields that are not the Job column of their name: computed for one job by the API
# (api/routes/jobs.py) and for a page by the database (scheduler/store/job_page.py). Every other
# field of JobOut is the Job column of the same name, written as its type says (`JOB_FIELD_KINDS`).
JOB_COMPUTED_FIELDS = ("owner", "progress", "duration_seconds", "queue_position")
FieldKind = Literal["time", "float", "flag", "document", "plain"]


def field_kind(annotation: Any) -> FieldKind:
    """How a JobOut field's value is written, by its type (optional or not)."""
    kinds = typing.get_args(annotation) if isinstance(annotation, types.UnionType) else ()
    kind = next((k for k in kinds if k is not type(None)), annotation)
    if kind is datetime:
        return "time"
    if kind is float:
        return "float"
    if kind is bool:
        return "flag"
    if typing.get_origin(kind) is dict:
        return "document"
    return "plain"  # integers, strings and states: as stored


JOB_FIELD_KINDS: dict[str, FieldKind] = {
    name: field_kind(field.annotation) for name, field in JobOut.model_fields.items()
}


# The order queued jobs are read in: higher priority first, then submission order. Placement
# then shares the cluster fairly between their owners (scheduler/placement/plan.py order_queue).
QUEUE_ORDER = (Job.priority.desc(), Job.id)


class JobEvent(Base):
    __tablename__ = "job_events"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    state: Mapped[str] = mapped_column(String(16))
    reason: Mapped[str] = mapped_column(Text, default="")


class Metric(Base):
    __tablename__ = "metrics"
    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(64))
    step: Mapped[int] = mapped_column(Integer)
    value: Mapped[float] = mapped_column(Float)
    group: Mapped[int] = mapped_column("grp", Integer, default=0)
    rank: Mapped[int] = mapped_column(Integer, default=0)
    at: Mapped[float] = mapped_column(Float)  # unix time from the worker
    __table_args__ = (Index("ix_metrics_job_name_step", "job_id", "name", "step"),)


class LogLine(Base):
    __tablename__ = "logs"
    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    at: Mapped[float] = mapped_column(Float)
    group: Mapped[int] = mapped_column("grp", Integer, default=0)
    rank: Mapped[int] = mapped_column(Integer, default=0)
    line: Mapped[str] = mapped_column(Text)


class CheckpointRecord(Base):
    __tablename__ = "checkpoints"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    step: Mapped[int] = mapped_column(Integer)
    path: Mapped[str] = mapped_column(Text)
    size: Mapped[int] = mapped_column(BigInteger)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    # The objective's best step so far (checkpoint.keep_best): at most one of a job's is.
    best: Mapped[bool] = mapped_column(Boolean, default=False)
    __table_args__ = (UniqueConstraint("job_id", "step"),)


class PipelineTimeline(Base):
    """The latest timeline of one stage of a pipelined job (contract.stream.TimelineRecord):
    only the newest is kept, what the dashboard draws."""

    __tablename__ = "pipeline_timelines"
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    group: Mapped[int] = mapped_column("grp", Integer, primary_key=True)  # the pipeline replica
    rank: Mapped[int] = mapped_column(Integer, primary_key=True)  # the stage
    step: Mapped[int] = mapped_column(Integer)
    # [kind, micro-batch, start, end] lists, seconds from the start of the step
    events: Mapped[list[list[Any]]] = mapped_column(JSON)


class Node(Base):
    __tablename__ = "nodes"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    queue: Mapped[str] = mapped_column(String(250))
    slots: Mapped[int] = mapped_column(Integer)
    gpus: Mapped[int] = mapped_column(Integer, default=0)
    state: Mapped[str] = mapped_column(String(16), default=NodeState.ALIVE)
    last_heartbeat: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    registered_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    # The parameter-server Redis servers its agent could not reach ("host:port: error"), as
    # its registration says (scheduler/agent/ps_reach.py); null: none, or an agent that does not
    # check.
    ps_unreachable: Mapped[list[str] | None] = mapped_column(JSON, nullable=True)
    # The plugins its agent's processes load, name -> version (dsl/plugins.py); null: none.
    plugins: Mapped[dict[str, str] | None] = mapped_column(JSON, nullable=True)
    # Why a plugin failed to load in its agent, as its registration says: it takes no jobs.
    # Null: every plugin loaded.
    plugin_error: Mapped[str | None] = mapped_column(Text, nullable=True)
    # The memory (MB) its agent offers its worker processes together (0: not said).
    memory_mb: Mapped[int] = mapped_column(Integer, default=0, server_default="0")


class Allocation(Base):
    """One process of a job placed on a node: a worker (group, rank) or a server shard."""

    __tablename__ = "allocations"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    node_id: Mapped[int] = mapped_column(ForeignKey("nodes.id"), index=True)
    role: Mapped[str] = mapped_column(String(16))  # worker | server
    group: Mapped[int] = mapped_column("grp", Integer, default=0)
    rank: Mapped[int] = mapped_column(Integer, default=0)
    slots: Mapped[int] = mapped_column(Integer, default=1)
    gpus: Mapped[int] = mapped_column(Integer, default=0)
    # The indices of its node's GPUs it alone uses (null: none).
    devices: Mapped[list[int] | None] = mapped_column(JSON, nullable=True)
    state: Mapped[str] = mapped_column(String(16), default=AllocationState.PENDING, index=True)
    exit_code: Mapped[int | None] = mapped_column(Integer, nullable=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    ended_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)


class ModelVersion(Base):
    """One version of a user's registered model (scheduler/store/registry.py): a copy of a
    job's checkpoint, kept when the job goes, with what it was chosen by."""

    __tablename__ = "model_versions"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    owner_id: Mapped[int] = mapped_column(ForeignKey("users.id"), index=True)
    name: Mapped[str] = mapped_column(String(100))
    version: Mapped[int] = mapped_column(Integer)  # 1, 2, ... per (owner, name)
    job_id: Mapped[int | None] = mapped_column(
        ForeignKey("jobs.id", ondelete="SET NULL"), nullable=True
    )
    job_name: Mapped[str] = mapped_column(String(100))
    step: Mapped[int] = mapped_column(Integer)
    path: Mapped[str] = mapped_column(Text)
    size: Mapped[int] = mapped_column(BigInteger)
    objective: Mapped[str] = mapped_column(String(64))
    objective_mode: Mapped[str] = mapped_column(String(3))
    objective_value: Mapped[float | None] = mapped_column(Float, nullable=True)
    metrics: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)  # the job's summary
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)  # the job's execution spec
    data: Mapped[dict[str, Any]] = mapped_column(JSON)  # the model card's data facts
    tags: Mapped[list[str]] = mapped_column(JSON, default=list)  # a tag is on one version
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    __table_args__ = (UniqueConstraint("owner_id", "name", "version"),)


class DatasetRecord(Base):
    __tablename__ = "datasets"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    owner_id: Mapped[int] = mapped_column(ForeignKey("users.id"), index=True)
    name: Mapped[str] = mapped_column(String(100))
    kind: Mapped[str] = mapped_column(String(8))  # npz | csv | text | shards (a folder)
    path: Mapped[str] = mapped_column(Text)
    size: Mapped[int] = mapped_column(BigInteger)
    # What the upload's intake read of an .npz's or a .csv's values (contract/inventory.py):
    # checking a job reads it instead of the file. Null for other kinds, and for datasets
    # stored before migration 0019 (their files are inventoried when a job is checked).
    inventory: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    __table_args__ = (UniqueConstraint("owner_id", "name"),)


class JobEnvironment(Base):
    """What one worker process of a job trained with, as it reported at its start
    (contract.stream.EnvironmentRecord): the newest report of each (group, rank)."""

    __tablename__ = "job_environments"
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    group: Mapped[int] = mapped_column("grp", Integer, primary_key=True)
    rank: Mapped[int] = mapped_column(Integer, primary_key=True)
    facts: Mapped[dict[str, Any]] = mapped_column(JSON)  # EnvironmentRecord.facts()
    packages: Mapped[list[str]] = mapped_column(JSON, default=list)  # "name==version" lines
    reported_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class Webhook(Base):
    """A URL a user asked to be told of events at (scheduler/store/webhooks.py); deliveries are
    signed with its secret, which is shown once, when it is made."""

    __tablename__ = "webhooks"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    owner_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    url: Mapped[str] = mapped_column(Text)
    events: Mapped[list[str]] = mapped_column(JSON)
    secret: Mapped[str] = mapped_column(String(100))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    # The last delivery's end: "200", "500", "connection refused"... and when, of which event.
    last_status: Mapped[str | None] = mapped_column(Text, nullable=True)
    last_event: Mapped[str | None] = mapped_column(String(32), nullable=True)
    last_delivery_at: Mapped[datetime | None] = mapped_column(
        DateTime(timezone=True), nullable=True
    )


class WebhookDelivery(Base):
    """An event waiting to reach a webhook (the outbox): written in the transaction that made
    the event happen, sent by the scheduler's webhook thread, removed once delivered or given
    up."""

    __tablename__ = "webhook_deliveries"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    webhook_id: Mapped[int] = mapped_column(
        ForeignKey("webhooks.id", ondelete="CASCADE"), index=True
    )
    event: Mapped[str] = mapped_column(String(32))
    body: Mapped[str] = mapped_column(Text)  # the JSON sent, as signed
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    due_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow, index=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class Prediction(Base):
    """A batch prediction run (scheduler/admission/predict.py): a job's or a registered model's
    checkpoint scoring a user's dataset on the cluster. Its workers are the processes of the
    placed job `run_job_id` (of kind prediction, dsl/run_kinds.py), whose state it shares; what
    they score is here (contract/prediction.py's PredictionTask, which the scheduler hands
    them)."""

    __tablename__ = "predictions"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    owner_id: Mapped[int] = mapped_column(ForeignKey("users.id"), index=True)
    # The job whose checkpoint scores: a registered model's, the job it was registered from
    # (null once the job was deleted).
    job_id: Mapped[int | None] = mapped_column(
        ForeignKey("jobs.id", ondelete="SET NULL"), nullable=True, index=True
    )
    model: Mapped[str | None] = mapped_column(String(120), nullable=True)  # "name@3"
    run_job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), unique=True)
    dataset: Mapped[str] = mapped_column(String(100))
    rows: Mapped[int] = mapped_column(BigInteger)
    step: Mapped[int] = mapped_column(Integer)  # the checkpoint's training step
    workers: Mapped[int] = mapped_column(Integer)
    probabilities: Mapped[bool] = mapped_column(Boolean, default=False)
    checkpoint: Mapped[str] = mapped_column(Text)  # the safetensors file that scores
    dataset_file: Mapped[str] = mapped_column(Text)  # the uploaded dataset's file
    dataset_format: Mapped[str] = mapped_column(String(8))  # npz | csv
    sample_key: Mapped[str] = mapped_column(Text)  # the .npz array of samples ("" for a .csv)
    batch_size: Mapped[int] = mapped_column(Integer)  # samples a worker scores at once
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class DatasetUpload(Base):
    """A chunked upload not yet completed: its declared size and checksum, its parts' size.
    Its parts are files in its folder (contract/rundir.py's upload_dir); the declared size
    counts against the owner's dataset quota until it completes, is aborted or expires."""

    __tablename__ = "dataset_uploads"
    id: Mapped[str] = mapped_column(String(32), primary_key=True)  # a random hex id
    owner_id: Mapped[int] = mapped_column(ForeignKey("users.id"), index=True)
    name: Mapped[str] = mapped_column(String(100))
    filename: Mapped[str] = mapped_column(Text)
    kind: Mapped[str] = mapped_column(String(8))  # npz | csv | parquet | text
    size: Mapped[int] = mapped_column(BigInteger)
    part_size: Mapped[int] = mapped_column(Integer)
    sha256: Mapped[str] = mapped_column(String(64))
    label_column: Mapped[str | None] = mapped_column(Text, nullable=True)
    completing: Mapped[bool] = mapped_column(Boolean, default=False)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    expires_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), index=True)
    __table_args__ = (UniqueConstraint("owner_id", "name"),)
