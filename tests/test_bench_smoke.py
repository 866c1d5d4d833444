"""Every bench script runs with `--smoke` (bench/smoke.py: tiny sizes, the same code path), so
that none stops working unnoticed. A smoke run's figures mean nothing; only that it ran.

The quick ones run in every `make test`; those that start a service, a cluster or several
training processes are marked slow and run three at a time (most of their time is waiting on
their own services), each test reading its own script's outcome. submit_latency measures on the
session's shared stack; bench/data_stream.py's smoke run is tests/workers/test_shards.py's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.conftest import RunningStack

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
# The scripts with a main that are not benchmarks (the local clusters' per-process launcher is
# harness/local_cluster.py, not here).
NOT_BENCHES: set[str] = set()
QUICK = ["ingest", "overhead"]
# Longest first (as timed on this machine), so that three at a time end together.
SLOW = [
    "time_to_accuracy",
    "pipeline",
    "selection_bias",
    "sweep_samples",
    "predict_cluster",
    "faults",
    "sweep",
    "load",
    "data_stream_stack",
    "allreduce_vs_ddp",
    "api_load",
    "ps_throughput",
    "ps_overlap",
    "predict",
    "example_throughput",
    "transformer",
]
AT_ONCE = 3
# The scripts whose smoke runs start many runs of several processes each (every case their
# docstrings name): 4-7 minutes at load average 5-8 here, so more than the tests' 600 s.
LONG_SMOKES = {"time_to_accuracy": 1500.0, "pipeline": 1500.0}
# What a smoke run's output must name: every case its script's docstring says --smoke runs.
NAMED = {
    "pipeline": [
        *('"gpipe"', '"1f1b"', '"interleaved_1f1b_v2"', '"zero_bubble"', '"zero_bubble_v2"'),
        *('"zbv"', '"kept"', '"rematerialized"'),
    ],
    "time_to_accuracy": [
        f"| {case} |"
        for case in (
            *("local", "sandblaster", "allreduce", "allreduce-powersgd", "localsgd-32-delay-4"),
            *("downpour", "hogwild"),
        )
    ],
    "api_load": ["GET /jobs ", "POST /jobs/validate ", "GET /cluster ", "/healthz beside it"],
}


# The slow scripts start from a thread pool. CPython's subprocess starts a child with vfork,
# which shares the parent's memory until exec: one start at a time, each with its own copy of
# the environment (a full run saw exec fail with EFAULT, "Bad address", while three started).
_STARTING = threading.Lock()


def run_smoke(script: str, *extra: str, timeout: float = 600.0) -> str:
    with _STARTING:
        process = subprocess.Popen(
            [sys.executable, str(BENCH / f"{script}.py"), "--smoke", *extra],
            cwd=ROOT,
            env=dict(os.environ),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
        raise
    assert process.returncode == 0, (
        f"{script} --smoke exited {process.returncode}:\n{stdout}\n{stderr}"
    )
    return stdout


def test_every_bench_script_has_a_smoke_run_here() -> None:
    scripts = {
        path.stem
        for path in BENCH.glob("*.py")
        if 'if __name__ == "__main__":' in path.read_text() and path.name not in NOT_BENCHES
    }
    covered = {*QUICK, *SLOW, "submit_latency", "sweep_replay", "data_stream"}
    assert scripts == covered
    # sweep passes --smoke on to its parts; data_stream's own --smoke picks its sizes.
    for script in scripts - {"sweep", "data_stream"}:
        assert "smoke.parse(" in (BENCH / f"{script}.py").read_text(), script


@pytest.mark.parametrize("script", QUICK)
def test_quick_bench_smoke(script: str) -> None:
    run_smoke(script)


@pytest.fixture(scope="module")
def slow_smokes(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Future[str]]]:
    """The smoke runs of the slow scripts whose tests were selected (`-k sweep` runs only the
    sweep scripts'), started together, AT_ONCE at a time."""
    extra = {
        "time_to_accuracy": ("--plot", str(tmp_path_factory.mktemp("tta") / "tta.png")),
        "sweep": ("--no-ray",),
    }
    selected = {
        item.callspec.params["script"]
        for item in request.session.items
        if isinstance(item, pytest.Function) and item.originalname == "test_bench_smoke"
    }
    with ThreadPoolExecutor(max_workers=AT_ONCE) as pool:
        yield {
            script: pool.submit(
                run_smoke,
                script,
                *extra.get(script, ()),
                timeout=LONG_SMOKES.get(script, 600.0),
            )
            for script in SLOW
            if script in selected
        }


@pytest.mark.slow
@pytest.mark.parametrize(
    "script",
    [
        pytest.param(script, marks=pytest.mark.timeout(LONG_SMOKES[script] + 60))
        if script in LONG_SMOKES
        else script
        for script in SLOW
    ],
)
def test_bench_smoke(script: str, slow_smokes: dict[str, Future[str]]) -> None:
    out = slow_smokes[script].result()
    missing = [name for name in NAMED.get(script, []) if name not in out]
    assert not missing, f"{script} --smoke did not run {missing}:\n{out}"


def test_submit_latency_smoke_on_the_shared_stack(stack: RunningStack) -> None:
    out = run_smoke("submit_latency", "--data-dir", str(stack.data_dir))
    assert "POST answered after" in out and "started directly" in out


def test_sweep_replay_smoke(tmp_path: Path) -> None:
    """Recorded curves of two seeds, two trials each (bench/sweep_samples.py --json's form)."""
    curves = {
        str(seed): {
            str(trial): [[step, 0.1 * trial + step / 1000] for step in (100, 200, 300)]
            for trial in range(2)
        }
        for seed in range(2)
    }
    samples = tmp_path / "samples.json"
    samples.write_text(json.dumps({"curves": curves}))
    assert "| 100 | 2 |" in run_smoke("sweep_replay", str(samples))
