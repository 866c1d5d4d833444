"""The job language: the single source of truth for every key of a job document.

The JSON Schema generated from `JobSpec` is published as docs/job.schema.json for editors.
"""

from __future__ import annotations

import json
import warnings
from typing import TYPE_CHECKING, Annotated, Any, Literal, Union

from pydantic import Field, model_validator

import dsl.layers  # noqa: F401  (registers every layer type)
from dsl.blocks import (
    MAX_EXPANDED_LAYERS,
    ExpandedNet,
    NetItem,
    RepeatBlock,
    expand_layers,
    expand_stage,
    expanded_count,
    layer_union,
)
from dsl.config import StrictModel
from dsl.data_config import DataConfig
from dsl.frameworks import FRAMEWORK_SPECS
from dsl.layers.base import LAYERS, LayerConfig
from dsl.objective import ObjectiveConfig
from dsl.search import SearchConfig
from dsl.updater_config import UpdaterConfig, updater_union


def _item_union() -> Any:
    """A net's items: the registered layer types and repeated blocks, told apart by `type`."""
    classes = [*dict.fromkeys(cls for _, cls in LAYERS.items()), RepeatBlock]
    return Annotated[Union[tuple(classes)], Field(discriminator="type")]  # noqa: UP007


def _framework_names() -> Any:
    return Literal[tuple(FRAMEWORK_SPECS.names_as_registered())]


if TYPE_CHECKING:
    AnyItem = NetItem
    Framework = str
else:
    AnyItem = _item_union()
    Framework = _framework_names()


class NeuralNetConfig(StrictModel):
    """SINGA's NeuralNet: named layers connected through `srclayers`."""

    partition_dim: Literal[-1, 0, 1] = Field(
        default=0,
        description="how the net is split over the workers of a group: 0 batch, 1 features, "
        "-1 not at all; layers may override it",
    )
    layers: list[AnyItem] = Field(
        min_length=1, description="the layers (and repeated blocks of layers), in any order"
    )

    @model_validator(mode="after")
    def _bounded(self) -> NeuralNetConfig:
        count = expanded_count(self.layers)
        if count > MAX_EXPANDED_LAYERS:
            raise ValueError(
                f"the net has {count:,} layers once its blocks are repeated, more than the "
                f"limit of {MAX_EXPANDED_LAYERS:,}; repeat fewer times or fewer layers"
            )
        return self

    def expanded(self) -> ExpandedNet:
        """The net's layers with every repeated block expanded into its copies."""
        return expand_layers(self.layers)


class BPConfig(StrictModel):
    """Back-propagation over a feed-forward DAG."""

    alg: Literal["bp"]


class BPTTConfig(StrictModel):
    """Back-propagation through time, truncated every `unroll_len` steps of the sequence."""

    alg: Literal["bptt"]
    unroll_len: int = Field(
        default=0, ge=0, description="time steps per truncated chunk; 0 = the whole sequence"
    )


class CDConfig(StrictModel):
    """Contrastive divergence CD-k for the net's rbm layer."""

    alg: Literal["cd"]
    k: int = Field(default=1, ge=1, description="Gibbs sampling steps per update")


TrainOneBatchConfig = Annotated[BPConfig | BPTTConfig | CDConfig, Field(discriminator="alg")]


class TestConfig(StrictModel):
    __test__ = False  # not a pytest class

    freq: int = Field(default=0, ge=0, description="evaluate every N steps; 0 = only at the end")
    steps: int = Field(default=0, ge=0, description="test batches per evaluation; 0 = whole split")


class ValidateConfig(StrictModel):
    """Evaluations on the validation split, which model selection reads (the test split is
    left for the final, honest figure)."""

    freq: int = Field(
        default=0,
        ge=0,
        description="evaluate the validation split every N steps; 0 = only at the end",
    )
    steps: int = Field(
        default=0, ge=0, description="validation batches per evaluation; 0 = the whole split"
    )


class EarlyStopConfig(StrictModel):
    """Stop when the objective (on the validation split) has stopped improving."""

    patience: int = Field(
        default=5,
        ge=1,
        description="validations in a row without an improvement of the objective before the "
        "job stops",
    )
    min_delta: float = Field(
        default=0.0,
        ge=0.0,
        description="the least change of the objective, in its better direction, that counts as "
        "an improvement",
    )


class InitFrom(StrictModel):
    """A checkpoint on the service to start from (fine-tuning): one of your jobs', or one of
    your registered models."""

    job: int | None = Field(default=None, ge=1, le=2**31 - 1, description="one of your jobs")
    checkpoint: str | None = Field(
        default=None,
        pattern=r"^(best|latest|[0-9]{1,10})$",
        description="the job's checkpoint: best, latest or a step; default its best where it "
        "kept one, else its latest",
    )
    model: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,99}(@([0-9]{1,10}|[A-Za-z][A-Za-z0-9_.\-]{0,49}))?$",
        description="one of your registered models: name@3, name@production or name (its newest)",
    )

    @model_validator(mode="after")
    def _one_source(self) -> InitFrom:
        if (self.job is None) == (self.model is None):
            raise ValueError("give one of job (one of your jobs) and model (a registered model)")
        if self.model is not None and self.checkpoint is not None:
            raise ValueError("checkpoint chooses among a job's checkpoints; a model version is one")
        return self


