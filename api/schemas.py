"""Request and response bodies of the REST API (the OpenAPI document is generated from these)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from contract.allocation import AllocationState
from dsl.data_config import DATASET_NAME_PATTERN
from dsl.schema import PipelineSchedule
from scheduler.store.models import JobOut
from scheduler.store.states import JobState, NodeState, SweepState

PRIORITY_RANGE = 1_000_000


def finite(value: Any) -> Any:
    """JSON has no NaN or infinity: a diverged loss is reported as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: finite(item) for key, item in value.items()}
    if isinstance(value, list):
        return [finite(item) for item in value]
    return value


class Issue(BaseModel):
    path: str = Field(description="where in the job document, e.g. neuralnet.layers[2].units")
    line: int | None = Field(description="1-based line in the submitted YAML, if known")
    column: int | None = Field(description="1-based column in the submitted YAML, if known")
    message: str
    hint: str | None = Field(description="how to fix it, when there is an obvious way")


class ErrorBody(BaseModel):
    detail: str = Field(description="what went wrong, in one message")
    errors: list[Issue] = Field(
        default_factory=list, description="the job language's located problems (422 on a job)"
    )


class SubmitRequest(BaseModel):
    """The JSON form of a submission (the YAML form is the document alone)."""

    model_config = ConfigDict(extra="forbid")

    spec: str | dict[str, Any] = Field(description="the job: YAML text, or the document as JSON")
    overrides: dict[str, Any] = Field(
        default_factory=dict,
        description="key.path -> value, applied before validation like `--set` "
        "(layers by name: neuralnet.layers.fc1.units)",
    )
    priority: int = Field(
        default=0,
        ge=-PRIORITY_RANGE,
        le=PRIORITY_RANGE,
        description="higher runs first; equal priorities run in submission order",
    )
    base_dir: str | None = Field(
        default=None,
        description="admins only: the folder relative file paths in the job resolve against "
        "(the SDK sends the job file's folder); default the server's data directory",
    )


WARNINGS = "what a valid submission is warned of, e.g. selecting on the test split"


class JobDetail(JobOut):
    spec_yaml: str = Field(description="the document as submitted")
    effective_yaml: str | None = Field(
        description="the document the job runs: spec_yaml with the overrides applied"
    )
    override_lines: dict[str, int] = Field(
        description="each override's key.path -> its 1-based line in effective_yaml"
    )
    warnings: list[str] = Field(description=WARNINGS)


class ObjectiveOut(BaseModel):
    metric: str
    mode: Literal["min", "max"]


class SweepOut(BaseModel):
    id: int
    name: str
    owner: str = Field(description="the submitting user's name")
    state: SweepState
    algorithm: str = Field(description="search.algorithm: the Optuna sampler")
    pruner: str = Field(description="search.pruner.type")
    objectives: list[ObjectiveOut] = Field(description="one for `metric`, or `objectives`")
    trial_count: int = Field(description="how many trials the sweep runs")
    max_parallel: int
    trials_created: int = Field(description="trials queued so far")
    trials_ended: int = Field(description="trials that ended (any way)")
    best_trial: int | None = Field(description="the best trial's number (one objective)")
    best_value: float | None = Field(description="its value of the metric")
    cancel_requested: bool
    error: str | None = Field(description="why the sweep failed")
    created_at: datetime
    ended_at: datetime | None
    warnings: list[str] = Field(description=WARNINGS)


class ScheduleEntry(BaseModel):
    step: int = Field(description="from this step on")
    params: dict[str, Any] = Field(description="the values trained with")
    from_trial: int | None = Field(
        description="the trial whose checkpoint was taken here (PBT's exploit), else null"
    )


