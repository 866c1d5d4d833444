"""A worker's environment: read from this interpreter, this install and this checkout, carried
as one stream record, written to its run directory."""

from __future__ import annotations

import hashlib
import json
import platform
import subprocess
from importlib import metadata
from pathlib import Path

import torch

from contract.rundir import ENVIRONMENT
from contract.stream import EnvironmentRecord, decode_record, encode_record
from workers import environment
from workers.metrics import JsonlSink

ROOT = Path(__file__).resolve().parents[2]


def test_the_environment_is_this_process_s() -> None:
    found = environment.collect(group=1, rank=2)
    assert (found.group, found.rank) == (1, 2)
    assert found.python == platform.python_version()
    assert found.torch == torch.__version__
    # The CPU build of torch: no CUDA, and no cuDNN or NCCL read for a CPU process.
    assert (found.cuda, found.cudnn, found.nccl) == (torch.version.cuda or "", "", "")
    assert found.cpu_count > 0 and found.cpu_model and found.hostname
    assert found.devices and found.devices[0].startswith("cpu")
    assert found.trainyard_version == metadata.version("trainyard")
    packages = environment.installed_packages()
    assert f"torch=={metadata.version('torch')}" in found.packages
    assert list(found.packages) == packages and found.packages_total == len(packages)
    assert found.packages_hash == hashlib.sha256("\n".join(packages).encode()).hexdigest()


def test_the_commit_is_read_from_the_checkout_without_git(tmp_path: Path) -> None:
    head = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()
    assert environment.git_commit(ROOT) == head  # a checkout or a worktree of one
    assert environment.git_commit(tmp_path) == ""  # no git checkout: none
    detached = tmp_path / "detached"
    (detached / ".git").mkdir(parents=True)
    (detached / ".git" / "HEAD").write_text(f"{head}\n")
    assert environment.git_commit(detached) == head
    packed = tmp_path / "packed"
    (packed / ".git").mkdir(parents=True)
    (packed / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (packed / ".git" / "packed-refs").write_text(f"# pack-refs\n{head} refs/heads/main\n")
    assert environment.git_commit(packed) == head


def test_the_record_crosses_the_stream_and_lands_in_the_run_directory(tmp_path: Path) -> None:
    found = environment.collect()
    back = decode_record(encode_record(found))
    assert isinstance(back, EnvironmentRecord)
    assert back == found
    sink = JsonlSink(tmp_path)
    sink.emit(found)
    sink.close()
    written = json.loads((tmp_path / ENVIRONMENT).read_text())
    assert written["packages"] == list(found.packages)
    assert written["packages_hash"] == found.packages_hash
    assert written["devices"] == list(found.devices)
