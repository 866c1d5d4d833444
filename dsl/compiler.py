"""The compile pipeline, in its fixed order:

parse YAML with positions -> apply overrides -> validate with pydantic -> cross-field checks
(and the caller's rules) -> describe the data -> resolve the layer DAG -> infer shapes -> build
and initialise modules. `compile_job` runs it; everything else here is a step of it.

Every failure on the way is a `JobSpecError` whose issues carry the YAML path, line:column, a
message and a hint. Several problems are reported together where the stage allows it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from pydantic import ValidationError

from dsl.blocks import expanded_count
from dsl.budget import CompileBudget
from dsl.errors import DataSourceError, JobSpecError, Path, SpecIssue
from dsl.graph import SourceRef, resolve_dag
from dsl.init import initialise
from dsl.layers.base import BuildContext, Layer, LayerConfig, LayerShapeError, Shape
from dsl.net import CompiledLayer, NeuralNet
from dsl.objective import objective_issues
from dsl.overrides import apply_overrides
from dsl.pipeline import pipeline_issues
from dsl.plugins import ELEMENTWISE, PLUGIN_UPDATERS, seed_for
from dsl.schema import JobSpec
from dsl.search_checks import search_issues
from dsl.source import ParsedDocument, SourceMap, read_document
from dsl.sync_checks import sync_issues
from dsl.topology import Topology, resolve_topology, topology_problems
from dsl.validation import translate_validation_error


@dataclass(frozen=True)
class LayerRow:
    """One line of the layer table that `trainyard validate` and the API show."""

    name: str
    type: str
    sources: list[str]
    out_shape: list[int] | list[list[int]]
    params: int
    partition_dim: int


@dataclass
class CompiledJob:
    spec: JobSpec
    net: NeuralNet
    table: list[LayerRow]
    source: SourceMap

    @property
    def total_params(self) -> int:
        return sum(row.params for row in self.table)

    def graph(self) -> dict[str, Any]:
        """The compiled net as the service stores it at admission and serves it
        (GET /jobs/{id}/graph): layers with their output shapes, parameter counts, partition
        dimensions and phases (null: both), and the edges between layers."""
        include = {layer.name: layer.include for layer in self.spec.neuralnet.expanded().layers}
        return {
            "nodes": [
                {
                    "name": row.name,
                    "type": row.type,
                    "out_shape": row.out_shape,
                    "params": row.params,
                    "partition_dim": row.partition_dim,
                    "include": include.get(row.name),
                }
                for row in self.table
            ],
            "edges": [
                {"source": SourceRef.parse(src).layer, "target": row.name}
                for row in self.table
                for src in row.sources
            ],
        }


# A net past this cannot train on the service, and building it would take the memory of the
# process that checks it (the API): layers are counted on the meta device before they are built.
MAX_PARAMS = 1_000_000_000

DataDescription = BuildContext | Callable[[JobSpec], BuildContext]
Rules = Callable[[JobSpec, SourceMap], list[SpecIssue]]


def compile_job(
    job: str | Mapping[str, Any] | ParsedDocument | JobSpec,
    data: DataDescription,
    *,
    overrides: Mapping[str, Any] | None = None,
    filename: str = "<job>",
    rules: Rules | None = None,
    budget: CompileBudget | None = None,
) -> CompiledJob:
    """The one way from a job to its checked, compiled net.

    `job` is the document (YAML text, a mapping or a `ParsedDocument`, with `overrides` applied)
    or a `JobSpec`
    that was validated before (a stored execution spec): that one is trusted and goes straight
    to the build. `data` describes the samples, or is called with the spec to describe them
    (and may load them); its `DataSourceError`s are reported at `data.<field>`. `rules` adds
    the caller's own checks (a service's limits) to the cross-field ones. Every document is
    held to `budget`'s layers and elements (dsl/budget.py), and to its time where it has one.
    """
    budget = budget or CompileBudget()
    if isinstance(job, JobSpec):
        if overrides:
            raise ValueError("overrides apply to a job document, not to a validated JobSpec")
        spec, source = job, SourceMap(filename)
        source = source.aliased(written_paths(spec))
    else:
        spec, source = _validate(job, overrides, filename)
        # Counted before the layer graph is resolved, which costs more than linearly.
        budget.check_layers(expanded_count(spec.neuralnet.layers), source)
        budget.check_time(source, ("neuralnet", "layers"), "reading and validating it")
        source = source.aliased(written_paths(spec))
        issues = cross_field_issues(spec, source) + (rules(spec, source) if rules else [])
        if issues:
            raise JobSpecError(issues)
    budget.check_time(source, ("neuralnet", "layers"), "checking its layer graph")
    ctx = _describe(data, spec, source)
    net, table = _build_net(spec, source, ctx, budget)
    return CompiledJob(spec, net, table, source)


def _validate(
    document: str | Mapping[str, Any] | ParsedDocument,
    overrides: Mapping[str, Any] | None,
    filename: str,
) -> tuple[JobSpec, SourceMap]:
    parsed = read_document(document, filename)
    raw, source = parsed.raw, parsed.source
    if overrides:
        raw = apply_overrides(raw, overrides)
    try:
        return JobSpec.model_validate(raw), source
    except ValidationError as exc:
        raise JobSpecError(translate_validation_error(exc, raw, source)) from None


def written_paths(spec: JobSpec) -> dict[Path, Path]:
    """Where the paths of the expanded job (the layers of repeated blocks, the blocks named in
    pipeline stages) were written in the document, so that its errors point there."""
    aliases = spec.neuralnet.expanded().aliases()
    for i, (_, written) in enumerate(spec.stage_lists() or []):
        for k, j in enumerate(written):
            if k != j:
                aliases[("pipeline", "stages", i, k)] = ("pipeline", "stages", i, j)
    return aliases


def _describe(data: DataDescription, spec: JobSpec, source: SourceMap) -> BuildContext:
    if isinstance(data, BuildContext):
        ctx = data
    else:
        try:
            ctx = data(spec)
        except DataSourceError as exc:
            path = ("data", exc.field or "source")
            raise JobSpecError(source.issue(path, exc.message, exc.hint)) from None
    train = ctx.train_samples
    if train is not None and spec.data.batch_size > train:
        # Caught here rather than when the first batch is drawn, so `validate` reports it too.
        raise JobSpecError(
            source.issue(
                ("data", "batch_size"),
                f"batch_size {spec.data.batch_size} is larger than the {train} training samples",
                f"use at most {train}",
            )
        )
    return ctx


def cross_field_issues(spec: JobSpec, source: SourceMap) -> list[SpecIssue]:
    """Rules that span several keys: the DAG, what the training algorithm needs, the topology,
    the pipeline's stages, the objective and the sections that read it, a sweep's search."""
    layers = spec.neuralnet.expanded().layers
    _, issues = resolve_dag(layers, source)
    types = [layer.type for layer in layers]
    alg = spec.train_one_batch.alg
    if alg in ("bp", "bptt") and not any(_is_loss_type(t) for t in types):
        issues.append(
            source.issue(
                ("neuralnet", "layers"),
                f"train_one_batch '{alg}' needs a loss layer, and the net has none",
                "end the net with softmax_loss or euclidean_loss",
            )
        )
    if alg == "cd" and "rbm" not in types:
        issues.append(
            source.issue(
                ("train_one_batch", "alg"),
                "train_one_batch 'cd' trains an rbm layer, and the net has none",
                "add a layer of type rbm, or use alg: bp",
            )
        )
    if alg == "bptt" and not any(t in ("rnn", "lstm", "gru") for t in types):
        issues.append(
            source.issue(
                ("train_one_batch", "alg"),
                "train_one_batch 'bptt' is for recurrent nets, and the net has no rnn/lstm/gru",
                "use alg: bp for feed-forward nets",
            )
        )
    topology = resolve_topology(spec.cluster, spec.pipeline)
    for key, message, hint in topology_problems(topology):
        issues.append(source.issue(("cluster", *key.split(".")), message, hint))
    issues.extend(pipeline_issues(spec, source))
    issues.extend(_batch_issues(spec, topology, source))
    issues.extend(_precision_issues(spec, topology, source))
    issues.extend(sync_issues(spec, topology, source))
    issues.extend(_plugin_updater_issues(spec, topology, source))
    issues.extend(objective_issues(spec, topology, source))
    issues.extend(search_issues(spec, source))
    return issues


def _batch_issues(spec: JobSpec, topology: Topology, source: SourceMap) -> list[SpecIssue]:
    """Every worker of a job without pipeline stages reads its own equal share of each batch
    (workers/parallel.py), so the batch must split evenly between them."""
    workers = topology.nworker_groups * topology.nworkers_per_group
    if topology.stages > 1 or workers <= 1 or spec.data.batch_size % workers == 0:
        return []
    lower = spec.data.batch_size - spec.data.batch_size % workers
    return [
        source.issue(
            ("data", "batch_size"),
            f"batch_size {spec.data.batch_size} does not split evenly between the job's "
            f"{workers} workers, which each read an equal share of every batch",
            f"use a multiple of {workers}, e.g. {lower or workers} or {lower + workers}",
        )
    ]


def _precision_issues(spec: JobSpec, topology: Topology, source: SourceMap) -> list[SpecIssue]:
    """fp16 needs a GPU and an updater in the worker (see workers/precision.py). The device is
    only known where the job runs; a job that asks for no GPU is placed on CPUs."""
    if spec.precision != "fp16":
        return []
    issues = []
    if topology.gpus_per_worker == 0:
        issues.append(
            source.issue(
                ("precision",),
                "precision fp16 is for GPUs, and the job asks for none "
                "(cluster.resources.gpus_per_worker is 0): on a CPU fp16 is slower than fp32 "
                "and needs a loss scale",
                "use precision: bf16 on a CPU (its half precision, no loss scale), or set "
                "cluster.resources.gpus_per_worker: 1",
            )
        )
    if topology.servers:
        issues.append(
            source.issue(
                ("precision",),
                f"precision fp16 scales the loss, and the updates of this job "
                f"(framework {topology.framework} with server shards) are applied by the "
                "shards, which do not unscale them",
                "use precision: bf16 (no loss scale), or framework allreduce with one worker group",
            )
        )
    return issues


def _plugin_updater_issues(spec: JobSpec, topology: Topology, source: SourceMap) -> list[SpecIssue]:
    """Server shards each apply the updater to a slice of the parameters: a plugin updater
    runs there only if it says each element's update is its own (`elementwise`)."""
    name = spec.updater.type
    shards = topology.nserver_groups * topology.nservers_per_group
    if name not in PLUGIN_UPDATERS or name in ELEMENTWISE or not shards:
        return []
    return [
        source.issue(
            ("updater", "type"),
            f"the plugin updater '{name}' is not declared elementwise, and the server shards of "
            f"framework {topology.framework} apply the updater to slices of the parameters",
            f"declare it with @updater('{name}', elementwise=True) if each element's update "
            "depends on its own gradient and state alone, or use framework allreduce",
        )
    ]