class TrialOut(BaseModel):
    number: int = Field(description="the trial's number in the sweep, from 0")
    job_id: int = Field(description="the trial's job (GET /jobs/{id})")
    state: JobState
    params: dict[str, Any] = Field(description="the value of each path of the search space")
    value: float | None = Field(description="its last value of the (first) metric, if any")
    values: list[float] | None = Field(
        description="its last value of each objective's metric, once it reported them all"
    )
    step: int
    train_steps: int
    pruned_step: int | None = Field(description="PRUNED: the step (rung) it was stopped at")
    schedule: list[ScheduleEntry] = Field(
        description="PBT: the values its weights were trained with, over steps; else empty"
    )


class TestEstimate(BaseModel):
    """What the trial a sweep chose scores on data the choice never saw."""

    __test__ = False  # not a pytest class

    metric: str = Field(description="the test split's counterpart of the sweep's metric")
    value: float | None = Field(description="the best trial's last reported value of it")


class SweepDetail(SweepOut):
    search: dict[str, Any] = Field(description="the search section, as validated")
    spec_yaml: str = Field(description="the document as submitted")
    trials: list[TrialOut] = Field(description="in trial order")
    best: TrialOut | None = Field(description="the best trial so far (one objective)")
    best_job: JobDetail | None = Field(description="the best trial's job, whole")
    best_test: TestEstimate | None = Field(
        description="the best trial's test figure: an honest estimate of what was chosen"
    )
    pareto_front: list[TrialOut] = Field(
        description="several objectives: the trials no other trial beats on every one"
    )


class ImportanceOut(BaseModel):
    metric: str = Field(description="the metric the importances are of")
    importances: dict[str, float] = Field(
        description="space path -> its share of the metric's variation (sum 1), largest first"
    )
    evaluator: str = Field(description="Optuna's evaluator: fanova, mean_decrease_impurity, ...")
    trials: int = Field(description="the finished trials it was computed from")


class SweepPage(BaseModel):
    items: list[SweepOut]
    next_before: int | None = Field(description="pass as ?before= for the next page; null at end")


class JobPage(BaseModel):
    items: list[JobOut]
    next_cursor: str | None = Field(description="pass as ?cursor= for the next page; null at end")


class LayerOut(BaseModel):
    name: str
    type: str
    sources: list[str]
    out_shape: list[int] | list[list[int]] = Field(
        description="per-sample output shape; one shape per output for slice layers"
    )
    params: int
    partition_dim: int


class AssignmentOut(BaseModel):
    role: str = Field(description="worker or server")
    group: int
    rank: int
    node: str
    slots: int
    gpus: int


class PlacementOut(BaseModel):
    feasible: bool = Field(description="whether the job would be placed right now")
    reason: str
    assignments: list[AssignmentOut] = Field(description="where each process would run")


class StageOut(BaseModel):
    layers: list[str] = Field(description="the layers the stage runs, in topological order")
    rank: int = Field(description="the stage that runs it (itself without virtual stages)")
    params: int
    time_ms: float = Field(
        description="forward and backward time of one batch, estimated or measured"
    )
    activation_mb: float = Field(
        description="the most activation memory the stage keeps at once for its backward passes"
    )
    inputs: list[str] = Field(description="layers of earlier stages whose outputs it reads")


class PipelinePlanOut(BaseModel):
    """The planner's stages (dsl/planner.py PipelinePlan.to_dict): with virtual stages, the
    pieces of the net in pipeline order, each with the stage that runs it."""

    stages: list[StageOut]
    microbatches: int
    schedule: PipelineSchedule
    virtual_stages: int = Field(description="pieces of the net each stage runs")
    rematerialize: bool
    max_stage_memory_mb: float | None
    costs: Literal["estimated", "measured"]
    bubble: float = Field(
        description="(K - 1) / (M + K - 1): the fraction of a batch's time a stage waits"
    )
    ideal_speedup: float = Field(description="K·M / (M + K - 1): with stages of equal time")
    balance: float = Field(description="the stages' mean time over the slowest's")
    expected_speedup: float = Field(description="ideal_speedup x balance")


