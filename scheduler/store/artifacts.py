"""Paths that came from a record (a Redis stream, a database row) are confined to the artifact
directory before any file is opened or deleted.

A record is data another process wrote: a checkpoint path of `/etc/passwd`, a `../..` or a
symlink that leads out of the artifact directory must not make the API serve or delete a file
there. `confine` resolves the path (following every symlink and `..`) and refuses it unless it
lands inside the resolved artifact directory; callers then use the resolved path.
"""

from __future__ import annotations

from pathlib import Path


class UnsafePath(ValueError):
    """A recorded path that leads outside the artifact directory; `str()` says which."""


def confine(recorded: str | Path, root: Path, *, what: str = "file") -> Path:
    """`recorded`, resolved, if it lies inside `root` (resolved); else UnsafePath."""
    text = str(recorded)
    if not text or "\x00" in text:
        raise UnsafePath(f"refused: the {what}'s recorded path {text!r} is not a path")
    base = root.expanduser().resolve()
    path = Path(text).expanduser()
    resolved = (path if path.is_absolute() else base / path).resolve()
    if not resolved.is_relative_to(base):
        raise UnsafePath(
            f"refused: the {what}'s recorded path {text!r} leads outside the artifact "
            f"directory (to {resolved}); nothing was read or deleted"
        )
    return resolved
