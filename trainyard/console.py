"""Terminal presentation shared by CLI commands: located errors, layer tables, pipeline
stages, progress."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

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


def shape_text(shape: Sequence[Any]) -> str:
    """A per-sample output shape, (256,) or (32, 40); a slice layer's several: (4,) | (4,)."""
    if shape and isinstance(shape[0], list | tuple):
        return " | ".join(str(tuple(part)) for part in shape)
    return str(tuple(shape))


def layer_table(rows: Iterable[Mapping[str, Any]], title: str) -> Table:
    """Layers as the compiler's table rows or the API's LayerOut give them (name, type,
    sources, out_shape, params, partition_dim)."""
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
            ", ".join(row["sources"]) or "-",
            shape_text(row["out_shape"]),
            f"{row['params']:,}",
            str(row["partition_dim"]),
        )
    return table


def describe_memory(memory: Mapping[str, Any]) -> str:
    """One line for a worker's estimated peak memory (the API's MemoryOut form)."""
    parts = ("parameters", "gradients", "updater_state", "activations", "data", "runtime")
    shown = ", ".join(f"{part.replace('_', ' ')} {memory[f'{part}_mb']}" for part in parts)
    return f"memory per worker: about [bold]{memory['total_mb']:,} MB[/] ({shown})"


def describe_topology(topology: Mapping[str, Any]) -> str:
    """One line for a resolved topology (Topology.to_dict() form, as the API returns it)."""
    groups, per_group = topology["nworker_groups"], topology["nworkers_per_group"]
    line = f"topology: {topology['framework']}: {groups} worker group(s) x {per_group} worker(s)"
    sgroups, shards = topology["nserver_groups"], topology["nservers_per_group"]
    if sgroups and shards:
        where = "own processes" if topology["server_worker_separate"] else "inside the workers"
        line += f", {sgroups} server group(s) x {shards} shard(s) ({where})"
    processes = topology["workers"] + topology["servers"]
    slots = topology["workers"] * topology["slots_per_worker"] + topology["servers"]
    gpus = topology["workers"] * topology["gpus_per_worker"]
    return line + f"; {processes} process(es), {slots} slot(s), {gpus} GPU(s)"


def pipeline_table(plan: Mapping[str, Any]) -> Table:
    """A pipeline plan's stages (PipelinePlan.to_dict() form, as the API returns it)."""
    stages = plan["stages"]
    pieces = plan.get("virtual_stages", 1)
    count = f"{len(stages)} stages"
    if pieces > 1:  # the rows are the pieces, each on the stage `rank`
        count = f"{len(stages) // pieces} stages x {pieces} pieces"
    title = (
        f"pipeline: {count} x {plan['microbatches']} micro-batches, "
        f"{plan['schedule']}{', rematerialized' if plan['rematerialize'] else ''} "
        f"({plan['costs']} costs)"
    )
    table = Table(title=title, title_justify="left")
    columns = [("piece", "right"), ("stage", "right")] if pieces > 1 else [("stage", "right")]
    for column, justify in (
        *columns,
        ("layers", "left"),
        ("params", "right"),
        ("fwd+bwd ms", "right"),
        ("activations MB", "right"),
    ):
        table.add_column(column, justify=justify)  # type: ignore[arg-type]
    for i, stage in enumerate(stages):
        where = [str(i), str(stage["rank"])] if pieces > 1 else [str(i)]
        table.add_row(
            *where,
            ", ".join(stage["layers"]),
            f"{stage['params']:,}",
            f"{stage['time_ms']:.3f}",
            f"{stage['activation_mb']:.2f}",
        )
    return table


def describe_pipeline(plan: Mapping[str, Any]) -> str:
    """The plan's bubble and speed-ups in one line."""
    return (
        f"bubble: {plan['bubble']:.1%}   ideal speed-up: {plan['ideal_speedup']:.2f}x   "
        f"balance: {plan['balance']:.1%}   expected speed-up: {plan['expected_speedup']:.2f}x"
    )


def placement_table(assignments: Iterable[Mapping[str, Any]], title: str) -> Table:
    table = Table(title=title, title_justify="left")
    for column in ("process", "node", "slots", "GPUs"):
        table.add_column(column, justify="left" if column in ("process", "node") else "right")
    for a in assignments:
        process = f"{a['role']} {a['group']}/{a['rank']}"
        table.add_row(process, str(a["node"]), str(a["slots"]), str(a["gpus"]))
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