class MemoryOut(BaseModel):
    """One worker process's estimated peak memory, part by part (dsl/memory.py)."""

    total_mb: int = Field(description="the estimate, which its memory limit must hold")
    parameters_mb: int
    gradients_mb: int
    updater_state_mb: int = Field(description="the updater's moments or momentum")
    activations_mb: int = Field(description="a training step's layer outputs, its batch share")
    data_mb: int = Field(description="every split of the data the worker holds")
    runtime_mb: int = Field(description="the interpreter and torch")


class ValidationOut(BaseModel):
    name: str
    layers: list[LayerOut]
    total_params: int
    topology: dict[str, Any]
    memory: MemoryOut = Field(description="each worker's estimated peak memory")
    placement: PlacementOut
    pipeline: PipelinePlanOut | None = Field(
        description="the pipeline's stages as the planner cut them; null without a pipeline"
    )


class SeriesOut(BaseModel):
    name: str
    group: int
    rank: int
    points: list[tuple[int, float | None]] = Field(
        description="[step, value] pairs in step order; null for NaN or infinity"
    )


class MetricsOut(BaseModel):
    series: list[SeriesOut]


class MetricNames(BaseModel):
    names: list[str]


class LogLineOut(BaseModel):
    id: int
    at: float = Field(description="unix time the worker wrote the line")
    group: int
    rank: int
    line: str


class LogsOut(BaseModel):
    lines: list[LogLineOut]
    next: int = Field(description="pass as ?after= to get the lines after these")


class EventOut(BaseModel):
    at: datetime
    state: JobState
    reason: str


class GraphNode(BaseModel):
    name: str
    type: str
    out_shape: list[int] | list[list[int]]
    params: int
    partition_dim: int
    include: list[Literal["train", "test"]] | None = Field(
        description="phases the layer runs in; null for both"
    )


class GraphEdge(BaseModel):
    source: str
    target: str


class GraphOut(BaseModel):
    nodes: list[GraphNode]
    edges: list[GraphEdge]


class TimelineEventOut(BaseModel):
    kind: Literal["F", "B", "W"] = Field(
        description="F: forward, B: backward (input gradients if split), W: weight gradients"
    )
    microbatch: int
    piece: int = Field(description="the piece of the net (virtual stage) it ran, in pipeline order")
    start: float = Field(description="seconds from the start of the step")
    end: float = Field(description="seconds from the start of the step")


class StageTimelineOut(BaseModel):
    """When one stage computed during one step (the stages of a pipeline time themselves)."""

    group: int = Field(description="the pipeline replica (worker group)")
    rank: int = Field(description="the stage")
    step: int
    events: list[TimelineEventOut]

    @classmethod
    def of(
        cls, group: int, rank: int, step: int, events: Sequence[Sequence[Any]]
    ) -> StageTimelineOut:
        """From the (kind, micro-batch, start, end, piece) events of a TimelineRecord or its
        row (rows stored before pieces were recorded lack the piece: the stage's own)."""
        return cls(
            group=group,
            rank=rank,
            step=step,
            events=[
                TimelineEventOut(
                    kind=kind,
                    microbatch=microbatch,
                    start=start,
                    end=end,
                    piece=piece[0] if piece else rank,
                )
                for kind, microbatch, start, end, *piece in events
            ],
        )


class PipelineOut(BaseModel):
    stages: list[list[str]] = Field(
        description="the layers of each stage (virtual stage), first first"
    )
    microbatches: int = Field(description="micro-batches per batch")
    schedule: PipelineSchedule
    virtual_stages: int = Field(description="pieces of the net each stage runs")
    piece_stages: list[int] = Field(description="the stage that runs each entry of stages")
    rematerialize: bool
    replicas: int = Field(description="pipelines trained side by side (the worker groups)")
    timelines: list[StageTimelineOut] = Field(
        description="each stage's latest timeline, by replica and stage; empty before the first"
    )


class CheckpointOut(BaseModel):
    step: int
    size: int = Field(description="bytes")
    created_at: datetime
    best: bool = Field(description="the objective's best checkpoint (docs/models.md)")


