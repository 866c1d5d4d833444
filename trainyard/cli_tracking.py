"""`trainyard mlflow export`: a job or a sweep sent to an MLflow tracking server
(trainyard/mlflow_export.py). TensorBoard's files come with `trainyard download --tensorboard`."""

from __future__ import annotations

import json
import sys
from typing import Annotated

import typer

from trainyard.cli_client import connect, console, err_console, reporting

mlflow_app = typer.Typer(
    help="Send jobs and sweeps to an MLflow tracking server.", no_args_is_help=True
)


@mlflow_app.command("export")
def export(
    tracking_uri: Annotated[
        str, typer.Option(help="the MLflow tracking server, e.g. http://127.0.0.1:5000")
    ],
    job_id: Annotated[
        int | None, typer.Argument(help="the job's id (or give --sweep)", show_default=False)
    ] = None,
    sweep: Annotated[
        int | None, typer.Option(help="export this sweep: a parent run, a nested run per trial")
    ] = None,
    experiment: Annotated[
        str | None,
        typer.Option(help="the MLflow experiment (made if new); default the job's or sweep's name"),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the run ids as JSON")] = False,
) -> None:
    """Log a job (or a sweep's trials, nested) to MLflow: params, metrics with steps, tags,
    its YAML and best checkpoint."""
    if (job_id is None) == (sweep is None):
        err_console.print("[bold red]error[/] give a job id or --sweep ID (one of them)")
        raise typer.Exit(2)
    from trainyard.mlflow_export import export_job, export_sweep

    client = connect()
    with reporting():
        if sweep is not None:
            done = export_sweep(client, sweep, tracking_uri=tracking_uri, experiment=experiment)
        else:
            assert job_id is not None
            done = export_job(client, job_id, tracking_uri=tracking_uri, experiment=experiment)
    if as_json:
        answer = {
            "experiment_id": done.experiment_id,
            "run_id": done.run_id,
            "trials": {str(job): run for job, run in done.trials.items()},
        }
        sys.stdout.write(json.dumps(answer) + "\n")
        return
    what = f"sweep {sweep}" if sweep is not None else f"job {job_id}"
    nested = f" with {len(done.trials)} nested trial run(s)" if done.trials else ""
    console.print(
        f"exported {what} to {tracking_uri}: experiment {done.experiment_id}, "
        f"run {done.run_id}{nested}"
    )


def register(app: typer.Typer) -> None:
    app.add_typer(mlflow_app, name="mlflow")
