"""Commands that take a trained model off the platform: `export` and `predict`.

JOB is a job id or a registered model (`model:name@3`) on the server, a run directory of
`trainyard train`, or a checkpoint file. `export` of a job or model asks the server (GET
/jobs/{id}/export, /models/{name}/{version}/export); of a run directory or file it exports
here. `predict` always scores here, the checkpoint downloaded once. `models` is the registry's
(trainyard/cli_registry.py). Torch loads when a command runs, not when the CLI starts.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console

from trainyard.cli_client import connect, reporting

if TYPE_CHECKING:
    from trainyard.jobs import Job

console = Console()
err_console = Console(stderr=True)

JobOrPath = Annotated[
    str,
    typer.Argument(
        help="a job id or a registered model (model:name@3, model:name@production) on the "
        "server, a run directory or a checkpoint file",
        show_default=False,
    ),
]
CheckpointOption = Annotated[
    str | None,
    typer.Option(help="best, latest or a step; default the best where one was kept, else latest"),
]
Probabilities = Annotated[
    bool, typer.Option("--probabilities", help="the softmax of the class scores")
]


def _job_or_path(job: str) -> Job | Path | str:
    """A server's Job for an id, a model reference as it is, else the path as given."""
    if job.startswith("model:"):
        return job
    if job.isdigit():
        client = connect()
        with reporting():
            return client.job(int(job))
    return Path(job)


def export(
    job: JobOrPath,
    output: Annotated[Path, typer.Option("--output", "-o", help="the file to write")],
    format: Annotated[
        str, typer.Option("--format", "-f", help="onnx or torch-export (.pt2)")
    ] = "onnx",
    checkpoint: CheckpointOption = None,
    probabilities: Probabilities = False,
) -> None:
    """Export a trained model as ONNX or a torch.export program (.pt2), its metadata (input
    name, shape, dtype; a text job's vocabulary) in <file>.json beside it."""
    from trainyard.jobs import Job as ServerJob

    if format not in ("onnx", "torch-export"):
        err_console.print(f"[bold red]error[/] --format {format}: say onnx or torch-export")
        raise typer.Exit(2)
    target = _job_or_path(job)
    with reporting():
        if isinstance(target, ServerJob):
            written = target.export(output, format, checkpoint, probabilities=probabilities)
        elif isinstance(target, str):
            written = connect().export_model(target, output, format, probabilities=probabilities)
        else:
            written = _export_here(target, output, format, checkpoint, probabilities)
    console.print(f"saved {written} (metadata: {written.name}.json)")


def _export_here(
    path: Path, output: Path, fmt: str, checkpoint: str | None, probabilities: bool
) -> Path:
    import torch

    from dsl.export import export_model
    from dsl.inference import InferenceError
    from trainyard.loading import ModelError, load_model

    torch.set_num_threads(1)
    model = load_model(path, checkpoint, probabilities=probabilities)
    try:
        return export_model(model, fmt, output)
    except InferenceError as exc:
        raise ModelError(str(exc)) from None


def predict(
    job: JobOrPath,
    output: Annotated[Path, typer.Option("--output", "-o", help="the scores' .npy file")],
    input: Annotated[
        Path | None,
        typer.Option("--input", "-i", help="the samples: .npy, .npz or .csv (one a row)"),
    ] = None,
    dataset: Annotated[
        str | None,
        typer.Option(help="score one of your uploaded datasets on the cluster instead"),
    ] = None,
    workers: Annotated[
        int, typer.Option(min=1, help="--dataset: workers scoring shards of it at once")
    ] = 1,
    checkpoint: CheckpointOption = None,
    probabilities: Probabilities = False,
    batch_size: Annotated[int, typer.Option(min=1, help="samples scored at a time")] = 1024,
    key: Annotated[
        str | None, typer.Option(help="the .npz array of samples; default x or its only one")
    ] = None,
    threads: Annotated[int, typer.Option(min=1, help="torch intra-op threads")] = 1,
) -> None:
    """Score the samples of a file with a trained model, here, streaming it in batches; or,
    with --dataset, one of your uploaded datasets on the cluster, by --workers processes (it
    waits with a progress bar, then downloads). The scores that fed the job's loss layer (or
    their softmax), in a .npy file."""
    if (input is None) == (dataset is None):
        err_console.print("[bold red]error[/] say one of --input (here) or --dataset (cluster)")
        raise typer.Exit(2)
    if dataset is not None:
        _predict_on_cluster(job, dataset, output, workers, checkpoint, probabilities)
        return
    assert input is not None
    import torch

    from trainyard.loading import load_model
    from trainyard.predicting import predict_file

    torch.set_num_threads(threads)
    target = _job_or_path(job)
    with reporting():
        model = load_model(target, checkpoint, probabilities=probabilities)
        count = predict_file(model, input, output, batch_size=batch_size, key=key)
    shape = [count, *model.score_shape]
    console.print(f"scored {count} samples with step {model.step}'s model: {output} {shape}")


def _predict_on_cluster(
    job: str,
    dataset: str,
    output: Path,
    workers: int,
    checkpoint: str | None,
    probabilities: bool,
) -> None:
    if not (job.isdigit() or job.startswith("model:")):
        err_console.print(
            "[bold red]error[/] --dataset scores on the cluster: JOB is a job id or model:name@3"
        )
        raise typer.Exit(2)
    client = connect()
    with reporting():
        run = client.predict_dataset(
            job, dataset, workers=workers, checkpoint=checkpoint, probabilities=probabilities
        )
        console.print(f"prediction run {run.id} (job {run.info.run_job_id}) on {workers} worker(s)")
        run.wait(progress=True)
        if run.state != "SUCCEEDED":
            err_console.print(f"[bold red]prediction run {run.id} {run.state}[/] {run.info.error}")
            raise typer.Exit(1)
        run.download(output)
    console.print(f"scored {run.info.rows} samples of {dataset}: {output}")


def register(app: typer.Typer) -> None:
    app.command()(export)
    app.command()(predict)
