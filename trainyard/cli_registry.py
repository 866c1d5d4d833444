"""`trainyard models register|list|show|tag|untag|delete`: the model registry of the server.

A reference names a version: `name@3`, `name@production` (the version a tag is on) or `name`
(the newest); `model:name@3` is the same where a command also takes jobs (`trainyard predict`,
`trainyard export`, `trainyard.load_model`).
"""

from __future__ import annotations

import json
import sys
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from trainyard.cli_client import AsJson, connect, reporting
from trainyard.models import ModelVersionOut

console = Console()
err_console = Console(stderr=True)

Ref = Annotated[
    str, typer.Argument(help="name@3, name@production or name (its newest)", show_default=False)
]
Name = Annotated[str, typer.Argument(help="the model's name", show_default=False)]
Version = Annotated[int, typer.Argument(help="the version", show_default=False)]

models_app = typer.Typer(
    help="The model registry: register a job's checkpoint as a version of a named model, list, "
    "show, tag and delete them.",
    no_args_is_help=True,
)


def _value(version: ModelVersionOut) -> str:
    value = version.objective_value
    return f"{version.objective} {value:.4g}" if value is not None else f"{version.objective} -"


@models_app.command()
def register(
    name: Name,
    job_id: Annotated[
        int | None, typer.Argument(help="one of your jobs", show_default=False)
    ] = None,
    sweep: Annotated[
        int | None, typer.Option(help="instead of a job: this sweep's best trial's job")
    ] = None,
    checkpoint: Annotated[
        str | None,
        typer.Option(help="best, latest or a step; default the best where kept, else latest"),
    ] = None,
) -> None:
    """Register a job's checkpoint (or a sweep's best trial's) as the next version of a model."""
    if (job_id is None) == (sweep is None):
        err_console.print("[bold red]error[/] give a job id or --sweep ID, one of the two")
        raise typer.Exit(2)
    client = connect()
    with reporting():
        if sweep is not None:
            best = client.sweep(sweep).best()
            if best is None:
                err_console.print(f"[bold red]error[/] sweep {sweep} has no best trial yet")
                raise typer.Exit(1)
            job_id = best.job_id
        assert job_id is not None
        version = client.register_model(name, job_id, checkpoint)
    console.print(
        f"registered [bold]{version.ref}[/]: job {version.job_id} step {version.step}, "
        f"{_value(version)}"
    )


@models_app.command("list")
def list_models(as_json: AsJson = False) -> None:
    """Your models: every version, by name."""
    client = connect()
    with reporting():
        found = client.models()
    if as_json:
        sys.stdout.write(json.dumps([v.model_dump(mode="json") for v in found]) + "\n")
        return
    table = Table(title=f"{len(found)} model version(s)", title_justify="left")
    for column in ("model", "tags", "job", "step", "objective", "created"):
        table.add_column(column)
    for version in found:
        table.add_row(
            version.ref,
            ", ".join(version.tags) or "-",
            f"{version.job_id} {version.job_name}" if version.job_id else version.job_name,
            str(version.step),
            _value(version),
            version.created_at.strftime("%Y-%m-%d %H:%M:%S"),
        )
    console.print(table)


@models_app.command()
def show(ref: Ref, as_json: AsJson = False) -> None:
    """One version: where it came from, its objective, its input and its figures."""
    client = connect()
    with reporting():
        version = client.model(ref)
    if as_json:
        sys.stdout.write(version.model_dump_json() + "\n")
        return
    tags = ", ".join(version.tags) or "none"
    console.print(f"[bold]{version.ref}[/]  tags: {tags}")
    console.print(f"from job {version.job_id} ({version.job_name}) at step {version.step}")
    console.print(f"objective: {_value(version)} ({version.objective_mode})")
    facts = version.input
    console.print(
        f"input: {facts.get('x_dtype')} samples of shape {facts.get('sample_shape')}, "
        f"{facts.get('num_classes')} classes"
    )
    figures = "  ".join(
        f"{key} {value:.4g}"
        for key, value in sorted(version.metrics.items())
        if isinstance(value, int | float) and "/" in key
    )
    console.print(f"figures: {figures or '-'}")


@models_app.command()
def tag(name: Name, version: Version, tag: Annotated[str, typer.Argument()]) -> None:
    """Put a tag (e.g. production) on a version, taking it off the one of that name that had it."""
    client = connect()
    with reporting():
        tagged = client.tag_model(name, version, tag)
    console.print(f"{tagged.ref}: tags {', '.join(tagged.tags)}")


@models_app.command()
def untag(name: Name, version: Version, tag: Annotated[str, typer.Argument()]) -> None:
    """Take a tag off a version."""
    client = connect()
    with reporting():
        client.untag_model(name, version, tag)
    console.print(f"{name}@{version}: {tag} taken off")


@models_app.command()
def delete(name: Name, version: Version) -> None:
    """Delete a version (its job and the job's checkpoints stay)."""
    client = connect()
    with reporting():
        client.delete_model(name, version)
    console.print(f"deleted {name}@{version}")


def register_commands(app: typer.Typer) -> None:
    app.add_typer(models_app, name="models")
