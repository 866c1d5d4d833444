"""The client's side of the `trainyard` command: the commands that talk to a server over HTTP
(sdk/cli_client.py, and sdk/cli_sweeps.py for sweeps) and `schema`.

The installed command (scheduler/cli.py) adds the server commands and the local training ones
to these. This module imports nothing of the server side, of workers or of torch, so that
`trainyard jobs` starts fast (tests/sdk/test_imports.py holds it to that).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer
from pydantic import ValidationError
from rich.console import Console

from sdk import cli_client, cli_sweeps

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


def new_app() -> typer.Typer:
    """An empty `trainyard` command."""
    return typer.Typer(
        help="Trainyard: describe a deep-learning job in YAML, train it locally or on the service.",
        no_args_is_help=True,
        pretty_exceptions_enable=False,
    )


def register(app: typer.Typer) -> None:
    """Add the client commands to `app`."""
    app.command()(schema)
    cli_client.register(app)
    cli_sweeps.register(app)


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