def _is_loss_type(layer_type: str) -> bool:
    return layer_type.endswith("_loss")


def _build_net(
    spec: JobSpec, source: SourceMap, ctx: BuildContext, budget: CompileBudget
) -> tuple[NeuralNet, list[LayerRow]]:
    """Infer every layer's output shape from the data's sample shape and build the modules."""
    layers = spec.neuralnet.expanded().layers
    order, issues = resolve_dag(layers, source)
    if issues:
        raise JobSpecError(issues)
    position = {layer.name: i for i, layer in enumerate(layers)}
    shapes: dict[str, Shape | list[Shape]] = {}
    compiled: list[CompiledLayer] = []
    total = 0  # parameters so far
    elements = 0  # parameters and outputs for one sample so far
    for layer in order:
        path = ("neuralnet", "layers", position[layer.name])
        budget.check_time(source, path, f"building layer '{layer.name}'")
        refs = [SourceRef.parse(text) for text in layer.srclayers]
        if any(ref.layer not in shapes for ref in refs):
            continue  # a source failed to build; its own issue is already reported
        in_shapes = [_shape_of(shapes[ref.layer], ref) for ref in refs]
        try:
            module, out_shape = _build_layer(
                layer,
                in_shapes,
                ctx,
                budget=MAX_PARAMS - total,
                seed=seed_for(spec.seed, layer.name),
            )
        except _Unbuildable as exc:
            issues.append(
                source.issue(path, f"layer '{layer.name}' ({layer.type}): {exc}", exc.hint)
            )
            continue
        except LayerShapeError as exc:
            where = (*path, exc.field) if exc.field else (*path, "type")
            got = ", ".join(str(list(s)) for s in in_shapes) or "none"
            issues.append(
                source.issue(
                    where,
                    f"layer '{layer.name}' ({layer.type}): {exc.message} [input shapes: {got}]",
                    exc.hint,
                )
            )
            continue
        issues.extend(_param_key_issues(layer, module, path, source))
        params = sum(p.numel() for p in module.parameters())
        total += params
        elements += params + sum(math.prod(part) for part in _parts(out_shape))
        budget.check_elements(elements, source, path, layer.name)
        shapes[layer.name] = out_shape
        compiled.append(CompiledLayer(layer, module, out_shape, refs))
    if issues:
        raise JobSpecError(issues)
    # Whatever a layer expanded to where it was built, the net's layers are counted too.
    budget.check_layers(len(compiled), source)

    net = NeuralNet(compiled)
    _initialise(net, spec.seed)
    default_dim = spec.neuralnet.partition_dim
    table = [
        LayerRow(
            name=c.config.name,
            type=c.config.type,
            sources=list(c.config.srclayers),
            out_shape=_listify(c.out_shape),
            params=sum(p.numel() for p in c.module.parameters()),
            partition_dim=c.config.partition_dim
            if c.config.partition_dim is not None
            else default_dim,
        )
        for c in compiled
    ]
    return net, table