class NodeOut(BaseModel):
    name: str
    state: NodeState
    slots: int
    gpus: int
    slots_used: int
    gpus_used: int
    memory_mb: int = Field(description="MB its workers share, by slot (0: its agent does not say)")
    last_heartbeat: datetime
    ps_unreachable: list[str] = Field(
        description="parameter-server Redis its agent cannot reach, each 'host:port: error'"
    )
    plugins: dict[str, str] = Field(
        default_factory=dict,
        description="the plugins its processes load, name -> version",
    )
    plugin_error: str | None = Field(
        default=None,
        description="why a plugin failed to load in its agent, which takes no jobs; null: none",
    )


class AllocationOut(BaseModel):
    node: str
    role: str
    group: int
    rank: int
    state: AllocationState


HIDDEN = "null for other users' jobs unless the caller is an admin"


class RunningJob(BaseModel):
    job_id: int | None = Field(description=HIDDEN)
    name: str | None = Field(description=HIDDEN)
    state: JobState
    allocations: list[AllocationOut]


class QueueEntryOut(BaseModel):
    job_id: int | None = Field(description=HIDDEN)
    name: str | None = Field(description=HIDDEN)
    priority: int
    position: int
    slots: int
    gpus: int
    reason: str = Field(description="why the job is still waiting")


class ClusterOut(BaseModel):
    nodes: list[NodeOut]
    running: list[RunningJob]
    queue: list[QueueEntryOut]


class DatasetOut(BaseModel):
    name: str
    kind: str = Field(
        description="npz, csv (numbers), text (for the text source) or shards (a converted table)"
    )
    size: int = Field(description="bytes")
    owner: str
    created_at: datetime


class UploadStart(BaseModel):
    name: str = Field(
        pattern=DATASET_NAME_PATTERN,
        description="the dataset's name: letters, digits, '_', '.', '-'",
    )
    filename: str = Field(
        min_length=1,
        max_length=255,
        description="the file's name; its extension says the kind: .npz, .csv, .parquet, "
        ".txt (UTF-8 text)",
    )
    size: int = Field(ge=1, le=2**62, description="the file's bytes")
    sha256: str = Field(pattern=r"^[0-9a-fA-F]{64}$", description="the file's SHA-256 digest (hex)")
    part_size: int | None = Field(
        default=None,
        ge=1,
        le=2**31 - 1,
        description="bytes of every part but the last (at least 65536); default the "
        "service's largest, max_upload_part_bytes",
    )
    label_column: str | None = Field(
        default=None,
        min_length=1,
        max_length=1000,
        description="tables with text columns and Parquet files: the label column (default "
        "y where there is one, else the last)",
    )


class UploadOut(BaseModel):
    id: str
    name: str
    filename: str
    kind: str = Field(description="npz, csv, parquet, text or shards (a .tar of shards)")
    size: int = Field(description="the file's bytes, as declared")
    sha256: str
    part_size: int = Field(description="bytes of every part but the last")
    parts: int = Field(description="how many parts the file makes, numbered from 0")
    received: list[int] = Field(description="the parts that arrived: resume with the others")
    received_bytes: int
    completing: bool = Field(description="a completion is under way")
    created_at: datetime
    expires_at: datetime = Field(description="when it expires unless another part arrives")


class PartOut(BaseModel):
    upload_id: str
    part: int
    size: int = Field(description="bytes stored")


class LoopHealth(BaseModel):
    last_pass_seconds_ago: float | None = Field(
        description="seconds since the loop last completed a pass; null: never seen"
    )
    alive: bool = Field(description="it passed within the liveness timeout (or was never seen)")


class Health(BaseModel):
    status: str = Field(description="ok when the database, Redis and the scheduler's loops are")
    db: bool
    redis: bool
    scheduler: LoopHealth | None = Field(
        default=None, description="the scheduler's placement loop (null when Redis is away)"
    )
    ingest: LoopHealth | None = Field(
        default=None, description="the ingester, job streams into SQL (null when Redis is away)"
    )


