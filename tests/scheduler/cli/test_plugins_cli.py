"""Plugins as the processes of the platform load them: the example plugin's distribution
installed (pip, into a folder on PYTHONPATH) and found by its entry point; a plugin that fails
stops the command with its name and error."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import clean_env

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[3]
FIXTURE = ROOT / "tests" / "fixtures" / "plugin_dist"

JOB = """\
name: plugin-job
data: {source: synthetic, task: classification, num_samples: 64, num_features: 8, batch_size: 8}
neuralnet:
  layers:
    - {name: data, type: input}
    - {name: fc, type: dense, srclayers: [data], units: 16}
    - {name: norm, type: rmsnorm, srclayers: [fc], eps: 0.0001}
    - {name: out, type: dense, srclayers: [norm]}
    - {name: loss, type: softmax_loss, srclayers: [out]}
updater: {type: signsgd, lr: {base: 0.01}}
train_steps: 3
"""


def trainyard(*args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "scheduler", *args],
        cwd=cwd,
        env=clean_env(**{"PYTHONPATH": str(ROOT), **env}),
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The fixture distribution installed by pip into a folder of its own (its dist-info
    holds the entry point); built from a copy, so the source tree stays clean."""
    where = tmp_path_factory.mktemp("plugin")
    source = shutil.copytree(FIXTURE, where / "source")
    target = where / "site"
    subprocess.run(
        [
            *(sys.executable, "-m", "pip", "install", "--quiet", "--no-deps"),
            *("--no-build-isolation", "--target", str(target), str(source)),
        ],
        check=True,
        timeout=120,
    )
    assert (target / "trainyard_rmsnorm-1.2.dist-info" / "entry_points.txt").is_file()
    return target


def test_an_installed_plugin_is_found_by_its_entry_point(installed: Path, tmp_path: Path) -> None:
    (tmp_path / "job.yaml").write_text(JOB)
    done = trainyard("train", "job.yaml", "--json", cwd=tmp_path, PYTHONPATH=f"{ROOT}:{installed}")
    assert done.returncode == 0, done.stderr
    assert '"status": "succeeded"' in done.stdout


def test_a_failing_plugin_stops_the_command(tmp_path: Path) -> None:
    (tmp_path / "broken.py").write_text("raise RuntimeError('no licence key')\n")
    (tmp_path / "job.yaml").write_text(JOB)
    done = trainyard("validate", "job.yaml", cwd=tmp_path, TRAINYARD_PLUGINS="broken.py")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1] == (
        f"error: plugin broken ({tmp_path / 'broken.py'}) failed to load: "
        "RuntimeError: no licence key"
    )