class _Unbuildable(Exception):
    """Sizes the layer cannot be built with (too many parameters, numbers past torch's)."""

    def __init__(self, message: str, hint: str) -> None:
        super().__init__(message)
        self.hint = hint


# What torch raises for sizes it cannot allocate or represent (past 64 bits, out of memory).
TORCH_SIZE_ERRORS = (RuntimeError, TypeError, OverflowError, ValueError, MemoryError)


def _build_layer(
    layer: LayerConfig, in_shapes: list[Shape], ctx: BuildContext, *, budget: int, seed: int
) -> tuple[Layer, Shape | list[Shape]]:
    """The layer's module and output shape, counted first on the meta device (no memory).
    It is built under a torch seed of its own (`seed`): a module that initialises itself (a
    plugin's) starts the same in every process of the job."""
    try:
        with torch.device("meta"):
            probe, _ = layer.build(in_shapes, ctx)
    except LayerShapeError:
        raise
    except TORCH_SIZE_ERRORS:
        probe = None  # built for real below, where the same sizes fail the same way
    if probe is not None:
        count = sum(p.numel() for p in probe.parameters())
        if count > budget:
            raise _Unbuildable(
                f"{count:,} parameters take the net past the limit of {MAX_PARAMS:,}",
                "use fewer units, filters or a smaller input",
            )
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return layer.build(in_shapes, ctx)
    except LayerShapeError:
        raise
    except TORCH_SIZE_ERRORS as exc:
        first = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        raise _Unbuildable(
            f"cannot be built with these sizes ({first})", "check its sizes and the input's"
        ) from None


