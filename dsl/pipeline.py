"""The rules of a job's `pipeline` section, checked with the other cross-field rules.

A pipeline cuts the net, in topological order, into stages that run one after another on
workers of their own: input layers on the first stage, layers that read the labels or run only
in tests on the last (where the labels are), and no layer reading a layer of a later stage.
These rules need only the job's keys, so they run before the net is built (dsl/planner.py then
chooses or takes the cuts); the compiler calls `pipeline_issues`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from dsl.errors import SpecIssue
from dsl.graph import SourceRef
from dsl.layers.base import LayerConfig
from dsl.registry import did_you_mean
from dsl.schema import JobSpec, PipelineConfig
from dsl.source import SourceMap
from dsl.topology import resolve_topology

UNSUPPORTED_ALGORITHMS = {
    "cd": "cd runs Gibbs sampling up and down through the rbm in one place, and a pipeline "
    "only passes bp's forward and backward passes through its stages",
    "bptt": "bptt carries the recurrent layers' hidden state from one chunk of a sequence to "
    "the next, and a pipeline's stages do not keep that state per micro-batch",
}


@dataclass(frozen=True)
class ScheduleSpec:
    """What a pipeline schedule asks of the plan and the job (torch.distributed.pipelining runs
    it; workers/distributed/pipeline.py maps the name to its class)."""

    name: str
    least_pieces: int  # pieces of the net per stage (virtual stages): at least
    most_pieces: int | None  # and at most (None: no limit of its own)
    must_write_pieces: bool  # virtual_stages has no default: the job must say it
    layout: Literal["loop", "v"]  # piece p runs on stage p mod K, or down and back up a V
    split_backward: bool  # the backward runs as input-gradient (B) and weight-gradient (W)
    in_rounds: bool  # the micro-batches run in rounds of max(1, M // K), which must divide M
    hint: str  # what the schedule is for, in the errors' hints

    @property
    def multi(self) -> bool:
        """Whether a stage may run more than one piece (torch's PipelineScheduleMulti)."""
        return self.most_pieces != 1

    def pieces_of(self, stage: int, stages: int, per_stage: int) -> list[int]:
        """The pieces `stage` of `stages` runs, in pipeline order."""
        if self.layout == "v":
            return [stage, 2 * stages - 1 - stage]
        return [stage + stages * i for i in range(per_stage)]

    def stage_of(self, piece: int, stages: int) -> int:
        """The stage that runs `piece`."""
        if self.layout == "v" and piece >= stages:
            return 2 * stages - 1 - piece
        return piece % stages

    def bubble_units(self, stages: int, per_stage: int) -> float:
        """The idle time of a stage per step, in one micro-batch's forward and backward on one
        stage, under the papers' assumption that forward, input-gradient and weight-gradient
        passes take equal time: K - 1 for GPipe and 1F1B, (K - 1) / V interleaved; a zero-bubble
        schedule fills two thirds of it with weight-gradient passes, ZB-V all of it."""
        idle = (stages - 1) / per_stage
        if self.layout == "v":
            return 0.0
        return idle / 3 if self.split_backward else idle


SCHEDULE_SPECS = {
    spec.name: spec
    for spec in (
        ScheduleSpec("gpipe", 1, 1, False, "loop", False, False, "all forwards, then backwards"),
        ScheduleSpec("1f1b", 1, 1, False, "loop", False, False, "one forward, one backward"),
        ScheduleSpec(
            "interleaved_1f1b", 2, None, True, "loop", False, True, "1f1b over pieces in turn"
        ),
        ScheduleSpec("zero_bubble", 1, None, False, "loop", True, True, "B and W passes"),
        ScheduleSpec("zbv", 2, 2, False, "v", True, False, "two pieces per stage in a V"),
    )
}


def schedule_spec(name: str) -> ScheduleSpec:
    return SCHEDULE_SPECS[name]


def last_stage_only(layer: LayerConfig) -> bool:
    """Whether `layer` must run on the last stage of itself: it reads the batch's labels (a loss
    or a metric) or runs only in the test phase."""
    return type(layer).reads_labels or layer.include == ["test"]


def sources_of(layer: LayerConfig) -> list[str]:
    """The names of the layers `layer` reads."""
    return [SourceRef.parse(text).layer for text in layer.srclayers]


def last_stage_layers(layers: Sequence[LayerConfig]) -> dict[str, str]:
    """Layer name -> why it runs on the last stage: its own reason, or a source that does (a
    layer reading one of them cannot run before it)."""
    pinned = {layer.name: _reason(layer) for layer in layers if last_stage_only(layer)}
    changed = True
    while changed:  # a fixed point: chains of such layers are short
        changed = False
        for layer in layers:
            if layer.name in pinned:
                continue
            late = next((src for src in sources_of(layer) if src in pinned), None)
            if late is not None:
                pinned[layer.name] = f"it reads '{late}', which runs on the last stage"
                changed = True
    return pinned


def _reason(layer: LayerConfig) -> str:
    if type(layer).reads_labels:
        return "it reads the labels"
    return "it runs only in the test phase"


def max_stages(layers: Sequence[LayerConfig]) -> int:
    """The most stages the net can be cut into: every stage but the last needs a layer of its
    own besides the inputs; the last may hold only the losses, metrics and test-only layers."""
    pinned = last_stage_layers(layers)
    body = [layer for layer in layers if layer.type != "input" and layer.name not in pinned]
    return len(body) + (1 if pinned else 0)


def pipeline_issues(spec: JobSpec, source: SourceMap) -> list[SpecIssue]:
    """Why `spec`'s pipeline section cannot run, located at its keys (none without one)."""
    config = spec.pipeline
    if config is None:
        return []
    issues = _algorithm_issues(spec, source)
    schedule = _schedule_issues(config, source)
    issues += schedule
    if schedule:  # the stage count and the rounds depend on the pieces per stage
        return issues
    issues += _microbatch_issues(spec, config, source)
    issues += _partition_issues(spec, source)
    layers = spec.neuralnet.expanded().layers
    if isinstance(config.stages, int):
        issues += _count_issues(layers, config, source)
    else:
        stages = [names for names, _ in spec.stage_lists() or []]
        issues += StageLists(layers, stages, source).issues()
    return issues


def _schedule_issues(config: PipelineConfig, source: SourceMap) -> list[SpecIssue]:
    """virtual_stages against what the schedule runs, and written pieces against it."""
    spec = SCHEDULE_SPECS[config.schedule]
    written = config.virtual_stages
    given = "virtual_stages" in config.model_fields_set and written is not None
    least, most = spec.least_pieces, spec.most_pieces
    if spec.must_write_pieces and not given:
        return [
            source.issue(
                ("pipeline", "schedule"),
                f"schedule {spec.name} needs virtual_stages: the pieces of the net each stage runs",
                f"add virtual_stages: {least} (or more: a smaller bubble, more messages)",
            )
        ]
    per = config.pieces_per_stage
    if per < least or (most is not None and per > most):
        if most == 1:
            hint = (
                "drop virtual_stages, or use schedule: interleaved_1f1b, zero_bubble or zbv to "
                "run several pieces per stage"
            )
            needs = "runs one piece of the net per stage"
        elif most == least:
            hint = f"use virtual_stages: {least}, or drop it"
            needs = f"runs exactly {least} pieces of the net per stage"
        else:
            hint = f"use virtual_stages: {least} or more"
            needs = f"runs at least {least} pieces of the net per stage"
        return [
            source.issue(
                ("pipeline", "virtual_stages"),
                f"schedule {spec.name} ({spec.hint}) {needs}: virtual_stages {per}",
                hint,
            )
        ]
    if isinstance(config.stages, list) and per > 1:
        pieces = len(config.stages)
        if pieces % per or pieces // per < 2:
            return [
                source.issue(
                    ("pipeline", "stages"),
                    f"{pieces} stage lists with virtual_stages {per}: the lists are the pieces "
                    f"of the net in pipeline order, {per} for each stage, so their number must "
                    f"be a multiple of {per} and at least {2 * per}",
                    f"write {max(2, round(pieces / per)) * per} lists, or change virtual_stages",
                )
            ]
    return []


def _algorithm_issues(spec: JobSpec, source: SourceMap) -> list[SpecIssue]:
    alg = spec.train_one_batch.alg
    if alg not in UNSUPPORTED_ALGORITHMS:
        return []
    return [
        source.issue(
            ("train_one_batch", "alg"),
            f"not supported: a pipeline with train_one_batch '{alg}': "
            f"{UNSUPPORTED_ALGORITHMS[alg]}",
            "use alg: bp, or drop the pipeline section",
        )
    ]


def _microbatch_issues(spec: JobSpec, config: PipelineConfig, source: SourceMap) -> list[SpecIssue]:
    issues = []
    batch, micro, stages = spec.data.batch_size, config.microbatches, config.count
    where = ("pipeline", "microbatches")
    # Each replica of the pipeline trains on its equal part of the batch.
    replicas = resolve_topology(spec.cluster, config).nworker_groups
    if batch % replicas == 0 and (batch // replicas) % micro:
        rows = batch // replicas
        each = f" ({replicas} replicas of {rows} rows)" if replicas > 1 else ""
        issues.append(
            source.issue(
                where,
                f"data.batch_size {batch}{each} does not split into {micro} equal micro-batches",
                f"use a number of micro-batches that divides {rows} "
                f"({_divisors_text(rows)}), or change data.batch_size",
            )
        )
    issues += _round_issues(config, source)
    if config.schedule == "1f1b" and micro < stages:
        default = "" if "schedule" in config.model_fields_set else " (the default)"
        fit = _divisors(batch, least=stages)
        enough = f"microbatches: {fit[0]}" if fit else f"a data.batch_size of {stages} or more"
        issues.append(
            source.issue(
                where,
                f"schedule 1f1b{default} needs at least as many micro-batches as stages: "
                f"{micro} micro-batch(es) for {stages} stages",
                f"use {enough} (more keep the bubble smaller), or schedule: gpipe",
            )
        )
    return issues


def _round_issues(config: PipelineConfig, source: SourceMap) -> list[SpecIssue]:
    """Interleaved and zero-bubble schedules run the micro-batches in rounds of max(1, M // K)
    (torch.distributed.pipelining), and the rounds must divide M."""
    spec = SCHEDULE_SPECS[config.schedule]
    micro, stages = config.microbatches, config.count
    rounds = max(1, micro // stages)
    if not spec.in_rounds or micro % rounds == 0:
        return []
    fits = [m for m in range(stages, 4 * stages + 1) if m % max(1, m // stages) == 0]
    return [
        source.issue(
            ("pipeline", "microbatches"),
            f"schedule {spec.name} runs the micro-batches in rounds of max(1, microbatches // "
            f"stages) = {rounds}, which must divide microbatches: {micro} micro-batches for "
            f"{stages} stages",
            f"use microbatches such as {', '.join(str(m) for m in fits[:6])} "
            "(and a data.batch_size they divide)",
        )
    ]


# batch_size has no upper bound: the hints try this many candidate divisors at most.
SCAN = 4096


def _divisors(number: int, least: int = 1) -> list[int]:
    """Divisors of `number` from `least` on, the smallest first: those among the next SCAN
    candidates, then the number itself."""
    found = [d for d in range(least, min(number, least + SCAN)) if number % d == 0]
    return [*found, number] if number >= least else found


def _divisors_text(number: int) -> str:
    found = _divisors(number)
    if len(found) <= 8 and number <= SCAN:
        return ", ".join(str(d) for d in found)
    small = [d for d in found[:7] if d != number]
    return ", ".join(str(d) for d in small) + f", ..., {number}"


def _partition_issues(spec: JobSpec, source: SourceMap) -> list[SpecIssue]:
    """A pipelined job's workers are its stages: no layer can also be split over them."""
    why = "a pipelined job's workers are its stages, so"
    hint = (
        "use partition_dim 0 or -1: replicas of the whole pipeline (cluster.nworker_groups) "
        "split the batch"
    )
    issues = []
    layers = spec.neuralnet.expanded().layers
    inherit = [layer.name for layer in layers if layer.partition_dim is None]
    if spec.neuralnet.partition_dim == 1 and inherit:
        issues.append(
            source.issue(
                ("neuralnet", "partition_dim"),
                f"{why} the layers {', '.join(inherit)} cannot also be split by feature over "
                "them (partition_dim: 1 of the net)",
                hint,
            )
        )
    for i, layer in enumerate(layers):
        if layer.partition_dim == 1:
            issues.append(
                source.issue(
                    ("neuralnet", "layers", i, "partition_dim"),
                    f"{why} layer '{layer.name}' cannot also be split by feature over them "
                    "(partition_dim: 1)",
                    hint,
                )
            )
    return issues


def _count_issues(
    layers: Sequence[LayerConfig], config: PipelineConfig, source: SourceMap
) -> list[SpecIssue]:
    most, pieces, per = max_stages(layers), config.pieces, config.pieces_per_stage
    if pieces <= most:
        return []
    if per > 1:
        return [
            source.issue(
                ("pipeline", "stages"),
                f"{config.count} stages of {per} pieces each cut the net into {pieces} pieces, "
                f"and it can be cut into at most {most}: every piece but the last needs a layer "
                "of its own between the inputs and the losses, metrics and test-only layers",
                f"use at most {most // per} stages, or fewer virtual_stages",
            )
        ]
    return [
        source.issue(
            ("pipeline", "stages"),
            f"{pieces} stages for a net that can be cut into at most {most}: every stage but the "
            "last needs a layer of its own between the inputs and the losses, metrics and "
            "test-only layers (which all run on the last stage)",
            f"use at most {most} stages",
        )
    ]


class StageLists:
    """The checks of stages written as lists of layer names."""

    def __init__(
        self, layers: Sequence[LayerConfig], stages: list[list[str]], source: SourceMap
    ) -> None:
        self.layers = {layer.name: layer for layer in layers}
        self.stages, self.source = stages, source
        self.last = len(stages) - 1
        self.pinned = last_stage_layers(layers)
        # name -> (stage, position in its list) of its first mention
        self.placed: dict[str, tuple[int, int]] = {}

    def issues(self) -> list[SpecIssue]:
        issues = self._name_issues()
        issues += self._placement_issues()
        issues += self._contiguity_issues()
        issues += self._size_issues()
        return issues

    def _name_issues(self) -> list[SpecIssue]:
        issues = []
        known = list(self.layers)
        for i, names in enumerate(self.stages):
            for j, name in enumerate(names):
                where = ("pipeline", "stages", i, j)
                if name not in self.layers:
                    issues.append(
                        self.source.issue(
                            where,
                            f"stage {i} names layer '{name}', which is not a layer of the net",
                            did_you_mean(name, known) or f"layers: {', '.join(known)}",
                        )
                    )
                elif name in self.placed:
                    first = self.placed[name][0]
                    stages = f"in stage {first} and again in stage {i}"
                    if first == i:
                        stages = f"twice in stage {i}"
                    issues.append(
                        self.source.issue(
                            where,
                            f"layer '{name}' is {stages}",
                            "a layer runs on exactly one stage: remove all but one",
                        )
                    )
                else:
                    self.placed[name] = (i, j)
        missing = [name for name in self.layers if name not in self.placed]
        if missing:
            issues.append(
                self.source.issue(
                    ("pipeline", "stages"),
                    f"layer(s) {', '.join(missing)} are in no stage",
                    "every layer runs on exactly one stage: "
                    + "; ".join(self._where_to_put(name) for name in missing),
                )
            )
        return issues

    def _where_to_put(self, name: str) -> str:
        if name in self.pinned or self.layers[name].type == "input":
            stage = self.last if name in self.pinned else 0
            return f"add '{name}' to stage {stage}"
        earliest = max(
            (self.placed[src][0] for src in sources_of(self.layers[name]) if src in self.placed),
            default=0,
        )
        return f"add '{name}' to stage {earliest} or a later one"

    def _placement_issues(self) -> list[SpecIssue]:
        issues = []
        for name, (i, j) in self.placed.items():
            where = ("pipeline", "stages", i, j)
            if self.layers[name].type == "input" and i != 0:
                issues.append(
                    self.source.issue(
                        where,
                        f"input layer '{name}' is in stage {i}: the samples enter the pipeline "
                        "at its first stage",
                        "move it to stage 0",
                    )
                )
            elif name in self.pinned and i != self.last:
                issues.append(
                    self.source.issue(
                        where,
                        f"layer '{name}' is in stage {i}, and it must run on the last stage "
                        f"(stage {self.last}): {self.pinned[name]}",
                        f"move it to stage {self.last}",
                    )
                )
        return issues

    def _contiguity_issues(self) -> list[SpecIssue]:
        issues = []
        for name, (i, j) in self.placed.items():
            for src in sources_of(self.layers[name]):
                later = self.placed.get(src, (i, 0))[0]
                if later > i:
                    issues.append(
                        self.source.issue(
                            ("pipeline", "stages", i, j),
                            f"stage {i} is not contiguous: its layer '{name}' reads '{src}', "
                            f"which runs on the later stage {later}",
                            "a stage reads only layers of its own and earlier stages: move "
                            f"'{name}' to stage {later} or later, or '{src}' to stage {i} or "
                            "earlier",
                        )
                    )
        return issues

    def _size_issues(self) -> list[SpecIssue]:
        count = len(self.stages)
        if count > len(self.layers):
            return [
                self.source.issue(
                    ("pipeline", "stages"),
                    f"{count} stages for a net of {len(self.layers)} layers",
                    f"use at most {max_stages(list(self.layers.values()))} stages",
                )
            ]
        issues = []
        for i, names in enumerate(self.stages):
            ran = [name for name in names if name in self.layers]
            if not ran:
                message = f"stage {i} is empty"
            elif all(self.layers[name].type == "input" for name in ran):
                inputs = ", ".join(ran)
                message = f"stage {i} runs only input layers ({inputs}): it computes nothing"
            else:
                continue
            issues.append(
                self.source.issue(
                    ("pipeline", "stages", i),
                    message,
                    "give every stage at least one layer besides the inputs, or use fewer stages",
                )
            )
        return issues
