"""A model's checkpoint file on this machine: which file of a run directory, the net loaded from
one, and the cache that a server's checkpoints are downloaded into. trainyard/loading.py finds
the file a job, a registered model or a path names; a `Job` loads its own (trainyard/jobs.py).
Torch and the job language load when a net does, not when the client is imported.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from contract.rundir import CHECKPOINTS, SUMMARY, list_checkpoints
from contract.settings import Settings
from trainyard.errors import TrainyardError

if TYPE_CHECKING:
    from dsl.inference import InferenceNet

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


def model_cache(url: str) -> Path:
    """Where the checkpoints of the server at `url` are cached (jobs of two servers may share
    an id): a folder only its user may enter (0700, as its `models` folder), since a trained
    model is its owner's as much as on the server; a cache made before is closed too."""
    folder = "".join(c if c.isalnum() else "_" for c in url.split("://")[-1]).strip("_")
    models = Settings().cache_dir() / "models"
    for private in (models, models / folder):
        private.mkdir(mode=0o700, parents=True, exist_ok=True)
        private.chmod(0o700)
    return models / folder
