"""The artifact directory's names are spelled in contract/rundir.py alone."""

from __future__ import annotations

import ast
from pathlib import Path

from contract import rundir

ROOT = Path(__file__).resolve().parents[2]
SOURCE_PACKAGES = ("api", "bench", "dsl", "scheduler", "scripts", "trainyard", "workers")
NAMES = {
    rundir.METRICS,
    rundir.TIMELINE,
    rundir.TRAIN_LOG,
    rundir.SUMMARY,
    rundir.CHECKPOINTS,
    rundir.RESTART,
}


def test_run_directory_names_are_spelled_only_in_contract() -> None:
    spelled = []
    for package in SOURCE_PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            if "migrations" in path.parts:  # table names, not files
                continue
            tree = ast.parse(path.read_text(), str(path))
            tables = {
                id(node.value)
                for node in ast.walk(tree)
                if isinstance(node, ast.Assign)
                and any(getattr(t, "id", "") == "__tablename__" for t in node.targets)
            }
            for node in ast.walk(tree):
                if (
                    isinstance(node, ast.Constant)
                    and node.value in NAMES
                    and id(node) not in tables
                ):
                    spelled.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.value!r}")
    assert spelled == []


def test_a_job_and_its_checkpoints_have_one_place(tmp_path: Path) -> None:
    run = rundir.job_run_dir(tmp_path, 12)
    assert run == tmp_path / "jobs" / "12"
    folder = run / rundir.CHECKPOINTS
    folder.mkdir(parents=True)
    for step in (20, 3):
        rundir.checkpoint_path(folder, step).write_bytes(b"")
    assert [step for step, _ in rundir.list_checkpoints(folder)] == [3, 20]
    assert rundir.latest_restart_point(run, below=20) == (3, rundir.checkpoint_path(folder, 3))
