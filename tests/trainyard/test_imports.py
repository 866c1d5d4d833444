"""The client package (`trainyard`) is the HTTP client and its commands: it never reaches into
the server side, and `trainyard jobs` starts without loading torch, SQLAlchemy or the
workers."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SERVER_SIDE = ("api", "scheduler", "workers")
# Heavy or server-only modules that starting a client command must not load.
FORBIDDEN = ("torch", "sqlalchemy", "alembic", "celery", "uvicorn", "fastapi", "api", "scheduler")


def _imported(path: Path) -> set[str]:
    """Every module a file imports, at the top or inside a function."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


@pytest.mark.parametrize("path", sorted((ROOT / "trainyard").glob("*.py")), ids=lambda p: p.name)
def test_the_client_imports_nothing_of_the_server_side(path: Path) -> None:
    wrong = sorted(
        name for name in _imported(path) if name.split(".")[0] in (*SERVER_SIDE, "torch")
    )
    assert not wrong, f"trainyard/{path.name} imports {wrong}"


def _loaded_by(module: str) -> list[str]:
    """The modules loaded by importing `module` in a fresh interpreter."""
    code = f"import json, sys, {module}; print(json.dumps(sorted(sys.modules)))"
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    loaded: list[str] = json.loads(done.stdout)
    return loaded


@pytest.mark.parametrize(
    ("module", "workers"),
    [
        ("trainyard.cli", []),
        # scheduler/cli/local.py defines the local commands; their work (torch, data) waits in
        # their bodies.
        ("scheduler.cli.main", []),
    ],
)
def test_the_command_starts_without_heavy_imports(module: str, workers: list[str]) -> None:
    loaded = _loaded_by(module)
    heavy = [name for name in loaded if name.split(".")[0] in FORBIDDEN]
    # The entry module itself and the package it lives in are expected, nothing else of it.
    entry = ("scheduler", "scheduler.cli", "scheduler.cli.main")
    entry += ("scheduler.cli.local", "scheduler.cli.admin")
    heavy = [name for name in heavy if name not in entry]
    assert not heavy, f"importing {module} loads {heavy}"
    assert [name for name in loaded if name.split(".")[0] == "workers"] == workers
