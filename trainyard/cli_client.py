"""Client commands of the `trainyard` CLI: talk to a server through the SDK.

submit, jobs, show, logs, metrics, cancel, delete and download (and `validate --server`);
trainyard/cli_sweeps.py adds `sweep list|show|best|cancel`, trainyard/cli_account.py `login`
and `tokens`. With `--json` a command prints exactly one JSON object or array on stdout (its
messages and warnings go to stderr).
"""

from __future__ import annotations

import json
import math
import re
import sys
from collections import deque
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from datetime import datetime
from itertools import islice
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from contract.settings import Settings
from trainyard.client import Client
from trainyard.console import (
    describe_memory,
    describe_pipeline,
    describe_topology,
    layer_table,
    pipeline_table,
    placement_table,
    print_issues,
)
from trainyard.errors import JobSpecRejected, TrainyardError, Unreachable
from trainyard.jobs import Job
from trainyard.models import JobEnvironmentOut, JobOut, LogLineOut
from trainyard.sweeps import Sweep, format_value

console = Console()
err_console = Console(stderr=True)

JobId = Annotated[int, typer.Argument(help="the job's id", show_default=False)]
AsJson = Annotated[bool, typer.Option("--json", help="print JSON instead of a table")]
# The server profile `trainyard --profile NAME` chose for this command (trainyard/cli.py sets
# it before each command runs); None: TRAINYARD_PROFILE, else the default server.
chosen_profile: str | None = None


def print_json(data: object) -> None:
    """The one JSON document a --json command prints on stdout."""
    sys.stdout.write(json.dumps(data) + "\n")


@contextmanager
def reporting(filename: str = "<job>") -> Iterator[None]:
    """Print SDK errors for humans and exit non-zero (2 when the server is unreachable)."""
    try:
        yield
    except JobSpecRejected as exc:
        print_issues(err_console, exc.errors, filename)
        err_console.print(f"[red]{len(exc.errors)} problem(s); the server rejected the job.[/]")
        raise typer.Exit(1) from None
    except TrainyardError as exc:
        # escape: a message may hold brackets (`pip install 'trainyard[mlflow]'`), not markup.
        err_console.print(f"[bold red]error[/] {escape(exc.message)}")
        raise typer.Exit(2 if isinstance(exc, Unreachable) else 1) from None


def settings() -> Settings:
    """The client's settings, with the profile of `--profile` when one was given."""
    return Settings(profile=chosen_profile) if chosen_profile else Settings()


def connect() -> Client:
    with reporting():
        return Client(settings=settings())


def _final_line(job: Job) -> str:
    tests = "  ".join(
        f"{key} {value:.4f}"
        for key, value in sorted(job.summary.items())
        if key.startswith("test/") and isinstance(value, int | float)
    )
    error = f"   error: {job.error}" if job.error else ""
    return f"job {job.id} [bold]{job.state}[/] at step {job.step}   {tests}{error}"


def submit(
    job_file: Annotated[Path, typer.Argument(help="the job's YAML file", show_default=False)],
    set_: Annotated[
        list[str] | None,
        typer.Option("--set", help="override a key: key.path=value (repeatable)"),
    ] = None,
    priority: Annotated[int, typer.Option(help="higher runs first")] = 0,
    follow: Annotated[bool, typer.Option(help="show progress until the job ends")] = False,
    quiet: Annotated[
        bool, typer.Option("--quiet", "-q", help="print only the id (for scripts)")
    ] = False,
    as_json: Annotated[
        bool, typer.Option("--json", help="print the submitted job (or sweep) as JSON")
    ] = False,
) -> None:
    """Submit a job to the server (a sweep, when the document has a search section)."""
    if follow and (quiet or as_json):
        err_console.print("[bold red]error[/] --follow shows progress: not with -q or --json")
        raise typer.Exit(2)
    text, overrides = _job_and_overrides(job_file, set_)
    client = connect()
    with reporting(str(job_file)):
        job = client.submit(text, overrides=overrides, priority=priority)
        for warning in job.warnings:
            err_console.print(f"[yellow]warning[/] {warning}")
        waiting = job.info.pending_reason if isinstance(job, Job) else None
        if waiting:
            colour = "red" if waiting.startswith("can never") else "yellow"
            err_console.print(f"[{colour}]warning[/] {waiting}")
        if quiet:
            sys.stdout.write(f"{job.id}\n")
            return
        if as_json:
            print_json(job.info.model_dump(mode="json"))
            return
        if isinstance(job, Sweep):
            follow_submitted_sweep(job, follow)
            return
        console.print(f"submitted job [bold]{job.id}[/] ({job.name}): {job.state}")
        if follow:
            job.wait(progress=True)
            console.print(_final_line(job))
            if job.state != "SUCCEEDED":
                raise typer.Exit(1)