ERROR_DESCRIPTIONS = {
    400: "bad request (e.g. multipart form data that cannot be parsed)",
    401: "missing, invalid or expired API token",
    403: "refused: not allowed for this user (admins only, or over a quota), or a recorded "
    "file lies outside its job's run directory or its owner's folder",
    404: "no such object, or not yours",
    409: "not allowed in the object's current state",
    413: "request body too large",
    415: "unsupported content type or file kind",
    422: "invalid job (with located errors) or invalid parameters",
    429: "too many requests of this kind (submissions, tokens created, open streams): wait "
    "the seconds of the Retry-After header",
    503: "the database or Redis is unavailable",
}


def errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses=` entries for error statuses, all with the ErrorBody shape."""
    return {
        code: {"model": ErrorBody, "description": ERROR_DESCRIPTIONS[code]}
        for code in (*codes, 503)
    }


class ModelRegister(BaseModel):
    name: str = Field(
        pattern=DATASET_NAME_PATTERN,
        description="the model's name: letters, digits, '_', '.', '-'; a new version each time",
    )
    job_id: int = Field(ge=1, le=2**31 - 1, description="one of your jobs")
    checkpoint: str | None = Field(
        default=None,
        pattern=r"^(best|latest|[0-9]{1,10})$",
        description="best, latest or a step; default the job's best where it kept one, else "
        "its latest",
    )


class ModelVersionOut(BaseModel):
    name: str
    version: int
    ref: str = Field(description="name@version, as jobs and commands take it (model:name@3)")
    tags: list[str] = Field(description="e.g. production; a tag is on one version of a name")
    job_id: int | None = Field(description="the job it came from (null once deleted)")
    job_name: str
    step: int = Field(description="the checkpoint's training step")
    size: int = Field(description="bytes")
    objective: str = Field(description="the job's objective metric, e.g. val/accuracy")
    objective_mode: str = Field(description="max or min")
    objective_value: float | None = Field(description="the objective's value at that step")
    metrics: dict[str, Any] = Field(description="the job's summary: its final figures")
    input: dict[str, Any] = Field(
        description="the samples it takes: sample_shape, x_dtype, num_classes, vocabulary"
    )
    spec: dict[str, Any] = Field(description="the job's execution spec")
    created_at: datetime


class ModelTag(BaseModel):
    tag: str = Field(
        pattern=r"^[A-Za-z][A-Za-z0-9_.\-]{0,49}$", description="a letter, then letters, digits"
    )


class PredictionCreate(BaseModel):
    dataset: str = Field(
        pattern=DATASET_NAME_PATTERN, description="one of your uploaded datasets, by name"
    )
    checkpoint: str | None = Field(
        default=None,
        pattern=r"^(best|latest|[0-9]{1,10})$",
        description="a job's checkpoint: best, latest or a step; default the best where one was "
        "kept, else the latest (a registered model is one checkpoint: none)",
    )
    workers: int = Field(
        default=1, ge=1, le=1024, description="workers scoring disjoint shards of the dataset"
    )
    probabilities: bool = Field(
        default=False, description="the softmax of the class scores instead of the scores"
    )
    batch_size: int = Field(default=1024, ge=1, le=65536, description="samples scored at once")


class PredictionOut(BaseModel):
    id: int
    job_id: int | None = Field(description="the job whose checkpoint scores (a model's: its job)")
    model: str | None = Field(description="the registered model that scores, name@version")
    run_job_id: int = Field(description="the placed job whose workers score (its live stream)")
    dataset: str
    rows: int = Field(description="samples in the dataset")
    step: int = Field(description="the checkpoint's training step")
    workers: int
    probabilities: bool
    state: JobState = Field(description="the run's state (its placed job's)")
    progress: float = Field(description="rows scored / rows, 0..1")
    rows_done: int
    error: str | None = Field(description="why the run failed")
    created_at: datetime
    ended_at: datetime | None
