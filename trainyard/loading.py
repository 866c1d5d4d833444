"""A trained model as a `torch.nn.Module` on the user's machine.

    import trainyard
    model = trainyard.load_model(42)                  # job 42 on the server: its best checkpoint
    model = trainyard.load_model("runs/digits-mlp")   # a `trainyard train` run directory
    model = trainyard.load_model("step-00000400.safetensors", checkpoint=...)  # one file
    scores = model(x)                                 # x: (B, *sample_shape) in the data's dtype

Every checkpoint describes its model (dsl/inference.py), so the checkpoint file is all that is
downloaded. Which checkpoint: `best` (the objective's, kept by checkpoint.keep_best), `latest`,
or a step; by default the best where one was kept, else the latest. Above the client: a job id
or a registered model is found through a `Client`; the file itself, a run directory's and the
net loaded from it are trainyard/model_files.py's. Torch and the job language load when a
model does, not when the client is imported.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from trainyard.client import Client
from trainyard.jobs import Job, download_model_checkpoint
from trainyard.model_files import (
    Choice,
    ModelError,
    load_checkpoint_model,
    model_cache,
    parse_choice,
    run_dir_checkpoint,
)

if TYPE_CHECKING:
    from dsl.inference import InferenceNet

__all__ = [
    "Choice",
    "ModelError",
    "checkpoint_file",
    "load_checkpoint_model",
    "load_model",
    "parse_choice",
    "run_dir_checkpoint",
]


def load_model(
    job_or_path: Job | int | str | Path,
    checkpoint: Choice = None,
    *,
    probabilities: bool = False,
    client: Client | None = None,
) -> InferenceNet:
    """The net of a job's checkpoint, in eval mode, for prediction: `model(x)` gives the scores
    that fed the job's loss layer (their softmax with `probabilities`).

    `job_or_path`: a `Job`, a job id or a registered model (`model:name@3`, `model:name@tag`,
    `model:name` for its newest version; on the server of `client`, else of `Client()`), a run
    directory of `trainyard train`, or a checkpoint file.
    """
    path = checkpoint_file(job_or_path, checkpoint, client=client)
    return load_checkpoint_model(path, probabilities=probabilities)


def checkpoint_file(
    job_or_path: Job | int | str | Path, checkpoint: Choice = None, *, client: Client | None = None
) -> Path:
    """The local checkpoint file `job_or_path` and `checkpoint` name, downloaded from the server
    (once: kept in the data directory's cache) when they name a job."""
    choice = parse_choice(checkpoint)
    if isinstance(job_or_path, str) and job_or_path.startswith("model:"):
        if choice is not None:
            raise ModelError(f"{job_or_path} is one checkpoint: it has no other to choose")
        return download_registered(client or Client(), job_or_path)
    if isinstance(job_or_path, Job):
        return download_model_checkpoint(job_or_path, choice)
    if isinstance(job_or_path, int) or (isinstance(job_or_path, str) and job_or_path.isdigit()):
        return download_model_checkpoint((client or Client()).job(int(job_or_path)), choice)
    path = Path(job_or_path).expanduser()
    if path.is_file():
        if choice is not None:
            raise ModelError(f"{path} is one checkpoint file: it has no other to choose")
        return path
    if path.is_dir():
        return run_dir_checkpoint(path, choice)
    raise ModelError(f"no such job, run directory or checkpoint file: {job_or_path}")


def download_registered(client: Client, ref: str) -> Path:
    """A registered model version's checkpoint, downloaded once into the client's cache."""
    found = client.model(ref)
    stamp = int(found.created_at.timestamp())  # a version deleted and registered again differs
    name = f"model-{found.name}-v{found.version}-{stamp}.safetensors"
    cached = model_cache(client.url) / name
    if cached.is_file():
        return cached
    return client.download(f"/models/{found.name}/{found.version}/checkpoint", cached)
