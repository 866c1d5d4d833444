"""The layout of a job's run directory, as workers write it and the scheduler reads it.

    <artifacts>/jobs/<id>/          the run directory (worker 0 of group 0 writes it)
        checkpoints/step-N.safetensors   the user's checkpoints (checkpoint.freq, keep)
        restart/step-N.safetensors       restart points (every few minutes; the service's own;
                                         the newest two kept)
        restart/attempt-K.safetensors    the point attempt K of the job resumes from

Restart points are kept apart from the user's checkpoints: they are not listed as the job's
checkpoints and are deleted when the job ends.
"""

from __future__ import annotations

import re
from pathlib import Path

CHECKPOINTS = "checkpoints"
RESTART = "restart"
_NAME = re.compile(r"^step-(\d{8,})\.safetensors$")


def checkpoint_path(directory: Path, step: int) -> Path:
    return directory / f"step-{step:08d}.safetensors"


def list_checkpoints(directory: Path) -> list[tuple[int, Path]]:
    """(step, path) of every checkpoint in `directory`, oldest first."""
    if not directory.is_dir():
        return []
    found = []
    for entry in directory.iterdir():
        match = _NAME.match(entry.name)
        if match:
            found.append((int(match.group(1)), entry))
    return sorted(found)


def latest_restart_point(run_dir: Path, below: int | None = None) -> tuple[int, Path] | None:
    """The newest checkpoint or restart point of a run, at a step below `below` if given:
    (step, path), or None."""
    found = list_checkpoints(run_dir / CHECKPOINTS) + list_checkpoints(run_dir / RESTART)
    return max((f for f in found if below is None or f[0] < below), default=None)


def attempt_point(run_dir: Path, attempt: int) -> Path:
    """Where attempt `attempt`'s restart point is kept (a link to the file it resumes from)."""
    return run_dir / RESTART / f"attempt-{attempt}.safetensors"
