"""bench/gpu_check.sh --dry-run: the whole GPU check on CPU, every CUDA step skipped, quickly;
and the wheel list the GPU machines install from is one this environment can pin."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GPU_STEPS = [
    "gpu-tests",
    "overhead-fp32",
    "overhead-bf16",
    "overhead-compiled",
    "submit-to-first-step-gpu",
    "mnist1d-cnn",
    "char-gpt",
    "transformer",
]
CORE_STEPS = {"time-to-accuracy-scale": 9, "ps-throughput-pinned": 5}


def test_the_dry_run_skips_every_cuda_step_and_writes_the_report(tmp_path: Path) -> None:
    env = {**os.environ, "OUT": str(tmp_path), "PYTHON": sys.executable}
    found = subprocess.run(
        ["bash", "bench/gpu_check.sh", "--dry-run"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert found.returncode == 0, found.stdout + found.stderr
    report = (tmp_path / "gpu-check.md").read_text()
    assert report.startswith("### GPU check, ")
    assert "- GPU: none (a dry run on CPU)" in report and "- torch " in report
    rows = {
        line.split(" | ")[0].lstrip("| "): line
        for line in report.splitlines()
        if line.startswith("| ")
    }
    for name in GPU_STEPS:
        assert "skipped: no GPU" in rows[name], name
    cores = len(os.sched_getaffinity(0))
    for name, needs in CORE_STEPS.items():
        if cores < needs:
            assert f"skipped: needs {needs} cores" in rows[name]


def test_the_gpu_wheel_list_pins_to_what_is_installed_here() -> None:
    found = subprocess.run(
        [sys.executable, "scripts/gpu_wheel_pins.py", "bench/gpu_wheels.txt"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert found.returncode == 0, found.stderr
    pins = found.stdout.split()
    assert "pydantic==" in " ".join(pins) and all("==" in pin for pin in pins)


# What the GPU machines' image already has (bench/gpu_wheels.txt's header), and what the GPU
# check never imports (it runs its stacks on SQLite).
ON_THE_IMAGE = {
    "torch",
    "numpy",
    "pyarrow",
    "pyyaml",
    "safetensors",
    "scikit-learn",
    "typer",
    "rich",
    "httpx",
    "psutil",
    "tensorboard",
}
NOT_IMPORTED_THERE = {"psycopg"}


def test_every_dependency_is_on_the_gpu_image_or_in_the_wheel_list() -> None:
    """Preparing the first GPU run found the SDK's httpx-retries and httpx-sse not listed."""
    import re
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    needed = {
        re.split(r"[\[<>=!~; ]", dep, maxsplit=1)[0].lower() for dep in project["dependencies"]
    }
    listed = {
        line.split("#", 1)[0].strip().lower()
        for line in (ROOT / "bench" / "gpu_wheels.txt").read_text().splitlines()
    }
    missing = needed - listed - ON_THE_IMAGE - NOT_IMPORTED_THERE
    assert not missing, f"add to bench/gpu_wheels.txt: {sorted(missing)}"
