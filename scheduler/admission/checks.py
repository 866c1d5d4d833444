"""Checking a submitted job: the whole compile pipeline up to built modules, without its data.

`check_job` validates the document with `dsl.compiler.compile_job`, adding the service's rules
(who may read server files, the step limit), resolves a named dataset to its stored file,
describes the data (an uploaded .npz or .csv from the inventory its intake stored with it,
nothing read; other files from their headers, a bounded chunk at a time:
scheduler/admission/job_data.py) and compiles the net from that description on torch's meta
device (shapes and parameter counts, no weights); then the checkpoint it starts from
(scheduler/admission/init_from.py) and whether its workers fit the cluster's memory
(scheduler/admission/cluster_fit.py). Its `execution_spec` is what workers run: the validated
job with every file given by an absolute path, its objective resolved and a pipeline's stages as
the planner cut them. Every failure is a located `JobSpecError`. `kind_of` tells a sweep from a
job before any of that, from the parsed document; a sweep is checked by
scheduler/admission/sweep_checks.py.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

import torch
from sqlalchemy.orm import Session

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
from dsl.objective import resolve_objective, selection_warnings
from dsl.planner import PipelinePlan, plan_pipeline
from dsl.plugins import plugin_needs
from dsl.schema import InitFrom, JobSpec
from dsl.source import ParsedDocument, SourceMap
from dsl.topology import Topology, resolve_topology
from scheduler.admission.cluster_fit import memory_issues
from scheduler.admission.init_from import starting_checkpoint
from scheduler.admission.job_data import (
    DataToRun,
    as_dataset_error,
    data_info,
    data_to_run,
    stored_inventory,
)
from scheduler.placement.cluster import node_capacities
from scheduler.store.jobs import NewJob
from scheduler.store.models import User
from workers.data import DataInfo

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
        raise JobSpecError(not_a_sweep(source))
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
                DataToRun(spec.data, stored_inventory(session, spec.data))
                if stored
                else data_to_run(session, owner, spec, base_dir, artifacts)
            )
            data = run.config
            resolved.append(data)
            described.append(data_info(data, spec.seed, cache_dir, run.inventory))
            return described[-1].build_context()
        except DataSourceError as exc:
            if isinstance(spec.data, DatasetData):
                raise as_dataset_error(exc) from None
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


def not_a_sweep(source: SourceMap) -> SpecIssue:
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
