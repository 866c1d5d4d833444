"""Batch prediction on the cluster from the client: a run of a job's (or a registered model's)
checkpoint over one of your uploaded datasets, scored by workers the service places
(POST /jobs/{id}/predictions, /models/{name}/{which}/predictions); follow it, download its
scores as one .npy."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from trainyard.errors import WaitTimeout
from trainyard.models import PredictionOut

if TYPE_CHECKING:
    from trainyard.client import Client

ENDED = ("SUCCEEDED", "FAILED", "CANCELLED")


class Prediction:
    """One batch prediction run on the service."""

    def __init__(self, client: Client, info: PredictionOut) -> None:
        self.client = client
        self.info = info

    def __repr__(self) -> str:
        return f"Prediction(id={self.id}, state={self.state!r}, progress={self.progress:.2f})"

    @property
    def id(self) -> int:
        return self.info.id

    @property
    def state(self) -> str:
        return str(self.info.state)

    @property
    def progress(self) -> float:
        return self.info.progress

    @property
    def done(self) -> bool:
        return self.state in ENDED

    def refresh(self) -> Prediction:
        self.info = PredictionOut.model_validate(self.client.get_json(f"/predictions/{self.id}"))
        return self

    def wait(
        self, progress: bool = False, timeout: float | None = None, poll: float = 1.0
    ) -> Prediction:
        """Block until the run ends; with `progress`, a progress bar of the rows scored."""
        deadline = None if timeout is None else time.monotonic() + timeout
        bar = Progress(
            TextColumn("prediction {task.fields[pid]} {task.fields[state]}"),
            BarColumn(),
            TextColumn("{task.completed:.0f}/{task.total:.0f} rows"),
            TimeElapsedColumn(),
            console=Console(stderr=True),
            disable=not progress,
        )
        with bar:
            task = bar.add_task("", total=self.info.rows, pid=self.id, state=self.state)
            while not self.refresh().done:
                bar.update(task, completed=self.info.rows_done, state=self.state)
                if deadline is not None and time.monotonic() >= deadline:
                    raise WaitTimeout(
                        f"prediction {self.id} is still {self.state} after {timeout}s"
                    )
                time.sleep(poll)
            bar.update(task, completed=self.info.rows_done, state=self.state)
        return self

    def download(self, path: str | Path) -> Path:
        """The scores, one .npy (a row per sample of the dataset, in its order)."""
        return self.client.download(f"/predictions/{self.id}/output", Path(path).expanduser())

    def scores(self) -> Any:
        """The scores as a numpy array (downloaded to a temporary file first)."""
        import tempfile

        import numpy as np

        with tempfile.TemporaryDirectory() as folder:
            return np.load(self.download(Path(folder) / "scores.npy"))


def start(
    client: Client,
    path: str,
    *,
    dataset: str,
    workers: int = 1,
    checkpoint: str | int | None = None,
    probabilities: bool = False,
    batch_size: int = 1024,
) -> Prediction:
    body: dict[str, Any] = {
        "dataset": dataset,
        "workers": workers,
        "probabilities": probabilities,
        "batch_size": batch_size,
    }
    if checkpoint is not None:
        body["checkpoint"] = str(checkpoint)
    data = client.request("POST", path, json=body).json()
    return Prediction(client, PredictionOut.model_validate(data))


def source_path(client: Client, job_or_model: int | str) -> str:
    """The POST path of a job id or a model reference (`model:name@3`, `name@production`,
    `name`: the newest version)."""
    if isinstance(job_or_model, int) or str(job_or_model).isdigit():
        return f"/jobs/{int(job_or_model)}/predictions"
    found = client.model(str(job_or_model))
    return f"/models/{found.name}/{found.version}/predictions"
