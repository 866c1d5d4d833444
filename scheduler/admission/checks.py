"""Checking a submitted job: the whole compile pipeline up to built modules, without its data.

`check_job` validates the document with `dsl.compiler.compile_job`, adding the service's rules
(who may read server files, the step limit), resolves a named dataset to its stored file,
describes the data (an uploaded .npz or .csv from the inventory its intake stored with it,
nothing read; other files from their headers, a bounded chunk at a time) and compiles the net
from that description on torch's meta device (shapes and parameter counts, no weights). Its
`execution_spec` is what workers run: the validated job with every file given by an absolute
path, its objective resolved and a pipeline's stages as the planner cut them.
Every failure is a located `JobSpecError`. `kind_of` tells a sweep from a job before any of
that, from the parsed document.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from sqlalchemy.orm import Session

from contract.inventory import INVENTORY
from dsl.budget import CompileBudget
from dsl.compiler import CompiledJob, compile_job
from dsl.data_config import (
    CsvData,
    DatasetData,
    DataSourceConfig,
    NpzData,
    ShardsData,
    TextData,
)
from dsl.errors import DataSourceError, JobSpecError, SpecIssue
from dsl.layers.base import BuildContext
from dsl.memory import MemoryEstimate, estimate_memory
from dsl.objective import resolve_objective, resolve_search, selection_warnings
from dsl.planner import PipelinePlan, plan_pipeline
from dsl.plugins import plugin_needs
from dsl.schema import InitFrom, JobSpec
from dsl.search import SearchConfig, base_document
from dsl.search_checks import space_issues
from dsl.source import ParsedDocument, SourceMap
from dsl.topology import Topology, resolve_topology
from scheduler.placement.cluster import largest_memory_share, node_capacities
from scheduler.placement.plan import NodeCapacity
from scheduler.store.artifacts import UnsafePath
from scheduler.store.datasets import (
    dataset_file,
    dataset_names,
    get_dataset,
    inventory_of_file,
)
from scheduler.store.errors import NotFound, StoreError
from scheduler.store.jobs import NewJob, own_job
from scheduler.store.models import DatasetRecord, User
from scheduler.store.registry import get_model, model_file, parse_ref
from scheduler.store.reports import model_checkpoint
from scheduler.store.sweeps import NewSweep
from scheduler.sweeps.warm_start import warm_start_issues
from workers.data import DataInfo, describe, describe_from_inventory
from workers.data.uploaded import as_file_source

# Steps are stored in 32-bit columns.
MAX_STEPS = 2**31 - 1
UPLOAD_HINT = (
    "only admins may read files on the server; upload the data (POST /api/v1/datasets) and "
    "write data: {source: dataset, name: <its name>}"
)


class Kind(StrEnum):
    """What a document is: a job, or a sweep (a job with a `search` section)."""

    JOB = "job"
    SWEEP = "sweep"


def kind_of(
    document: ParsedDocument,
    overrides: Mapping[str, Any] | None = None,
    *,
    expect: Kind | None = None,
) -> Kind:
    """Whether `document` (with `overrides` applied) is a job or a sweep, read from its
    `search` key before anything is compiled. A document of another kind than `expect` is
    refused with an error located in it."""
    overrides = overrides or {}
    if "search" in overrides:
        search = overrides["search"]
    elif any(path.startswith("search.") for path in overrides):
        search = {}  # an override of a value under search makes the section
    else:
        search = document.raw.get("search")
    source = document.source
    kind = Kind.JOB if search is None else Kind.SWEEP
    if expect == Kind.JOB and kind == Kind.SWEEP:
        raise JobSpecError(
            source.issue(
                ("search",),
                "a document with a search section is a sweep, and this route takes jobs",
                "submit it to POST /api/v1/sweeps (`trainyard submit` does), or remove search",
            )
        )
    if expect == Kind.SWEEP and kind == Kind.JOB:
        raise JobSpecError(_not_a_sweep(source))
    return kind


@dataclass(frozen=True)
class CheckedJob:
    compiled: CompiledJob
    topology: Topology
    execution_spec: dict[str, Any]
    plan: PipelinePlan | None  # the stages of a job with a pipeline section
    memory: MemoryEstimate  # one worker's peak

    @property
    def spec(self) -> JobSpec:
        return self.compiled.spec

    @property
    def warnings(self) -> list[str]:
        """What the submitter is told though the job is valid (selecting on the test split)."""
        return selection_warnings(self.spec)

    def to_new_job(
        self,
        *,
        spec_yaml: str,
        overrides: Mapping[str, Any],
        effective_yaml: str,
        priority: int = 0,
    ) -> NewJob:
        objective = resolve_objective(self.spec)
        return NewJob(
            name=self.spec.name,
            spec_yaml=spec_yaml,
            overrides=dict(overrides),
            effective_yaml=effective_yaml,
            spec=self.execution_spec,
            topology=self.topology.to_dict(),
            plugins=plugin_needs(
                [layer.type for layer in self.spec.neuralnet.expanded().layers],
                self.spec.updater.type,
            )
            or None,
            framework=self.spec.cluster.framework,
            train_steps=self.spec.train_steps,
            objective=objective.metric,
            objective_mode=objective.mode,
            priority=priority,
            graph=self.compiled.graph(),
        )


def check_job(
    job: str | Mapping[str, Any] | ParsedDocument | JobSpec,
    *,
    session: Session,
    owner: User,
    cache_dir: Path,
    base_dir: Path,
    artifacts: Path,
    overrides: Mapping[str, Any] | None = None,
    budget: CompileBudget | None = None,
) -> CheckedJob:
    """Validate and compile `job` as `owner` would run it: the service's one way in.

    A document (text, mapping or parsed) gets the service's rules; a `JobSpec` is a stored execution
    spec, checked when it was submitted, and is compiled as it is (its files are absolute).
    Relative file paths (admins only) resolve against `base_dir`; a named dataset's file
    must lie in its owner's folder under `artifacts`; `init_from: {job: ID}` is one of the
    owner's jobs' checkpoints there, checked against the net.
    """
    resolved: list[DataSourceConfig] = []
    described: list[DataInfo] = []

    def describe_data(spec: JobSpec) -> BuildContext:
        stored = isinstance(job, JobSpec)
        try:
            run = (
                DataToRun(spec.data, _stored_inventory(session, spec.data))
                if stored
                else _data_to_run(session, owner, spec, base_dir, artifacts)
            )
            data = run.config
            resolved.append(data)
            described.append(_describe(data, spec.seed, cache_dir, run.inventory))
            return described[-1].build_context()
        except DataSourceError as exc:
            if isinstance(spec.data, DatasetData):
                raise _as_dataset_error(exc) from None
            if isinstance(spec.data, TextData) and spec.data.dataset is not None:
                field = "dataset" if exc.field in (None, "path") else exc.field
                raise DataSourceError(exc.message, exc.hint, field=field) from None
            raise

    # Shapes and parameter counts without memory: on torch's meta device a net of a billion
    # parameters compiles in a millisecond and allocates nothing, so no document can exhaust
    # the API. (The mode is thread-local; concurrent requests do not see it.)
    with torch.device("meta"):
        compiled = compile_job(
            job,
            describe_data,
            overrides=overrides,
            rules=functools.partial(_service_rules, owner),
            budget=budget,
        )
    spec = compiled.spec
    init_from = None
    if isinstance(spec.checkpoint.init_from, InitFrom):
        init_from = starting_checkpoint(session, owner, compiled, artifacts)
    plan = plan_pipeline(compiled) if spec.pipeline is not None else None
    topology = resolve_topology(spec.cluster, spec.pipeline)
    stages = plan.worker_layers() if plan is not None else None
    memory = estimate_memory(compiled, topology, described[0].nbytes, stages)
    if not isinstance(job, JobSpec):
        issues = memory_issues(memory, topology, node_capacities(session), compiled.source)
        if issues:
            raise JobSpecError(issues)
    return CheckedJob(
        compiled,
        topology,
        _execution_spec(spec, resolved[0], base_dir, plan, init_from),
        plan,
        memory,
    )


def starting_checkpoint(
    session: Session, owner: User, compiled: CompiledJob, artifacts: Path
) -> Path:
    """The checkpoint file `init_from: {job: ID}` or `{model: name@3}` names, the owner's own
    (another user's job or model is as absent), whose parameters of the net's names have the
    net's shapes (and at least one does); else a JobSpecError located at checkpoint.init_from."""
    init = compiled.spec.checkpoint.init_from
    assert isinstance(init, InitFrom)
    source, where = compiled.source, ("checkpoint", "init_from")
    try:
        if init.model is not None:
            what = f"model {init.model}"
            name, which = parse_ref(init.model)
            path = model_file(get_model(session, owner, name, which))
        else:
            assert init.job is not None  # one of the two, as the schema checks
            job = own_job(session, owner.id, init.job)
            if job is None:
                raise JobSpecError(
                    source.issue(
                        (*where, "job"),
                        f"you have no job {init.job}",
                        "trainyard jobs lists yours",
                    )
                )
            choice = init.checkpoint
            step, path = model_checkpoint(
                session,
                job.id,
                int(choice) if choice and choice.isdigit() else choice,
                artifacts=artifacts,
            )
            what = f"job {job.id}'s checkpoint at step {step}"
        with safe_open(str(path), framework="numpy") as handle:
            saved = {
                key.removeprefix("param/"): list(handle.get_slice(key).get_shape())
                for key in handle.keys()  # noqa: SIM118  (a safetensors handle, not a dict)
                if key.startswith("param/")
            }
    except NotFound as exc:
        if init.model is None:
            raise JobSpecError(source.issue(where, str(exc))) from None
        hint = "trainyard models list shows yours"
        raise JobSpecError(source.issue((*where, "model"), str(exc), hint)) from None
    except (StoreError, UnsafePath) as exc:
        raise JobSpecError(source.issue(where, str(exc))) from None
    except (OSError, SafetensorError) as exc:
        raise JobSpecError(source.issue(where, f"{what} cannot be read: {exc}")) from None
    net = {name: list(p.shape) for name, p in compiled.net.named_params().items()}
    wrong = [
        f"{name} (the checkpoint's {saved[name]}, this net's {shape})"
        for name, shape in net.items()
        if name in saved and saved[name] != shape
    ]
    if wrong:
        raise JobSpecError(
            source.issue(
                where,
                f"{len(wrong)} parameter(s) of {what} have other shapes than this net's: "
                f"{', '.join(wrong)}",
                "rename the layers that differ, so that they start from their initialisers",
            )
        )
    if not saved.keys() & net.keys():
        raise JobSpecError(
            source.issue(
                where,
                f"no parameter of {what} has a name of this net's "
                f"(it has {', '.join(sorted(saved)[:8])})",
                "layers are matched by name: <layer>/<param>",
            )
        )
    return path


def memory_issues(
    memory: MemoryEstimate, topology: Topology, nodes: list[NodeCapacity], source: SourceMap
) -> list[SpecIssue]:
    """A worker that would pass its memory limit, or need more than any node could give it:
    refused now rather than killed (or queued forever) later."""
    need = memory.total_mb
    slots = topology.slots_per_worker
    largest = largest_memory_share(nodes, slots)
    where = ("cluster", "resources", "memory_mb")
    if topology.memory_mb and largest is not None and topology.memory_mb > largest[1]:
        node, most = largest
        return [
            source.issue(
                where,
                f"memory_mb {topology.memory_mb} is more than a worker of {slots} slot(s) can "
                f"get on any node (at most {most} MB, on {node})",
                f"ask for at most {most}, or more slots_per_worker (each brings a slot's share "
                "of its node's memory)",
            )
        ]
    if topology.memory_mb and need > topology.memory_mb:
        return [
            source.issue(
                where,
                f"each worker needs about {memory.describe()}, more than its memory_mb "
                f"{topology.memory_mb}",
                f"raise memory_mb to at least {need}, or use a smaller batch_size or net",
            )
        ]
    if not topology.memory_mb and largest is not None and need > largest[1]:
        node, most = largest
        return [
            source.issue(
                ("cluster", "resources"),
                f"each worker needs about {memory.describe()}, more than a worker of {slots} "
                f"slot(s) gets on any node (at most {most} MB, on {node})",
                "ask for more slots_per_worker (each brings a slot's share of its node's "
                "memory), or use a smaller batch_size, net or dataset",
            )
        ]
    return []


@dataclass(frozen=True)
class CheckedSweep:
    """A sweep document checked: its base job compiled, every value of its space too."""

    checked: CheckedJob  # the whole document: the base job's net, the search validated
    search: SearchConfig
    base_job: dict[str, Any]  # the document without `search`, the overrides applied

    def to_new_sweep(
        self,
        *,
        spec_yaml: str,
        overrides: Mapping[str, Any],
        base_dir: Path,
        priority: int = 0,
    ) -> NewSweep:
        return NewSweep(
            name=self.checked.spec.name,
            spec_yaml=spec_yaml,
            overrides=dict(overrides),
            base_job=self.base_job,
            search=self.search.model_dump(mode="json", exclude_unset=True),
            base_dir=str(base_dir),
            priority=priority,
        )


def check_sweep(
    document: str | Mapping[str, Any] | ParsedDocument,
    *,
    session: Session,
    owner: User,
    cache_dir: Path,
    base_dir: Path,
    artifacts: Path,
    overrides: Mapping[str, Any] | None = None,
    budget: CompileBudget | None = None,
) -> CheckedSweep:
    """`check_job` for a document with a `search:` section, then the base job compiled with the
    values each space entry can produce (dsl.search_checks.space_issues): a value that gives
    an invalid job is a located error at its entry. A document without one is refused. The
    probes count against the document's `budget`."""
    checked = check_job(
        document,
        session=session,
        owner=owner,
        cache_dir=cache_dir,
        base_dir=base_dir,
        artifacts=artifacts,
        overrides=overrides,
        budget=budget,
    )
    # Its metric and mode filled in (the base job's objective by default), as the sweep stores it.
    search = resolve_search(checked.spec)
    if search is None:
        raise JobSpecError(_not_a_sweep(checked.compiled.source))
    base = base_document(document, overrides)

    def compile_trial(values: Mapping[str, Any]) -> object:
        return check_job(
            base,
            session=session,
            owner=owner,
            cache_dir=cache_dir,
            base_dir=base_dir,
            artifacts=artifacts,
            overrides=values,
            budget=budget,
        )

    issues = space_issues(search, checked.compiled.source, compile_trial)
    issues += warm_start_issues(session, owner, search, checked.compiled.source)
    if issues:
        raise JobSpecError(issues)
    return CheckedSweep(checked, search, base)


def _not_a_sweep(source: SourceMap) -> SpecIssue:
    return source.issue(
        (),
        "the document has no search section, so it is a job, not a sweep",
        "submit it as a job (POST /jobs), or add search: to sweep it",
    )


def _service_rules(owner: User, spec: JobSpec, source: SourceMap) -> list[SpecIssue]:
    issues = [] if owner.is_admin else _server_file_issues(spec, source)
    if spec.train_steps > MAX_STEPS:
        issues.append(
            source.issue(
                ("train_steps",),
                f"train_steps {spec.train_steps} is more than the service's limit of {MAX_STEPS}",
            )
        )
    return issues


def _server_file_issues(spec: JobSpec, source: SourceMap) -> list[SpecIssue]:
    issues = []
    data = spec.data
    if (
        isinstance(data, NpzData | CsvData)
        or (isinstance(data, TextData) and data.path)
        or (isinstance(data, DatasetData) and data.path)
    ):
        issues.append(
            source.issue(
                ("data", "path"), f"data source '{data.source}' reads a server file", UPLOAD_HINT
            )
        )
    if isinstance(data, ShardsData):
        issues.extend(
            source.issue(
                ("data", key),
                f"{key} reads a folder on the server, which only admins may do",
                "upload the shards (a .tar of them) and write data: {source: shards, "
                "dataset: <its name>}",
            )
            for key in ("path", "test_path")
            if getattr(data, key) is not None
        )
    if isinstance(data, CsvData | TextData) and data.val_path:
        issues.append(
            source.issue(
                ("data", "val_path"),
                "val_path reads a file on the server, which only admins may do",
                "use validation_fraction, or upload the data with its validation arrays "
                "(x_val_key, y_val_key of an .npz dataset)",
            )
        )
    if isinstance(spec.checkpoint.init_from, str):
        issues.append(
            source.issue(
                ("checkpoint", "init_from"),
                "init_from reads a file on the server, which only admins may do",
                "start from one of your jobs: init_from: {job: ID, checkpoint: best}",
            )
        )
    return issues


@dataclass(frozen=True)
class DataToRun:
    """The data config workers get, and the stored inventory of the file it names (an
    uploaded .npz's or .csv's), which describes it without reading it."""

    config: DataSourceConfig
    inventory: dict[str, Any] | None = None


def _data_to_run(
    session: Session, owner: User, spec: JobSpec, base_dir: Path, artifacts: Path
) -> DataToRun:
    """The data config workers get: a named dataset becomes its stored file (which must lie
    in its owner's folder), and relative paths become absolute (workers run elsewhere)."""
    data = spec.data
    if isinstance(data, DatasetData):
        record = _own_dataset(session, owner, data.name, "name")
        stored = dataset_file(record, artifacts)
        if record.kind == "text":
            raise DataSourceError(
                f"dataset '{data.name}' is a text, which the text source reads",
                f"data: {{source: text, dataset: {data.name}}}",
                field="name",
            )
        if record.kind == "shards":
            return DataToRun(data.model_copy(update={"path": str(stored)}))
        file = as_file_source(data, "npz" if record.kind == "npz" else "csv", stored)
        return DataToRun(file, record.inventory)
    if isinstance(data, TextData) and data.dataset is not None:
        record = _own_dataset(session, owner, data.dataset, "dataset")
        if record.kind != "text":
            raise DataSourceError(
                f"dataset '{data.dataset}' is a {record.kind} dataset, not a text",
                f"data: {{source: dataset, name: {data.dataset}}} reads it",
                field="dataset",
            )
        return DataToRun(
            data.model_copy(update={"path": str(dataset_file(record, artifacts)), "dataset": None})
        )
    if isinstance(data, ShardsData) and data.dataset is not None:
        # The stored folder by path, with only the keys that were written.
        values = data.model_dump(mode="json", exclude_unset=True, exclude={"dataset"})
        values["path"] = str(_shards_folder(session, owner, data, artifacts))
        return DataToRun(ShardsData.model_validate(values))
    if isinstance(data, NpzData | CsvData | TextData | ShardsData):
        files = {
            key: str((base_dir / path).expanduser().resolve())
            for key in ("path", "val_path", "test_path")
            if (path := getattr(data, key, None))
        }
        return DataToRun(data.model_copy(update=files) if files else data)
    return DataToRun(data)


def _stored_inventory(session: Session, data: DataSourceConfig) -> dict[str, Any] | None:
    """The inventory of the uploaded file a stored execution spec reads, if it reads one."""
    if not isinstance(data, NpzData | CsvData) or (isinstance(data, CsvData) and data.val_path):
        return None
    return inventory_of_file(session, data.path)


def _own_dataset(session: Session, owner: User, name: str, field: str) -> DatasetRecord:
    record = get_dataset(session, owner.id, name)
    if record is None:
        yours = dataset_names(session, owner.id)
        raise DataSourceError(
            f"you have no dataset named '{name}'",
            f"your datasets: {', '.join(yours)}"
            if yours
            else "upload it first: trainyard datasets upload FILE --name NAME",
            field=field,
        )
    return record


def _shards_folder(session: Session, owner: User, data: ShardsData, artifacts: Path) -> Path:
    """The folder of shards of the owner's dataset `data.dataset` (inside their folder)."""
    assert data.dataset is not None
    record = _own_dataset(session, owner, data.dataset, "dataset")
    folder = dataset_file(record, artifacts)
    if not folder.is_dir():
        raise DataSourceError(
            f"dataset '{data.dataset}' is a .{record.kind} file, not a folder of shards",
            hint=f"read it with data: {{source: dataset, name: {data.dataset}}}",
            field="dataset",
        )
    return folder


def _as_dataset_error(exc: DataSourceError) -> DataSourceError:
    """The stored file's own keys (its path) are not the user's to fix: point at the name."""
    field = exc.field or "source"
    if field not in DatasetData.model_fields:
        field = "name"
    return DataSourceError(exc.message, exc.hint, field=field)


def _execution_spec(
    spec: JobSpec,
    data: DataSourceConfig,
    base_dir: Path,
    plan: PipelinePlan | None,
    init_from: Path | None = None,
) -> dict[str, Any]:
    # exclude_unset: validators that look at which keys were written (synthetic's task keys,
    # npz's optional test keys) must see the same document when a worker loads it again.
    out = spec.model_dump(mode="json", exclude_unset=True)
    out["data"] = data.model_dump(mode="json", exclude_unset=True)
    # Resolved once, here: the service reads a job's objective from its stored spec.
    out["objective"] = resolve_objective(spec).model_dump(mode="json")
    if init_from is not None:  # a job's checkpoint, found when the job was checked
        out["checkpoint"]["init_from"] = str(init_from)
    elif isinstance(spec.checkpoint.init_from, str):
        path = base_dir / spec.checkpoint.init_from
        out["checkpoint"]["init_from"] = str(path.expanduser().resolve())
    if plan is not None:
        # The planned cut, written out: every stage's worker runs the same one, whatever the
        # costs it would estimate or measure where it runs.
        out["pipeline"]["stages"] = plan.layer_lists()
    return out


def _describe(
    data: DataSourceConfig, seed: int, cache_dir: Path, inventory: dict[str, Any] | None = None
) -> DataInfo:
    """The data's DataInfo: an uploaded file's from its stored inventory (nothing is read),
    anything else described (a file inventoried a bounded chunk at a time), remembered."""
    if inventory is not None:
        assert isinstance(data, NpzData | CsvData)  # the kinds an inventory is stored for
        return describe_from_inventory(data, INVENTORY.validate_python(inventory))
    stamps: list[tuple[int, int] | None] = []
    for key in ("path", "val_path", "test_path"):
        path = getattr(data, key, None)
        if path:
            try:
                stat = Path(path).stat()
                stamps.append((stat.st_mtime_ns, stat.st_size))
            except OSError:
                stamps.append(None)  # describe reports the missing file
    stamp = tuple(stamps) or None
    return _describe_cached(
        data.model_dump_json(exclude_unset=True), type(data), seed, str(cache_dir), stamp
    )


@functools.lru_cache(maxsize=256)
def _describe_cached(
    config_json: str,
    config_type: type[DataSourceConfig],
    seed: int,
    cache_dir: str,
    stamp: tuple[tuple[int, int] | None, ...] | None,
) -> DataInfo:
    """Describing the built-in text corpus or a file reads it; a warm API answers from memory.
    The files' mtimes and sizes are in the key, so a changed file is read again."""
    config = config_type.model_validate_json(config_json)
    return describe(config, seed=seed, cache_dir=Path(cache_dir), base_dir=Path(cache_dir))
