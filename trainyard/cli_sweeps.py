"""`trainyard sweep list|show|best|cancel`: sweeps on the server, through the SDK."""

from __future__ import annotations

import json
import sys
from itertools import islice
from typing import Annotated

import typer
from rich.table import Table

from trainyard.cli_client import AsJson, best_line, connect, console, reporting
from trainyard.sweeps import summary_line, trial_table

SweepId = Annotated[int, typer.Argument(help="the sweep's id", show_default=False)]

sweep_app = typer.Typer(
    help="Hyperparameter sweeps: list them, show one's trials, its best trial, its parameter "
    "importance, cancel it.",
    no_args_is_help=True,
)


@sweep_app.command("list")
def list_sweeps(
    limit: Annotated[int, typer.Option(help="show at most this many")] = 50,
    as_json: AsJson = False,
) -> None:
    """List sweeps, newest first."""
    client = connect()
    with reporting():
        found = list(islice(client.sweeps(), limit))
    if as_json:
        sys.stdout.write(json.dumps([s.info.model_dump(mode="json") for s in found]) + "\n")
        return
    table = Table(title=f"{len(found)} sweep(s)", title_justify="left")
    for column in ("id", "name", "state", "algorithm", "trials", "best", "created"):
        table.add_column(column, justify="right" if column == "id" else "left")
    for sweep in found:
        info = sweep.info
        best = "-"
        if info.best_trial is not None and info.best_value is not None:
            best = f"trial {info.best_trial}: {info.best_value:.4g}"
        table.add_row(
            str(info.id),
            info.name,
            info.state,
            info.algorithm,
            f"{info.trials_ended}/{info.trial_count}",
            best,
            info.created_at.strftime("%Y-%m-%d %H:%M:%S"),
        )
    console.print(table)


@sweep_app.command()
def show(sweep_id: SweepId, as_json: AsJson = False) -> None:
    """Show a sweep: its trials (parameters, state, metric), its best trial or Pareto front."""
    client = connect()
    with reporting():
        detail = client.sweep(sweep_id).detail()
    if as_json:
        sys.stdout.write(detail.model_dump_json() + "\n")
        return
    console.print(trial_table(detail))
    console.print(summary_line(detail))
    if detail.best_test is not None and detail.best_test.value is not None:
        console.print(
            f"its {detail.best_test.metric}: {detail.best_test.value:.4g} "
            "(the test split, which the choice never saw)"
        )
    for warning in detail.warnings:
        console.print(f"[yellow]warning[/] {warning}")
    if detail.pareto_front:
        numbers = ", ".join(str(trial.number) for trial in detail.pareto_front)
        console.print(f"Pareto front: trials {numbers}")


@sweep_app.command()
def best(sweep_id: SweepId, as_json: AsJson = False) -> None:
    """The best trial: its job, parameters and value (exit 1 while there is none).

    A sweep of several objectives has a Pareto front instead: `trainyard sweep show`.
    """
    client = connect()
    with reporting():
        sweep = client.sweep(sweep_id)
        detail = sweep.detail()
    trial = detail.best
    if trial is None:
        console.print(best_line(sweep))
        raise typer.Exit(1)
    if as_json:
        out = {"sweep_id": detail.id, "metric": detail.objectives[0].metric}
        out.update(trial.model_dump(mode="json"))
        sys.stdout.write(json.dumps(out) + "\n")
        return
    console.print(best_line(sweep))


@sweep_app.command()
def importance(
    sweep_id: SweepId,
    evaluator: Annotated[
        str, typer.Option(help="fanova, mean_decrease_impurity or ped_anova (Optuna's)")
    ] = "fanova",
    as_json: AsJson = False,
) -> None:
    """Parameter importance: how much the metric depends on each path of the space."""
    client = connect()
    with reporting():
        found = client.sweep(sweep_id).importance(evaluator)
    if as_json:
        sys.stdout.write(found.model_dump_json() + "\n")
        return
    table = Table()
    table.add_column("path")
    table.add_column("importance", justify="right")
    for path, share in found.importances.items():
        table.add_row(path, f"{share:.3f}")
    console.print(table)
    console.print(
        f"sweep {sweep_id}: importance for {found.metric} ({found.evaluator}, "
        f"{found.trials} trials)"
    )


@sweep_app.command()
def cancel(sweep_id: SweepId) -> None:
    """Cancel a sweep: no more trials start, the live ones are cancelled."""
    client = connect()
    with reporting():
        sweep = client.sweep(sweep_id).cancel()
    console.print(summary_line(sweep.info) + ("   (cancel requested)" if not sweep.done else ""))


def register(app: typer.Typer) -> None:
    app.add_typer(sweep_app, name="sweep")