def follow_submitted_sweep(sweep: Sweep, follow: bool) -> None:
    info = sweep.info
    console.print(
        f"submitted sweep [bold]{sweep.id}[/] ({sweep.name}): {sweep.state}, "
        f"{info.trial_count} trials, {info.max_parallel} at a time"
    )
    if not follow:
        return
    sweep.wait(progress=True)
    console.print(best_line(sweep))
    if sweep.state != "SUCCEEDED":
        raise typer.Exit(1)


def best_line(sweep: Sweep) -> str:
    """The sweep's result in one line: its best trial, or its Pareto front."""
    detail = sweep.detail()
    if detail.pareto_front:
        numbers = ", ".join(str(trial.number) for trial in detail.pareto_front)
        return f"sweep {sweep.id}: Pareto front of trials {numbers}"
    best = detail.best
    if best is None:
        return f"sweep {sweep.id} {sweep.state}: no trial completed" + (
            f" ({detail.error})" if detail.error else ""
        )
    params = "  ".join(f"{path}={format_value(value)}" for path, value in best.params.items())
    metric = f"{detail.objectives[0].metric} {format_value(best.value)}"
    if detail.best_test is not None:  # chosen on the validation split: its honest test figure
        metric += f" ({detail.best_test.metric} {format_value(detail.best_test.value)})"
    return f"best: trial {best.number} (job {best.job_id}) {metric}   {params}"


def _job_and_overrides(job_file: Path, set_: list[str] | None) -> tuple[str, dict[str, Any]]:
    """The job's text and its --set overrides, or a message and exit (2: unreadable file,
    1: a malformed override)."""
    from dsl.errors import JobSpecError
    from dsl.overrides import parse_overrides

    try:
        text = job_file.read_text()
    except OSError as exc:
        err_console.print(f"[bold red]error[/] cannot read {job_file}: {exc.strerror}")
        raise typer.Exit(2) from None
    try:
        return text, parse_overrides(set_ or [])
    except JobSpecError as exc:
        print_issues(err_console, exc.issues, "--set")
        raise typer.Exit(1) from None


def validate_on_server(job_file: Path, set_: list[str] | None, *, as_json: bool = False) -> None:
    """`trainyard validate --server`: POST /jobs/validate, printed like the local check plus
    the placement the scheduler would make on the cluster now."""
    text, overrides = _job_and_overrides(job_file, set_)
    client = connect()
    with reporting(str(job_file)):
        result = client.validate(text, overrides=overrides)
    if as_json:
        print_json(result)
        return
    layers = result["layers"]
    console.print(layer_table(layers, f"{result['name']}: {len(layers)} layers"))
    console.print(f"total parameters: [bold]{result['total_params']:,}[/]")
    console.print(describe_topology(result["topology"]))
    if result.get("memory"):
        console.print(describe_memory(result["memory"]))
    if result.get("pipeline"):
        console.print(pipeline_table(result["pipeline"]))
        console.print(describe_pipeline(result["pipeline"]))
    placement = result["placement"]
    if placement["assignments"]:
        console.print(placement_table(placement["assignments"], "placement now"))
    colour = "green" if placement["feasible"] else "yellow"
    console.print(f"placement: [{colour}]{placement['reason']}[/]")


