"""`confine`: recorded paths resolve inside the artifact directory or are refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from scheduler.store.artifacts import UnsafePath, confine


@pytest.fixture
def artifacts(tmp_path: Path) -> Path:
    root = tmp_path / "artifacts"
    (root / "jobs" / "1" / "checkpoints").mkdir(parents=True)
    return root


def test_paths_inside_resolve(artifacts: Path) -> None:
    inside = artifacts / "jobs" / "1" / "checkpoints" / "step-5.safetensors"
    assert confine(inside, artifacts) == inside.resolve()
    assert confine("jobs/1/x", artifacts) == (artifacts / "jobs" / "1" / "x").resolve()
    # a `..` that stays inside, and a symlink whose target is inside, are fine
    assert confine(f"{artifacts}/jobs/1/../1/x", artifacts) == (artifacts / "jobs/1/x").resolve()
    (artifacts / "latest").symlink_to(artifacts / "jobs" / "1")
    assert confine(artifacts / "latest" / "x", artifacts) == (artifacts / "jobs/1/x").resolve()


@pytest.mark.parametrize(
    "recorded",
    [
        "/etc/passwd",
        "{root}/../outside.txt",
        "{root}/jobs/1/../../../outside.txt",
        "../../etc/passwd",
        "{root}-sibling/x",  # a name that only starts like the root
        "",
        "{root}/jobs/1/\x00",
    ],
)
def test_paths_that_lead_out_are_refused(artifacts: Path, recorded: str) -> None:
    with pytest.raises(UnsafePath, match="refused: the checkpoint's recorded path"):
        confine(recorded.format(root=artifacts), artifacts, what="checkpoint")


def test_a_symlink_out_is_refused(artifacts: Path, tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("keep out")
    link = artifacts / "jobs" / "1" / "checkpoints" / "step-9.safetensors"
    link.symlink_to(secret)
    (artifacts / "jobs" / "2").symlink_to(tmp_path, target_is_directory=True)
    for path in (link, artifacts / "jobs" / "2" / "secret.txt"):
        with pytest.raises(UnsafePath, match=f"outside the artifact directory \\(to {secret}\\)"):
            confine(path, artifacts)
    assert secret.read_text() == "keep out"
