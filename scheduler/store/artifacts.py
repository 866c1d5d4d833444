"""Paths that came from a record (a Redis stream, a database row) are confined before any file
is opened, copied or deleted: a job's checkpoint to that job's run directory, a dataset to its
owner's folder.

A record is data another process wrote: a checkpoint path of `/etc/passwd`, a `../..` or a
symlink that leads out must not make the API serve or delete a file there, and one job's
record must not name another job's checkpoint or another user's dataset (a compromised
training process writes its own job's stream, and could forge a record there). `confine`
resolves the path (following every symlink and `..`) and refuses it unless it lands inside
the resolved root; callers then use the resolved path.
"""

from __future__ import annotations

from pathlib import Path

from contract.rundir import job_run_dir


class UnsafePath(ValueError):
    """A recorded path that leads outside the artifact directory; `str()` says which."""


def confine(
    recorded: str | Path,
    root: Path,
    *,
    what: str = "file",
    within: str = "the artifact directory",
) -> Path:
    """`recorded`, resolved, if it lies inside `root` (resolved, called `within`); else
    UnsafePath."""
    text = str(recorded)
    if not text or "\x00" in text:
        raise UnsafePath(f"refused: the {what}'s recorded path {text!r} is not a path")
    base = root.expanduser().resolve()
    path = Path(text).expanduser()
    resolved = (path if path.is_absolute() else base / path).resolve()
    if not resolved.is_relative_to(base):
        raise UnsafePath(
            f"refused: the {what}'s recorded path {text!r} leads outside {within} "
            f"(to {resolved}); nothing was read, copied or deleted"
        )
    return resolved


def confine_to_job(recorded: str | Path, artifacts: Path, job_id: int, *, what: str) -> Path:
    """`recorded`, resolved, if it lies inside job `job_id`'s run directory; else UnsafePath."""
    return confine(
        recorded,
        job_run_dir(artifacts, job_id),
        what=what,
        within=f"job {job_id}'s run directory",
    )