def jobs(
    state: Annotated[
        list[str] | None,
        typer.Option(help="only jobs in this state (repeatable: any of them)"),
    ] = None,
    name: Annotated[str | None, typer.Option(help="only jobs with this name")] = None,
    limit: Annotated[int, typer.Option(help="show at most this many")] = 50,
    as_json: AsJson = False,
) -> None:
    """List jobs, newest first."""
    client = connect()
    with reporting():
        found = list(islice(client.jobs(state=state, name=name), limit))
    if as_json:
        print_json([j.info.model_dump(mode="json") for j in found])
        return
    table = Table(title=f"{len(found)} job(s)", title_justify="left")
    for column in ("id", "name", "state", "step", "best", "created", "duration"):
        table.add_column(column, justify="right" if column in ("id", "step") else "left")
    for job in found:
        info = job.info
        table.add_row(
            str(info.id),
            info.name,
            info.state,
            step_text(info),
            best_text(info),
            info.created_at.strftime("%Y-%m-%d %H:%M:%S") if info.created_at else "-",
            f"{info.duration_seconds:.1f}s" if info.duration_seconds is not None else "-",
        )
    console.print(table)


def step_text(info: JobOut) -> str:
    """How far the job is: a training run's `700/2000` steps, a prediction run's `35%` of its
    rows (it trains no steps)."""
    return f"{info.step}/{info.train_steps}" if info.train_steps else f"{info.progress:.0%}"


def best_text(info: JobOut) -> str:
    """The job's best value of its objective, and where: `val/accuracy 0.9710 @1400`."""
    if info.best_metric is None:
        return f"{info.objective} -"
    return f"{info.objective} {info.best_metric:.4f} @{info.best_step}"


def show(
    job_id: JobId,
    as_json: AsJson = False,
    show_packages: Annotated[
        bool,
        typer.Option("--packages", help="list the first worker's installed packages too"),
    ] = False,
) -> None:
    """Show one job: state, progress, times, final metrics, its environment and its state
    history."""
    client = connect()
    with reporting():
        job = client.job(job_id)
        events = job.events()
        environment = job.environment()
        packages = job.packages() if show_packages and environment.processes else []
    if as_json:
        data = job.info.model_dump(mode="json")
        data["events"] = [e.model_dump(mode="json") for e in events]
        data["environment"] = environment.model_dump(mode="json")
        if show_packages:
            data["packages"] = packages
        print_json(data)
        return
    info = job.info
    console.print(
        f"[bold]job {info.id}[/] {info.name}   owner {info.owner}   priority {info.priority}"
    )
    console.print(f"state [bold]{info.state}[/]   step {step_text(info)}")
    if info.queue_position is not None:
        console.print(f"queue position {info.queue_position}")
    if info.pending_reason and info.state == "QUEUED":
        console.print(f"[yellow]waiting[/] {info.pending_reason}")
    if info.restarts:
        console.print(f"restarts {info.restarts} (see the events below)")
    console.print(
        f"kind {info.kind}   framework {info.framework or '-'}   "
        f"topology {json.dumps(info.topology)}"
    )
    for label, at in (
        ("created", info.created_at),
        ("scheduled", info.scheduled_at),
        ("started", info.started_at),
        ("ended", info.ended_at),
    ):
        if at is not None:
            console.print(f"{label:>9} {at.isoformat(timespec='seconds')}")
    if info.error:
        console.print(f"[red]error[/] {info.error}")
    console.print(f"objective {info.objective} ({info.objective_mode})   best {best_text(info)}")
    for key, value in sorted(info.summary.items()):
        console.print(f"  {key} = {value}")
    print_environment(environment)
    for line in packages:
        console.print(f"  {line}", highlight=False)
    for event in events:
        console.print(f"  {event.at.isoformat(timespec='seconds')} {event.state} {event.reason}")


