"""Local commands of the `trainyard` command: `validate` and `train` build the net on real data
in this process (dsl.compiler.compile_job on the data of workers.data.TrainingData);
`validate --server` asks a server instead, and `validate --profile` cuts a pipeline's stages by
costs measured here."""

from __future__ import annotations

import json
import shutil
import sys
from itertools import islice
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer
from rich.console import Console

from contract.rundir import CHECKPOINTS, METRICS, SUMMARY, TENSORBOARD, TRAIN_LOG
from dsl.errors import JobSpecError
from trainyard.console import (
    describe_memory,
    describe_pipeline,
    describe_topology,
    format_stats,
    layer_table,
    pipeline_table,
    print_issues,
    training_progress,
)

if TYPE_CHECKING:
    from dsl.compiler import CompiledJob
    from dsl.planner import PipelinePlan
    from workers.data import Dataset

console = Console()
err_console = Console(stderr=True)

# Batches `validate --profile` measures the layers on: the median of a few smooths the noise.
PROFILE_BATCHES = 3

JobFile = Annotated[Path, typer.Argument(help="the job's YAML file", show_default=False)]
SetOption = Annotated[
    list[str] | None,
    typer.Option("--set", help="override a key before validation: key.path=value (repeatable)"),
]


def _read_job(path: Path) -> str:
    try:
        return path.read_text()
    except OSError as exc:
        err_console.print(f"[bold red]error[/] cannot read {path}: {exc.strerror}")
        raise typer.Exit(2) from None


def _overrides(items: list[str] | None) -> dict[str, Any]:
    from dsl.overrides import parse_overrides

    return parse_overrides(items or [])


def _fail(exc: JobSpecError, filename: str) -> NoReturn:
    print_issues(err_console, exc.issues, filename)
    err_console.print(f"[red]{len(exc.issues)} problem(s); nothing was run.[/]")
    raise typer.Exit(1)


def _prepare(job: Path, set_: list[str] | None) -> tuple[CompiledJob, Dataset]:
    """Validate and build the job, or print its located errors and exit 1. A sweep's space is
    checked too: the base job compiled with the values each entry can produce."""
    from dsl.compiler import compile_job
    from dsl.search import base_document
    from dsl.search_checks import space_issues
    from workers.data import TrainingData

    data = TrainingData(cache_dir=_cache_dir(), base_dir=job.parent)
    text = _read_job(job)
    try:
        overrides = _overrides(set_)
        compiled = compile_job(text, data, overrides=overrides, filename=str(job))
        search = compiled.spec.search
        if search is not None:
            base = base_document(text, overrides, str(job))
            issues = space_issues(
                search, compiled.source, lambda values: compile_job(base, data, overrides=values)
            )
            if issues:
                raise JobSpecError(issues)
    except JobSpecError as exc:
        _fail(exc, str(job))
    return compiled, data.dataset


def _cache_dir() -> Path:
    from contract.settings import Settings

    return Settings().cache_dir()