def _shape_of(shape: Shape | list[Shape], ref: SourceRef) -> Shape:
    if isinstance(shape, list):
        return shape[ref.output or 0]
    return shape


def _parts(shape: Shape | list[Shape]) -> list[Shape]:
    return shape if isinstance(shape, list) else [shape]


def _listify(shape: Shape | list[Shape]) -> list[int] | list[list[int]]:
    if isinstance(shape, list):
        return [list(s) for s in shape]
    return list(shape)


def _param_key_issues(
    layer: LayerConfig, module: torch.nn.Module, path: tuple[Any, ...], source: SourceMap
) -> list[SpecIssue]:
    roles = sorted({module.param_role(local) for local, _ in module.named_parameters()})  # type: ignore[operator]
    issues = []
    for key in layer.param:
        if key not in roles:
            known = ", ".join(roles) if roles else "none: this layer has no parameters"
            issues.append(
                source.issue(
                    (*path, "param", key),
                    f"layer '{layer.name}' ({layer.type}) has no parameter '{key}'",
                    f"its parameters: {known}",
                )
            )
    return issues


@torch.no_grad()
def _initialise(net: NeuralNet, seed: int) -> None:
    """Initialise every parameter from its ParamSpec, in net order, from one seeded stream;
    a module that initialises itself (a plugin's) keeps its values unless `param:` names it."""
    kept = {
        f"{c.config.name}/{local}"
        for c in net.compiled
        if c.module.initialises_itself
        for local, _ in c.module.named_parameters()
        if c.module.param_role(local) not in c.config.param
    }
    generator = torch.Generator().manual_seed(seed)
    specs = net.param_specs()
    for name, param in net.named_params().items():
        if name not in kept:
            initialise(param, specs[name], generator)