def print_environment(environment: JobEnvironmentOut) -> None:
    """The first worker's environment, and what the others differ in."""
    if not environment.processes:
        console.print("environment: not reported yet")
        return
    first = environment.processes[0]
    accelerators = ", ".join(
        f"{name} {version}"
        for name, version in (("CUDA", first.cuda), ("cuDNN", first.cudnn), ("NCCL", first.nccl))
        if version
    )
    commit = first.trainyard_commit[:12] or "no git checkout"
    lines = [
        f"python {first.python}   torch {first.torch}   {accelerators or 'no CUDA'}",
        f"devices {', '.join(first.devices)}",
        f"cpu {first.cpu_model} ({first.cpu_count})   host {first.hostname}",
        f"trainyard {first.trainyard_version} ({commit})",
        f"packages {first.packages_total} (sha256 {first.packages_hash[:16]}; --packages lists)",
    ]
    console.print(f"environment (worker {first.group}/{first.rank}):")
    for line in lines:
        console.print(f"  {line}", highlight=False)
    if len(environment.processes) > 1:
        differing = ", ".join(environment.differing) or "nothing"
        count = len(environment.processes)
        console.print(f"  {count} worker processes reported; they differ in: {differing}")


def logs(
    job_id: JobId,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="keep printing new lines (the live stream)")
    ] = False,
    tail: Annotated[
        int | None, typer.Option("--tail", min=0, help="only the last N lines so far")
    ] = None,
    grep: Annotated[
        str | None, typer.Option("--grep", help="only lines matching this regular expression")
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="print the lines as one JSON array")
    ] = False,
    timestamps: Annotated[
        bool,
        typer.Option(
            "--timestamps", "-t", help="begin each line with when it was written (local time)"
        ),
    ] = False,
) -> None:
    """Print a job's log lines; with --follow, new ones as the job prints them, until it ends."""
    if follow and as_json:
        err_console.print("[bold red]error[/] --json prints one array: not with --follow")
        raise typer.Exit(2)
    try:
        pattern = re.compile(grep) if grep is not None else None
    except re.error as exc:
        err_console.print(f"[bold red]error[/] --grep {grep!r}: {exc}")
        raise typer.Exit(2) from None
    client = connect()
    with reporting():
        job = client.job(job_id)
        lines: Iterable[LogLineOut]
        if follow:
            lines = job.follow_logs(tail=tail, grep=pattern)
        else:
            lines = (line for line in _stored_lines(job) if _matches(pattern, line))
            if tail is not None:
                lines = deque(lines, maxlen=tail)
        if as_json:
            print_json([line.model_dump(mode="json") for line in lines])
            return
        for line in lines:
            text = line.line
            if timestamps:
                at = datetime.fromtimestamp(line.at).isoformat(sep=" ", timespec="milliseconds")
                text = f"{at}  {text}"
            sys.stdout.write(text + "\n")
            sys.stdout.flush()


def _stored_lines(job: Job) -> Iterator[LogLineOut]:
    after: int | None = None
    while True:
        lines, after = job.log_lines(after)
        if not lines:
            return
        yield from lines


def _matches(pattern: re.Pattern[str] | None, line: LogLineOut) -> bool:
    return pattern is None or pattern.search(line.line) is not None


def metrics(
    job_id: JobId,
    name: Annotated[
        list[str] | None, typer.Option("--name", help="print this metric's points (repeatable)")
    ] = None,
    max_points: Annotated[int, typer.Option(help="downsample each series to this many")] = 50,
    as_json: Annotated[
        bool,
        typer.Option(
            "--json", help="print JSON: {metric: latest}, or {metric: [[step, value], ...]}"
        ),
    ] = False,
) -> None:
    """Without --name: each metric's latest value. With --name: the points of those metrics."""
    client = connect()
    with reporting():
        job = client.job(job_id)
        if not name:
            names = job.metric_names()
            latest = job.latest_metrics(tuple(names)) if names else {}
            if as_json:
                print_json({metric: latest.get(metric) for metric in names})
                return
            table = Table(title=f"job {job.id} metrics", title_justify="left")
            table.add_column("metric")
            table.add_column("latest", justify="right")
            for metric in names:
                value = latest.get(metric)
                table.add_row(metric, f"{value:.6g}" if value is not None else "-")
            console.print(table)
            return
        series = {metric: job.metrics(metric, max_points=max_points) for metric in name}
    if as_json:
        print_json(
            {metric: [[s, _finite(v)] for s, v in points] for metric, points in series.items()}
        )
        return
    for metric, points in series.items():
        table = Table(title=f"job {job.id} {metric}", title_justify="left")
        table.add_column("step", justify="right")
        table.add_column("value", justify="right")
        for step, value in points:
            table.add_row(str(step), f"{value:.6g}")
        console.print(table)


