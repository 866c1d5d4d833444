"""A trained model as a `torch.nn.Module` on the user's machine.

    import trainyard
    model = trainyard.load_model(42)                  # job 42 on the server: its best checkpoint
    model = trainyard.load_model("runs/digits-mlp")   # a `trainyard train` run directory
    model = trainyard.load_model("step-00000400.safetensors", checkpoint=...)  # one file
    scores = model(x)                                 # x: (B, *sample_shape) in the data's dtype

Every checkpoint describes its model (dsl/inference.py), so the checkpoint file is all that is
downloaded. Which checkpoint: `best` (the objective's, kept by checkpoint.keep_best), `latest`,
or a step; by default the best where one was kept, else the latest. Torch and the job language
load when a model does, not when the client is imported.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from contract.rundir import CHECKPOINTS, SUMMARY, list_checkpoints
from contract.settings import Settings
from trainyard.errors import NotFound, TrainyardError

if TYPE_CHECKING:
    from dsl.inference import InferenceNet
    from trainyard.client import Client
    from trainyard.jobs import Job

Choice = str | int | None  # "best", "latest", a step, or None: the best where one was kept


class ModelError(TrainyardError):
    """A model cannot be found, loaded or run as asked; `str()` says why."""


def parse_choice(text: str | int | None) -> Choice:
    """`best`, `latest` or a step number, as a user wrote it; else ModelError."""
    if text is None or isinstance(text, int):
        return text
    word = text.strip().lower()
    if word in ("best", "latest"):
        return word
    if word.isdigit():
        return int(word)
    raise ModelError(f"checkpoint {text!r}: say best, latest or a step number")


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


def load_checkpoint_model(path: Path, *, probabilities: bool = False) -> InferenceNet:
    """The inference net of one checkpoint file; a problem is a ModelError. The plugins this
    process is configured with (TRAINYARD_PLUGINS, installed ones) load first, as in every
    process of the platform: a net may have their layers."""
    from dsl import plugins
    from dsl.inference import InferenceError, load_inference_net

    try:
        if plugins.wanted():
            plugins.load_plugins()
        return load_inference_net(path, probabilities=probabilities)
    except (InferenceError, plugins.PluginError) as exc:
        raise ModelError(str(exc)) from None


def checkpoint_file(
    job_or_path: Job | int | str | Path, checkpoint: Choice = None, *, client: Client | None = None
) -> Path:
    """The local checkpoint file `job_or_path` and `checkpoint` name, downloaded from the server
    (once: kept in the data directory's cache) when they name a job."""
    from trainyard.client import Client
    from trainyard.jobs import Job

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


def run_dir_checkpoint(run_dir: Path, choice: Choice = None) -> Path:
    """The checkpoint file of a local run directory (`trainyard train`'s) that `choice` names:
    by default its best (checkpoint.keep_best, as its summary names it) where one was kept,
    else its latest."""
    found = dict(list_checkpoints(run_dir / CHECKPOINTS))
    if not found:
        raise ModelError(f"{run_dir} has no checkpoints (is it a run directory?)")
    if isinstance(choice, int):
        if choice not in found:
            steps = ", ".join(str(s) for s in sorted(found))
            raise ModelError(f"{run_dir} has no checkpoint at step {choice} (it has {steps})")
        return found[choice]
    best = _best_of_summary(run_dir, found)
    if choice == "best" and best is None:
        raise ModelError(
            f"{run_dir} has no best checkpoint: a job keeps one with checkpoint.keep_best: true"
        )
    if choice != "latest" and best is not None:
        return best
    return found[max(found)]


def _best_of_summary(run_dir: Path, found: dict[int, Path]) -> Path | None:
    try:
        summary: Any = json.loads((run_dir / SUMMARY).read_text())
    except (OSError, ValueError):
        return None
    best = summary.get("best") if isinstance(summary, dict) else None
    name = best.get("checkpoint") if isinstance(best, dict) else None
    if not isinstance(name, str):
        return None
    by_name = {path.name: path for path in found.values()}
    return by_name.get(Path(name).name)


def job_checkpoint_step(job: Job, choice: Choice = None) -> int:
    """The step of the job's checkpoint that `choice` names, from the server's list."""
    known = job.checkpoints()
    if not known:
        raise NotFound(f"job {job.id} has no checkpoints (yet)", 404)
    steps = sorted(c.step for c in known)
    if isinstance(choice, int):
        if choice not in steps:
            listed = ", ".join(str(s) for s in steps)
            raise NotFound(
                f"job {job.id} has no checkpoint at step {choice} (it has {listed})", 404
            )
        return choice
    best = [c.step for c in known if c.best]
    if choice == "best" and not best:
        raise NotFound(
            f"job {job.id} has no best checkpoint: a job keeps one with checkpoint.keep_best: true",
            404,
        )
    if choice != "latest" and best:
        return best[-1]
    return steps[-1]


def download_model_checkpoint(job: Job, choice: Choice = None) -> Path:
    """The job's checkpoint that `choice` names, downloaded once into the client's cache."""
    step = job_checkpoint_step(job, choice)
    cache = Settings().cache_dir() / "models" / _server_folder(job.client.url) / f"job-{job.id}"
    cached = cache / f"step-{step:08d}.safetensors"
    if cached.is_file():
        return cached
    return job.download_checkpoint(cache, step)


def _server_folder(url: str) -> str:
    """A folder name for a server's address (jobs of two servers may share an id)."""
    return "".join(c if c.isalnum() else "_" for c in url.split("://")[-1]).strip("_")


def download_registered(client: Client, ref: str) -> Path:
    """A registered model version's checkpoint, downloaded once into the client's cache."""
    found = client.model(ref)
    stamp = int(found.created_at.timestamp())  # a version deleted and registered again differs
    name = f"model-{found.name}-v{found.version}-{stamp}.safetensors"
    cached = Settings().cache_dir() / "models" / _server_folder(client.url) / name
    if cached.is_file():
        return cached
    return client.download(f"/models/{found.name}/{found.version}/checkpoint", cached)
