"""The client's side of the `trainyard` command: the commands that talk to a server over HTTP
(trainyard/cli_client.py, and trainyard/cli_sweeps.py for sweeps) and `schema`.

The installed command (scheduler/cli/main.py) adds the server commands and the local training ones
to these. This module imports nothing of the server side, of workers or of torch, so that
`trainyard jobs` starts fast (tests/test_structure.py holds it to that).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer
from pydantic import ValidationError
from rich.console import Console

from trainyard import (
    cli_account,
    cli_client,
    cli_datasets,
    cli_models,
    cli_registry,
    cli_sweeps,
    cli_tracking,
    cli_webhooks,
)

err_console = Console(stderr=True)


def schema(
    output: Annotated[Path | None, typer.Option(help="write to this file")] = None,
) -> None:
    """Print the JSON Schema of the job language (for editors)."""
    from dsl.schema import json_schema_text

    text = json_schema_text()
    if output:
        output.write_text(text)
    else:
        sys.stdout.write(text)


def _print_version(asked: bool) -> None:
    if asked:
        from trainyard import __version__

        typer.echo(f"trainyard {__version__}")
        raise typer.Exit()


def _options(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_print_version, is_eager=True, help="print the version and exit"
        ),
    ] = False,
    profile: Annotated[
        str | None,
        typer.Option(
            "--profile",
            envvar="TRAINYARD_PROFILE",
            help="the server saved by `trainyard login --profile NAME`",
        ),
    ] = None,
) -> None:
    """Trainyard: describe a deep-learning job in YAML, train it locally or on the service."""
    cli_client.chosen_profile = profile


def new_app() -> typer.Typer:
    """A `trainyard` command with no subcommands yet; `--version` prints the version."""
    app = typer.Typer(no_args_is_help=True, pretty_exceptions_enable=False)
    app.callback()(_options)
    return app


def register(app: typer.Typer) -> None:
    """Add the client commands to `app`."""
    app.command()(schema)
    cli_client.register(app)
    cli_account.register(app)
    cli_sweeps.register(app)
    cli_models.register(app)
    cli_registry.register_commands(app)
    cli_webhooks.register_commands(app)
    cli_tracking.register(app)
    cli_datasets.register_commands(app)


def run(app: typer.Typer) -> None:
    """Run a `trainyard` command; a bad setting is named without a traceback (exit 2)."""
    try:
        app()
    except ValidationError as error:
        if error.title != "Settings":
            raise
        # A setting from the environment (contract/settings.py): say which, and why.
        for problem in error.errors():
            where = ".".join(str(part) for part in problem["loc"])
            why = problem["msg"].removeprefix("Value error, ")
            err_console.print(f"[red]bad setting[/] {where}: {why}", highlight=False)
        sys.exit(2)


# The client commands alone (what tests of them drive).
app = new_app()
register(app)