class CheckpointConfig(StrictModel):
    freq: int = Field(default=0, ge=0, description="save every N steps; 0 = only at the end")
    keep: int = Field(default=3, ge=1, description="how many recent checkpoints to keep")
    keep_best: bool = Field(
        default=False,
        description="also keep the checkpoint of the objective's best step, whatever `keep` "
        "deletes (saved at the validation that finds it)",
    )
    init_from: str | InitFrom | None = Field(
        default=None,
        description="the checkpoint whose parameters initialise this net, matched by name "
        "<layer>/<param> and shape: {job: ID, checkpoint: best} (one of your jobs), or a "
        "checkpoint file or run directory (admins on the service)",
    )


# How a pipeline's micro-batches run (torch.distributed.pipelining's schedules).
PipelineSchedule = Literal["gpipe", "1f1b", "interleaved_1f1b", "zero_bubble", "zbv"]


class PipelineConfig(StrictModel):
    """GPipe / PipeDream pipeline parallelism: the net cut into stages, one worker each, and
    every batch into micro-batches that flow through them."""

    stages: Annotated[int, Field(ge=2)] | Annotated[list[list[str]], Field(min_length=2)] = Field(
        description="how many stages (the planner chooses the cuts) or the layer names of each "
        "stage, first stage first"
    )
    microbatches: int = Field(default=1, ge=1, description="micro-batches per batch")
    schedule: PipelineSchedule = Field(
        default="1f1b",
        description="gpipe: all forwards, then all backwards; 1f1b: one forward, one backward "
        "(bounds the activations in flight); interleaved_1f1b: 1f1b over virtual_stages pieces "
        "per stage (a smaller bubble); zero_bubble: backward split into input- and "
        "weight-gradient passes that fill the bubble (virtual_stages pieces per stage, 1 or "
        "more); zbv: zero bubble over two pieces per stage in a V",
    )
    virtual_stages: int | None = Field(
        default=None,
        ge=1,
        le=64,
        description="pieces of the net each stage runs (interleaved_1f1b: 2 or more; "
        "zero_bubble: 1 or more, default 1; zbv: 2); with written stages, the lists are the "
        "pieces in pipeline order",
    )
    rematerialize: bool = Field(
        default=False,
        description="recompute each stage's activations in the backward pass instead of keeping "
        "them (less memory, more compute)",
    )
    max_stage_memory_mb: float | None = Field(
        default=None, gt=0, description="planner: the most activation memory one stage may hold"
    )

    @property
    def pieces_per_stage(self) -> int:
        """The pieces of the net each stage runs: virtual_stages, or the schedule's default."""
        if self.virtual_stages is not None:
            return self.virtual_stages
        return 2 if self.schedule == "zbv" else 1

    @property
    def pieces(self) -> int:
        """The number of pieces the net is cut into, over all the stages."""
        if isinstance(self.stages, int):
            return self.stages * self.pieces_per_stage
        return len(self.stages)

    @property
    def count(self) -> int:
        """The number of stages (worker processes of one pipeline)."""
        if isinstance(self.stages, int):
            return self.stages
        return max(1, len(self.stages) // self.pieces_per_stage)


Precision = Literal["fp32", "bf16", "fp16"]


class ResourcesConfig(StrictModel):
    gpus_per_worker: int = Field(
        default=0,
        ge=0,
        le=64,
        description="GPUs each worker takes, its own (more than 1 only for a framework that uses "
        "several)",
    )
    slots_per_worker: int = Field(
        default=1, ge=1, le=4096, description="CPU slots each worker takes"
    )
    memory_mb: int | None = Field(
        default=None,
        ge=64,
        le=2**31 - 1,
        description="the most memory (MB) each worker process may use, enforced where it runs; "
        "at most its slots' share of a node's memory, which is the default",
    )


class ClusterConfig(StrictModel):
    """SINGA's cluster topology: worker groups and server groups."""

    framework: Framework = Field(default="local", description="preset topology")
    nworker_groups: int | None = Field(default=None, ge=1)
    nworkers_per_group: int | None = Field(default=None, ge=1)
    nserver_groups: int | None = Field(default=None, ge=0)
    nservers_per_group: int | None = Field(default=None, ge=0)
    server_worker_separate: bool | None = None
    sync_freq: int = Field(
        default=10, ge=1, description="hogwild and localsgd: updates between syncs"
    )
    staleness: int | None = Field(default=None, ge=0, description="bounded staleness (SSP)")
    compression: Literal["none", "fp16", "bf16", "powersgd"] = Field(
        default="none",
        description="how gradients travel between workers: as they are, in fp16 or bf16, or "
        "as PowerSGD's low-rank factors (allreduce on one worker group only)",
    )
    powersgd_rank: int = Field(
        default=1,
        ge=1,
        le=32,
        description="compression powersgd: the rank of each gradient matrix's approximation",
    )
    localsgd_warmup: int = Field(
        default=0,
        ge=0,
        description="localsgd: steps that all-reduce the gradients, as allreduce does, before "
        "the replicas train apart (post-local SGD)",
    )
    localsgd_delay: int = Field(
        default=0,
        ge=0,
        description="localsgd: steps the replicas go on training while their parameters are "
        "averaged (the mean taken in after them); 0 waits for each averaging; below sync_freq",
    )
    resources: ResourcesConfig = Field(default_factory=ResourcesConfig)
    max_restarts: int = Field(
        default=3,
        ge=0,
        le=100,
        description="times the service restarts the job from its latest restart point after "
        "a process or node fails; then the job fails with the last cause",
    )


warnings.filterwarnings("ignore", message='Field name "validate" in "JobSpec" shadows')


class JobSpec(StrictModel):
    """One training job: data, net, algorithm, updater, schedule of tests and checkpoints."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,99}$", description="job name")
    description: str | None = None
    seed: int = Field(
        default=0,
        ge=0,
        le=2**63 - 1,  # torch generators take 64-bit seeds
        description="seeds data splits, initialisation and order",
    )
    data: DataConfig
    neuralnet: NeuralNetConfig
    train_one_batch: TrainOneBatchConfig = Field(default_factory=lambda: BPConfig(alg="bp"))
    updater: UpdaterConfig
    train_steps: int = Field(gt=0, description="number of training iterations")
    disp_freq: int = Field(default=100, gt=0, description="report training metrics every N steps")
    test: TestConfig = Field(default_factory=TestConfig)
    # The language's key; on the model it shadows pydantic's deprecated classmethod
    # BaseModel.validate, which nothing calls (model_validate is the one used).
    validate: ValidateConfig = Field(  # type: ignore[assignment]
        default_factory=ValidateConfig,
        description="when and how much to evaluate the validation split (data.validation_fraction)",
    )
    objective: ObjectiveConfig | None = Field(
        default=None,
        description="what 'best' means for this job; default val/accuracy or val/loss with a "
        "validation split, else test/accuracy or test/loss",
    )
    early_stop: EarlyStopConfig | None = Field(
        default=None, description="stop when the objective stops improving on the validation split"
    )
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    cluster: ClusterConfig = Field(default_factory=ClusterConfig)
    pipeline: PipelineConfig | None = Field(
        default=None, description="cut the net into pipeline stages (GPipe / PipeDream 1F1B)"
    )
    precision: Precision = Field(
        default="fp32",
        description="what the forward passes compute in: fp32, or bf16 / fp16 autocast with the "
        "parameters kept in fp32",
    )
    compile: bool = Field(
        default=False,
        description="run the net's forward through torch.compile (eager where it cannot be "
        "compiled)",
    )
    search: SearchConfig | None = Field(
        default=None,
        description="makes the job a sweep: trials of this job with values from a search space",
    )

    def layer(self, name: str) -> LayerConfig:
        for layer in self.neuralnet.expanded().layers:
            if layer.name == name:
                return layer
        raise KeyError(name)

    def stage_lists(self) -> list[tuple[list[str], list[int]]] | None:
        """The pipeline's stages as written lists, each block or copy they name expanded into
        its layers, with the written position of every name; None without written lists."""
        if self.pipeline is None or isinstance(self.pipeline.stages, int):
            return None
        net = self.neuralnet.expanded()
        return [expand_stage(names, net) for names in self.pipeline.stages]


def rebuild_schema() -> None:
    """Make the layer and updater types registered since this module was imported (a plugin's,
    dsl/plugins.py) part of the language: its models are rebuilt with the registries' unions."""
    RepeatBlock.model_fields["layers"].annotation = list[layer_union()]  # type: ignore[assignment, misc]
    RepeatBlock.model_rebuild(force=True)
    NeuralNetConfig.model_fields["layers"].annotation = list[_item_union()]  # type: ignore[assignment, misc]
    NeuralNetConfig.model_rebuild(force=True)
    JobSpec.model_fields["updater"].annotation = updater_union()
    JobSpec.model_rebuild(force=True)


def json_schema() -> dict[str, Any]:
    schema = JobSpec.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "Trainyard job"
    return schema


def json_schema_text() -> str:
    return json.dumps(json_schema(), indent=2, sort_keys=True) + "\n"
