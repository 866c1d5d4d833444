"""A worker process confines itself first thing (workers/confine.py), in real processes: its
GPUs in CUDA_VISIBLE_DEVICES, its memory limit by RLIMIT_DATA where no cgroup was made for it;
and the fork server, which forks every worker, never starts CUDA."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def run(code: str, *, prelude: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", prelude + textwrap.dedent(code)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


INFO = """
from pathlib import Path
from contract.allocation import AllocationInfo
def info(**fields):
    base = dict(allocation_id=1, job_id=1, role="worker", group=0, rank=0, world=1, slots=1,
                gpus=0, node="n", framework="local", topology={}, spec={}, run_dir=Path("."))
    return AllocationInfo(**{**base, **fields})
"""


def test_without_a_cgroup_an_allocation_past_the_limit_fails_in_the_worker_alone() -> None:
    done = run(
        """
        import os
        from workers.confine import confine, out_of_memory
        print(confine(info(memory_mb=200), ""))
        small = bytearray(50 * 2**20)  # within the limit
        try:
            big = bytearray(400 * 2**20)
        except MemoryError as exc:
            print("refused", out_of_memory(exc))
        """,
        prelude=INFO,
    )
    assert done.returncode == 0, done.stderr
    said, refused = done.stdout.splitlines()
    assert said == "CUDA_VISIBLE_DEVICES=; memory limit 200 MB (RLIMIT_DATA)"
    assert refused == "refused True"


def test_a_worker_sees_only_its_gpus_and_a_job_without_gpus_sees_none() -> None:
    done = run(
        """
        import os
        from workers.confine import confine
        os.environ["CUDA_VISIBLE_DEVICES"] = "4,5,6,7"  # the operator gave the agent these
        print(confine(info(gpus=2, devices=(1, 3)), ""))
        print(os.environ["CUDA_VISIBLE_DEVICES"])
        confine(info(), "")
        print(repr(os.environ["CUDA_VISIBLE_DEVICES"]))
        """,
        prelude=INFO,
    )
    assert done.returncode == 0, done.stderr
    said, gpus, none = done.stdout.splitlines()
    assert said.startswith("CUDA_VISIBLE_DEVICES=5,7; no memory limit")
    assert (gpus, none) == ("5,7", "''")


@pytest.mark.slow  # a fork server and its children
def test_the_fork_server_never_starts_cuda() -> None:
    # torch.cuda._lazy_init is the one way CUDA starts in torch: record any call to it while
    # the fork server warms up (on a machine without GPUs it would raise; with one it would
    # start a context no forked process could use).
    done = run(
        """
        import torch, torch.cuda
        calls = []
        real = torch.cuda._lazy_init
        torch.cuda._lazy_init = lambda: calls.append("init") or real()
        from workers.entry import _no_cuda_yet, warm_up
        warm_up()
        _no_cuda_yet()
        print(calls, torch.cuda.is_initialized())
        """
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[] False"