def validate(
    job: JobFile,
    set_: SetOption = None,
    server: Annotated[
        bool,
        typer.Option(
            "--server",
            help="check on the server (TRAINYARD_URL or the local stack): also shows where "
            "the scheduler would place the job's processes now",
        ),
    ] = False,
    profile: Annotated[
        bool,
        typer.Option(
            "--profile",
            help="a pipelined job: measure each layer's forward and backward time and output "
            f"size on {PROFILE_BATCHES} batches of its data, and cut the stages by them",
        ),
    ] = False,
    as_json: Annotated[
        bool, typer.Option("--json", help="print the result as one JSON object instead")
    ] = False,
) -> None:
    """Check a job: its layer table (name, type, sources, output shape, parameters), totals and
    resolved topology, and a pipelined job's stages; with --server, its placement on the
    cluster too."""
    if server:
        from trainyard.cli_client import validate_on_server

        if profile:
            err_console.print("[bold red]error[/] --profile measures here, not on the server")
            raise typer.Exit(2)
        validate_on_server(job, set_, as_json=as_json)
        return
    import torch

    from dsl.memory import estimate_memory
    from dsl.topology import resolve_topology

    torch.set_num_threads(1)
    compiled, dataset = _prepare(job, set_)
    spec = compiled.spec
    if profile and spec.pipeline is None:
        err_console.print(
            "[bold red]error[/] --profile measures the costs of a pipeline's stages, and the "
            "job has no pipeline section"
        )
        raise typer.Exit(2)
    # Planned before anything is printed: a cap no cut fits is an error like the others.
    plan = _plan(compiled, dataset if profile else None, str(job)) if spec.pipeline else None
    rows = [row.__dict__ for row in compiled.table]
    topology = resolve_topology(spec.cluster, spec.pipeline)
    stages = plan.layer_lists() if plan is not None else None
    memory = estimate_memory(compiled, topology, dataset.nbytes, stages)
    memory_mb = {"total_mb": memory.total_mb, **{f"{k}_mb": v for k, v in memory.parts().items()}}
    if as_json:
        result = {
            "name": spec.name,
            "layers": rows,
            "total_params": compiled.total_params,
            "topology": topology.to_dict(),
            "memory": memory_mb,
            "pipeline": plan.to_dict() if plan is not None else None,
        }
        sys.stdout.write(json.dumps(result, default=str) + "\n")
        return
    console.print(layer_table(rows, f"{spec.name}: {len(rows)} layers"))
    console.print(
        f"total parameters: [bold]{compiled.total_params:,}[/]   "
        f"algorithm: {spec.train_one_batch.alg}   updater: {spec.updater.type}"
        f"   framework: {spec.cluster.framework}"
    )
    console.print(describe_topology(topology.to_dict()))
    console.print(describe_memory(memory_mb))
    if plan is not None:
        console.print(pipeline_table(plan.to_dict()))
        console.print(describe_pipeline(plan.to_dict()))
    search = spec.search
    if search is not None:
        console.print(
            f"sweep: {search.algorithm} over {', '.join(search.space)}: "
            f"{search.trial_count(spec.train_steps)} trial(s), {search.max_parallel} at a time, "
            f"pruner {search.pruner.type}"
        )


def _plan(compiled: CompiledJob, profile_on: Dataset | None, filename: str) -> PipelinePlan:
    """The job's pipeline stages, cut by costs measured on `profile_on`'s training batches
    (the first few a training run would take) or by estimated ones."""
    from dsl.costs import profile_costs
    from dsl.planner import plan_pipeline

    costs = None
    if profile_on is not None:
        spec = compiled.spec
        batches = profile_on.train_batches(
            spec.data.batch_size,
            seed=spec.seed,
            shuffle=spec.data.shuffle,
        )
        costs = profile_costs(compiled, islice(batches, PROFILE_BATCHES))
    try:
        return plan_pipeline(compiled, costs)
    except JobSpecError as exc:
        _fail(exc, filename)


