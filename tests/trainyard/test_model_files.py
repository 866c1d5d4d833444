"""The client's model cache is its user's alone: a downloaded checkpoint is as private as the
trained model on the server."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from trainyard.model_files import model_cache


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_model_cache_folders_are_closed_to_other_users(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRAINYARD_DATA_DIR", str(tmp_path / "data"))
    old = os.umask(0o022)
    try:
        # A cache made by an earlier client, open to everyone as the umask left it.
        (tmp_path / "data" / "cache" / "models" / "old_server_8000").mkdir(parents=True)
        fresh = model_cache("http://new.server:8000")
        reused = model_cache("http://old.server:8000")
    finally:
        os.umask(old)
    models = tmp_path / "data" / "cache" / "models"
    assert fresh.parent == reused.parent == models
    assert fresh.is_dir() and reused.is_dir()
    assert mode(models) == mode(fresh) == mode(reused) == 0o700
