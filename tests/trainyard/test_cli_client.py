"""The client commands of the CLI against the session's real stack."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from typer.testing import CliRunner, Result

from scheduler.cli.main import app
from scheduler.cli.redis_server import free_port

if TYPE_CHECKING:
    from conftest import RunningStack

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
DIGITS = str(ROOT / "examples" / "digits_mlp.yaml")
QUICK = [
    *("--set", "train_steps=40", "--set", "disp_freq=10"),
    *("--set", "checkpoint.freq=20", "--set", "checkpoint.keep=3"),
]


def run(stack: RunningStack, *args: str, **env: str | None) -> Result:
    """One `trainyard ...` command whose Settings find `stack` through its data directory."""
    environment: dict[str, str | None] = {
        "TRAINYARD_DATA_DIR": str(stack.data_dir),
        "TRAINYARD_URL": None,
        "TRAINYARD_TOKEN": None,
        "DATABASE_URL": None,
        "COLUMNS": "200",
        **env,
    }
    return CliRunner().invoke(app, list(args), env=environment)


def submitted_id(result: Result) -> int:
    found = re.search(r"submitted job (\d+)", result.stdout)
    assert found, result.output
    return int(found.group(1))


@pytest.fixture(scope="module")
def followed(stack: RunningStack) -> int:
    result = run(stack, "submit", DIGITS, *QUICK, "--follow")
    assert result.exit_code == 0, result.output
    assert "SUCCEEDED" in result.stdout
    return submitted_id(result)


def test_jobs_and_show(stack: RunningStack, followed: int) -> None:
    listed = run(stack, "jobs", "--json")
    assert listed.exit_code == 0, listed.output
    assert followed in {job["id"] for job in json.loads(listed.stdout)}
    table = run(stack, "jobs", "--state", "succeeded")
    assert table.exit_code == 0 and "digits-mlp" in table.stdout
    shown = run(stack, "show", str(followed))
    assert shown.exit_code == 0, shown.output
    assert "SUCCEEDED" in shown.stdout and "step 40/40" in shown.stdout
    assert "RUNNING" in shown.stdout  # the state history
    as_json = json.loads(run(stack, "show", str(followed), "--json").stdout)
    assert as_json["state"] == "SUCCEEDED"
    assert [e["state"] for e in as_json["events"]][-1] == "SUCCEEDED"


def test_metrics(stack: RunningStack, followed: int) -> None:
    names = run(stack, "metrics", str(followed))
    assert names.exit_code == 0, names.output
    assert "train/loss" in names.stdout and "test/accuracy" in names.stdout
    points = run(stack, "metrics", str(followed), "--name", "train/loss")
    assert points.exit_code == 0, points.output
    steps = re.findall(r"^\s*│?\s*(\d+)\s*│", points.stdout, flags=re.MULTILINE)
    assert [int(s) for s in steps] == [10, 20, 30, 40]


def test_download(stack: RunningStack, followed: int, tmp_path: Path) -> None:
    result = run(stack, "download", str(followed), "--output", str(tmp_path))
    assert result.exit_code == 0, result.output
    assert (tmp_path / "step-00000040.safetensors").stat().st_size > 0
    early = run(stack, "download", str(followed), "--step", "20", "--output", str(tmp_path))
    assert early.exit_code == 0, early.output
    assert (tmp_path / "step-00000020.safetensors").exists()


# Validated every 20 steps on a fifth of the training samples; it learns for 60 steps, then
# (its rate 1e-9) stands still, and stops early 3 validations after its last improvement.
HELD_OUT = [
    *("--set", "train_steps=600", "--set", "disp_freq=20"),
    *("--set", "data.validation_fraction=0.2", "--set", "validate.freq=20"),
    *("--set", "early_stop.patience=3", "--set", "checkpoint.keep_best=true"),
    *("--set", "updater.lr={base: 0.05, schedule: fixed_step, steps: [60], values: [1.0e-9]}"),
]


def test_a_job_selected_on_validation_stops_early_and_keeps_its_best(
    stack: RunningStack, tmp_path: Path
) -> None:
    result = run(stack, "submit", DIGITS, *HELD_OUT, "--follow")
    assert result.exit_code == 0, result.output
    job_id = submitted_id(result)
    shown = json.loads(run(stack, "show", str(job_id), "--json").stdout)
    assert shown["state"] == "SUCCEEDED" and shown["step"] < 600
    assert (shown["objective"], shown["objective_mode"]) == ("val/accuracy", "max")
    best_step, best = shown["best_step"], shown["best_metric"]
    assert best == shown["summary"]["val/accuracy"] and best_step < shown["step"]
    [stopped] = [e["reason"] for e in shown["events"] if e["reason"].startswith("stopped early")]
    assert stopped.startswith(f"stopped early at step {shown['step']}: val/accuracy has not")
    assert stopped.endswith(f"(best {best:.4g} at step {best_step})")
    table = run(stack, "jobs")
    assert f"val/accuracy {best:.4f} @{best_step}" in table.stdout, table.stdout
    fetched = run(stack, "download", str(job_id), "--best", "--output", str(tmp_path))
    assert fetched.exit_code == 0, fetched.output
    assert (tmp_path / f"step-{best_step:08d}.safetensors").stat().st_size > 0
    none = run(stack, "download", str(job_id), "--best", "--step", "20")
    assert none.exit_code == 2 and "not both" in none.stderr


def test_failed_job_and_its_logs(stack: RunningStack) -> None:
    # No restart: tests/trainyard/test_client.py follows a failing job through one.
    result = run(
        stack,
        "submit",
        DIGITS,
        *QUICK,
        *("--set", "updater.lr.base=1e38", "--set", "cluster.max_restarts=0"),
        "--follow",
    )
    assert result.exit_code == 1
    assert "FAILED" in result.stdout
    logs = run(stack, "logs", str(submitted_id(result)), "-f")
    assert logs.exit_code == 0, logs.output
    assert "training diverged" in logs.stdout


def test_cancel(stack: RunningStack) -> None:
    submitted = run(stack, "submit", DIGITS, "--set", "train_steps=10000000", "--priority", "1")
    assert submitted.exit_code == 0, submitted.output
    job_id = submitted_id(submitted)
    cancelled = run(stack, "cancel", str(job_id))
    assert cancelled.exit_code == 0, cancelled.output
    assert f"job {job_id}:" in cancelled.stdout
    state = ""
    for _ in range(150):
        state = json.loads(run(stack, "show", str(job_id), "--json").stdout)["state"]
        if state == "CANCELLED":
            break
        time.sleep(0.1)
    assert state == "CANCELLED"
    again = run(stack, "cancel", str(job_id))
    assert again.exit_code == 1
    assert "409" in again.stderr


def test_rejected_job_prints_located_errors(stack: RunningStack, tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(Path(DIGITS).read_text().replace("units: 128", "units: many"))
    result = run(stack, "submit", str(bad))
    assert result.exit_code == 1
    assert re.search(rf"{re.escape(str(bad))}:\d+:\d+: .*units", result.stderr), result.stderr
    unknown_key = run(stack, "submit", DIGITS, "--set", "train_stepz=3")
    assert unknown_key.exit_code == 1
    assert "train_stepz" in unknown_key.stderr


def test_errors_exit_nonzero_with_a_message(stack: RunningStack) -> None:
    missing = run(stack, "show", "987654")
    assert missing.exit_code == 1 and "404" in missing.stderr
    nowhere = run(stack, "jobs", TRAINYARD_URL=f"http://127.0.0.1:{free_port()}")
    assert nowhere.exit_code == 2 and "cannot reach" in nowhere.stderr


def test_admin_user_and_isolation(stack: RunningStack, followed: int) -> None:
    created = run(stack, "admin", "create-user", "bob")
    assert created.exit_code == 0, created.output
    token = created.stdout.strip().splitlines()[-1]
    assert len(token) >= 32
    twice = run(stack, "admin", "create-user", "bob")
    assert twice.exit_code == 1 and "already exists" in twice.stderr
    as_bob = {"TRAINYARD_URL": stack.url, "TRAINYARD_TOKEN": token}
    assert json.loads(run(stack, "jobs", "--json", **as_bob).stdout) == []
    hidden = run(stack, "show", str(followed), **as_bob)
    assert hidden.exit_code == 1 and "404" in hidden.stderr


def test_login(stack: RunningStack, tmp_path: Path) -> None:
    home = {"TRAINYARD_DATA_DIR": str(tmp_path)}
    refused = run(stack, "login", stack.url, "--token", "wrong", **home)
    assert refused.exit_code == 1 and "401" in refused.stderr
    assert not (tmp_path / "client.json").exists()
    accepted = run(stack, "login", stack.url, "--token", stack.token, **home)
    assert accepted.exit_code == 0, accepted.output
    saved = json.loads((tmp_path / "client.json").read_text())
    assert saved == {"url": stack.url, "token": stack.token}
    assert (tmp_path / "client.json").stat().st_mode & 0o777 == 0o600
    # The login file alone (no stack file in this data directory) now finds the server.
    listed = run(stack, "jobs", "--json", **home)
    assert listed.exit_code == 0, listed.output


def test_validate_on_the_server_shows_topology_and_placement(
    stack: RunningStack, tmp_path: Path
) -> None:
    allreduce = str(ROOT / "examples" / "mnist1d_allreduce.yaml")
    result = run(stack, "validate", "--server", allreduce)
    assert result.exit_code == 0, result.output
    assert "mnist1d-allreduce: 13 layers" in result.stdout
    assert "total parameters: 102,090" in result.stdout
    assert "memory per worker: about" in result.stdout
    assert (
        "topology: allreduce: 1 worker group(s) x 2 worker(s); 2 process(es), 2 slot(s), 0 GPU(s)"
        in result.stdout
    )
    placed = re.findall(r"(worker \d/\d)\s+│\s+\S+\s+│\s+1\s+│\s+0", result.stdout)
    assert placed == ["worker 0/0", "worker 0/1"], result.stdout
    assert "placement: fits now" in result.stdout
    pipelined = run(
        stack,
        "validate",
        "--server",
        DIGITS,
        "--set",
        "pipeline.stages=3",
        "--set",
        "pipeline.microbatches=8",
    )
    assert pipelined.exit_code == 0, pipelined.output
    assert "pipeline: 3 stages x 8 micro-batches, 1f1b (estimated costs)" in pipelined.stdout
    assert re.search(r"│\s+1 │ fc2\s+│\s+32,896 │", pipelined.stdout), pipelined.stdout
    assert "bubble: 20.0%   ideal speed-up: 2.40x" in pipelined.stdout
    profiled = run(stack, "validate", "--server", "--profile", DIGITS)
    assert profiled.exit_code == 2 and "--profile measures here" in profiled.stderr
    # The stack's node has 2 slots: a downpour job (2 workers and a shard) can never run there.
    downpour = str(ROOT / "examples" / "mnist1d_downpour.yaml")
    waits = run(stack, "validate", "--server", downpour)
    assert waits.exit_code == 0, waits.output
    assert "1 server group(s) x 1 shard(s) (own processes); 3 process(es), 3 slot(s)" in (
        waits.stdout
    )
    assert (
        "placement: can never run on this cluster: needs 2 worker(s) + 1 server shard(s): "
        "3 slot(s); it has 1 node(s), 2 slot(s)"
    ) in waits.stdout
    bad = tmp_path / "bad.yaml"
    bad.write_text(Path(DIGITS).read_text().replace("units: 128", "units: many"))
    rejected = run(stack, "validate", "--server", str(bad))
    assert rejected.exit_code == 1
    assert re.search(rf"{re.escape(str(bad))}:\d+:\d+: .*units", rejected.stderr)