def _finite(value: float) -> float | None:
    """JSON has no NaN or infinity: null, as the API sends them."""
    return value if math.isfinite(value) else None


def cancel(job_id: JobId, as_json: AsJson = False) -> None:
    """Cancel a job (queued jobs at once; running ones within seconds)."""
    client = connect()
    with reporting():
        job = client.job(job_id).cancel()
    if as_json:
        print_json(job.info.model_dump(mode="json"))
        return
    console.print(f"job {job.id}: {job.state}" + (" (cancel requested)" if not job.done else ""))


def delete(
    job_id: JobId,
    cancel_first: Annotated[
        bool,
        typer.Option(
            "--cancel", help="a job that has not ended: cancel it, wait for it to end, then delete"
        ),
    ] = False,
    wait: Annotated[
        float, typer.Option(min=1, help="with --cancel: seconds to wait for the job to end")
    ] = 120.0,
    as_json: Annotated[bool, typer.Option("--json", help="print what was deleted as JSON")] = False,
) -> None:
    """Delete a job that has ended: its records (metrics, logs, events) and its files
    (checkpoints, run directory). A job still queued or running is refused unless --cancel."""
    client = connect()
    with reporting():
        job = client.job(job_id)
        if not job.done:
            if not cancel_first:
                err_console.print(
                    f"[bold red]error[/] job {job.id} is {job.state}: deleting removes the files "
                    "of an ended job only; cancel it first, or pass --cancel"
                )
                raise typer.Exit(1)
            if not job.info.cancel_requested:
                job.cancel()
            job.wait(timeout=wait, poll=0.5)
        checkpoints = job.checkpoints()
        job.delete()
    freed = sum(c.size for c in checkpoints)
    if as_json:
        print_json(
            {
                "id": job.id,
                "state": job.state,
                "checkpoints_freed": len(checkpoints),
                "bytes_freed": freed,
            }
        )
        return
    console.print(
        f"deleted job {job.id} ({job.name}, {job.state}): its metrics, logs and events, and "
        f"{len(checkpoints)} checkpoint(s), {freed / 1e6:.1f} MB"
    )


def download(
    job_id: JobId,
    step: Annotated[int | None, typer.Option(help="this checkpoint's step; default newest")] = None,
    best: Annotated[
        bool, typer.Option("--best", help="the objective's best checkpoint (keep_best)")
    ] = False,
    output: Annotated[Path, typer.Option(help="directory to save it in")] = Path("."),
    tensorboard: Annotated[
        Path | None,
        typer.Option(
            help="instead, the job's TensorBoard event files, extracted into this directory "
            "(then `tensorboard --logdir DIR`)"
        ),
    ] = None,
) -> None:
    """Download a checkpoint (safetensors): the newest, the one of --step, or the --best; or
    with --tensorboard DIR the job's TensorBoard event files."""
    if best and step is not None:
        err_console.print("[bold red]error[/] give --step or --best, not both")
        raise typer.Exit(2)
    if tensorboard is not None and (best or step is not None):
        err_console.print(
            "[bold red]error[/] --tensorboard downloads no checkpoint: leave out --step and --best"
        )
        raise typer.Exit(2)
    client = connect()
    with reporting():
        job = client.job(job_id)
        if tensorboard is not None:
            path = job.download_tensorboard(tensorboard)
        else:
            path = job.download_checkpoint(output, step=step, best=best)
    console.print(f"saved {path}")


def register(app: typer.Typer) -> None:
    for command in (submit, jobs, show, logs, metrics, cancel, delete, download):
        app.command()(command)