def train(
    job: JobFile,
    set_: SetOption = None,
    device: Annotated[str, typer.Option(help="cpu or cuda")] = "cpu",
    run_dir: Annotated[
        Path | None, typer.Option(help="where metrics, checkpoints and summary go")
    ] = None,
    resume: Annotated[bool, typer.Option(help="continue from the latest checkpoint")] = False,
    as_json: Annotated[
        bool, typer.Option("--json", help="print the summary as one JSON line")
    ] = False,
    threads: Annotated[int, typer.Option(help="torch intra-op threads")] = 1,
) -> None:
    """Train a job locally in this process."""
    import torch

    from contract.stream import MetricRecord
    from dsl.flatten import job_parameters
    from dsl.frameworks import FRAMEWORK_SPECS
    from workers.checkpoint import CheckpointError
    from workers.metrics import Emitted, JsonlSink, TensorBoardSink
    from workers.precision import PrecisionError
    from workers.trainer import Trainer, TrainOptions

    torch.set_num_threads(threads)
    if device.startswith("cuda") and not torch.cuda.is_available():
        err_console.print("[bold red]error[/] --device cuda: torch sees no CUDA device here")
        raise typer.Exit(2)
    compiled, dataset = _prepare(job, set_)
    spec = compiled.spec
    if spec.search is not None:
        err_console.print(
            "[bold red]error[/] the job has a search section: a sweep runs its trials on the "
            "service; submit it with `trainyard submit`"
        )
        raise typer.Exit(2)
    if not FRAMEWORK_SPECS.get(spec.cluster.framework).in_one_process or spec.pipeline is not None:
        what = (
            f"cluster.framework '{spec.cluster.framework}'"
            if spec.pipeline is None
            else f"a pipeline of {spec.pipeline.count} stages"
        )
        err_console.print(
            f"[bold red]error[/] {what} needs the service: submit it with `trainyard submit` "
            "(`trainyard train` runs one process)"
        )
        raise typer.Exit(2)
    _download_init_from(compiled)
    out_dir = run_dir or Path("runs") / spec.name
    if not resume and out_dir.exists():
        for stale in (METRICS, TRAIN_LOG, SUMMARY, CHECKPOINTS, TENSORBOARD):
            target = out_dir / stale
            if target.is_dir():
                shutil.rmtree(target)
            else:
                target.unlink(missing_ok=True)
    show = err_console if as_json else console
    sink = JsonlSink(out_dir)
    tensorboard = TensorBoardSink(out_dir, job_parameters(spec))
    with training_progress(show) as progress:
        task = progress.add_task(spec.name, total=spec.train_steps, stats="")

        latest: dict[str, float] = {}

        class ProgressSink:
            def emit(self, record: Emitted) -> None:
                if isinstance(record, MetricRecord):
                    latest.update(record.values)
                progress.update(task, stats=format_stats(latest))

            def log(self, line: str) -> None:
                progress.console.print(line)

            def checkpoint(self, step: int, path: Path, *, best: bool = False) -> None:
                return None

            def close(self) -> None:
                return None

        try:
            trainer = Trainer(
                compiled,
                dataset,
                TrainOptions(run_dir=out_dir, device=device, resume=resume, base_dir=job.parent),
                sinks=[sink, tensorboard, ProgressSink()],
            )
        except PrecisionError as exc:
            sink.close()
            tensorboard.close()
            err_console.print(f"[bold red]error[/] {exc}")
            raise typer.Exit(2) from None
        progress.update(task, completed=trainer.step)
        try:
            summary = trainer.run(on_step=lambda step: progress.update(task, completed=step))
        except CheckpointError as exc:
            sink.close()
            tensorboard.close()
            err_console.print(f"[bold red]error[/] {exc}")
            raise typer.Exit(2) from None
    sink.close()
    tensorboard.close()
    if as_json:
        sys.stdout.write(json.dumps({"run_dir": str(out_dir), **summary.to_json()}) + "\n")
    else:
        final = summary.metrics
        line = "  ".join(
            f"{key} {value:.4f}" for key, value in sorted(final.items()) if key.startswith("test/")
        )
        console.print(
            f"[bold]{summary.status}[/] after {summary.steps} steps in {summary.wall_time:.1f}s"
            f"   {line}   run dir: {out_dir}"
        )
    if summary.status != "succeeded":
        raise typer.Exit(1)


def _download_init_from(compiled: CompiledJob) -> None:
    """`init_from: {job: ID}` or `{model: name@3}` names a job or a registered model of the
    server's: its checkpoint, downloaded once, is the file this run starts from."""
    from dsl.schema import InitFrom
    from trainyard.errors import TrainyardError
    from trainyard.loading import checkpoint_file

    init = compiled.spec.checkpoint.init_from
    if not isinstance(init, InitFrom):
        return
    target = f"model:{init.model}" if init.model is not None else init.job
    assert target is not None  # one of the two, as the schema checks
    try:
        path = checkpoint_file(target, init.checkpoint)
    except TrainyardError as exc:
        err_console.print(f"[bold red]error[/] checkpoint.init_from: {exc.message}")
        raise typer.Exit(2) from None
    compiled.spec.checkpoint.init_from = str(path)


def register(app: typer.Typer) -> None:
    app.command()(validate)
    app.command()(train)
