"""`trainyard datasets upload|list|delete`: your datasets on the server.

`upload` sends the file in parts with a progress bar; run again after an interruption (a lost
connection, Ctrl-C, a killed process) it sends only the parts the server lacks
(trainyard/uploads.py).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)
from rich.table import Table

from trainyard.cli_client import AsJson, connect, reporting

console = Console()

datasets_app = typer.Typer(
    help="Your datasets on the server: upload (in parts that resume), list, delete.",
    no_args_is_help=True,
)


@datasets_app.command()
def upload(
    file: Annotated[
        Path,
        typer.Argument(
            exists=True,
            dir_okay=False,
            help=".npz, .csv, .parquet, or .txt (UTF-8 text for the text source)",
            show_default=False,
        ),
    ],
    name: Annotated[str, typer.Option("--name", "-n", help="the name jobs use")],
    label_column: Annotated[
        str | None,
        typer.Option(help="tables with text columns and Parquet: the label column"),
    ] = None,
    part_size: Annotated[
        int | None,
        typer.Option(help="bytes per part (at least 65536); default the server's largest"),
    ] = None,
    restart: Annotated[
        bool, typer.Option(help="abort an open upload of the name for another file")
    ] = False,
) -> None:
    """Upload a dataset in parts; run it again to resume an interrupted upload."""
    client = connect()
    with (
        Progress(
            TextColumn(f"[bold]{name}"),
            BarColumn(),
            DownloadColumn(),
            TransferSpeedColumn(),
            TimeRemainingColumn(),
            console=console,
        ) as bar,
        reporting(),
    ):
        task = bar.add_task("upload", total=file.stat().st_size)
        started = False

        def progress(sent: int, total: int) -> None:
            nonlocal started
            if not started and sent:
                bar.console.print(f"resuming: {sent:,} of {total:,} bytes already on the server")
            started = True
            bar.update(task, completed=sent, total=total)

        info = client.upload_dataset(
            file,
            name,
            part_size=part_size,
            label_column=label_column,
            restart=restart,
            progress=progress,
        )
    console.print(f"dataset [bold]{info.name}[/]: {info.kind}, {info.size} bytes")


@datasets_app.command("list")
def list_datasets(as_json: AsJson = False) -> None:
    """Your datasets (an admin's: everyone's)."""
    client = connect()
    with reporting():
        found = client.datasets()
    if as_json:
        sys.stdout.write(json.dumps([d.model_dump(mode="json") for d in found]) + "\n")
        return
    table = Table(title=f"{len(found)} dataset(s)", title_justify="left")
    for column in ("name", "kind", "bytes", "owner", "created"):
        table.add_column(column)
    for dataset in found:
        table.add_row(
            dataset.name,
            dataset.kind,
            f"{dataset.size:,}",
            dataset.owner,
            dataset.created_at.strftime("%Y-%m-%d %H:%M:%S"),
        )
    console.print(table)


@datasets_app.command()
def delete(
    name: Annotated[str, typer.Argument(help="the dataset's name", show_default=False)],
) -> None:
    """Delete a dataset and free its bytes (refused while a queued or running job reads it)."""
    client = connect()
    with reporting():
        client.delete_dataset(name)
    console.print(f"deleted dataset {name}")


def register_commands(app: typer.Typer) -> None:
    app.add_typer(datasets_app, name="datasets")
