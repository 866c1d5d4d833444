"""Terminal presentation shared by CLI commands: located errors, layer tables, progress."""

from __future__ import annotations

from collections.abc import Iterable

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from dsl.errors import SpecIssue


def print_issues(console: Console, issues: Iterable[SpecIssue], filename: str) -> None:
    for issue in issues:
        where = f"{filename}:{issue.line}:{issue.column}" if issue.line else filename
        console.print(f"[bold red]error[/] {where}: [cyan]{issue.path}[/]: {issue.message}")
        if issue.hint:
            console.print(f"    [dim]hint:[/] {issue.hint}")


def layer_table(rows: Iterable[dict[str, object]], title: str) -> Table:
    table = Table(title=title, title_justify="left")
    for column, justify in (
        ("layer", "left"),
        ("type", "left"),
        ("sources", "left"),
        ("output shape", "left"),
        ("params", "right"),
        ("partition", "right"),
    ):
        table.add_column(column, justify=justify)  # type: ignore[arg-type]
    for row in rows:
        table.add_row(
            str(row["name"]),
            str(row["type"]),
            ", ".join(row["sources"]) or "-",  # type: ignore[arg-type]
            str(row["shape"]),
            f"{row['params']:,}",
            str(row["partition_dim"]),
        )
    return table


def training_progress(console: Console) -> Progress:
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[stats]}"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=console,
    )


def format_stats(values: dict[str, float]) -> str:
    parts = []
    for key, label, fmt in (
        ("train/loss", "loss", "{:.4f}"),
        ("train/accuracy", "acc", "{:.3f}"),
        ("train/recon_error", "recon", "{:.4f}"),
        ("test/accuracy", "test acc", "{:.3f}"),
        ("samples_per_sec", "samples/s", "{:,.0f}"),
    ):
        if key in values:
            parts.append(f"{label} {fmt.format(values[key])}")
    return "  ".join(parts)
