"""`trainyard node` starts a node agent; `trainyard worker`, its name before, still does for one
release, saying it is deprecated (a "worker" is a training process only)."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from scheduler.cli.main import DEPRECATED_WORKER, app

NO_REDIS = "no Redis to connect to"


def env(tmp_path: Path) -> dict[str, str]:
    # No Redis configured: the agent's start stops at its first step, with its error.
    return {"TRAINYARD_DATA_DIR": str(tmp_path), "REDIS_URL": "", "TRAINYARD_REDIS_URL": ""}


def test_node_is_the_agents_command_and_worker_is_hidden() -> None:
    listed = CliRunner().invoke(app, ["--help"], env={"COLUMNS": "200"})
    assert listed.exit_code == 0, listed.output
    commands = {line.split()[1] for line in listed.output.splitlines() if line.startswith("│ ")}
    assert "node" in commands and "worker" not in commands
    helped = CliRunner().invoke(app, ["node", "--help"], env={"COLUMNS": "200"})
    assert helped.exit_code == 0 and "Start a node agent" in helped.output
    for option in ("--name", "--slots", "--gpus"):
        assert option in helped.output


def test_worker_still_starts_the_agent_and_says_it_is_deprecated(tmp_path: Path) -> None:
    node = CliRunner().invoke(app, ["node", "--slots", "1"], env=env(tmp_path))
    worker = CliRunner().invoke(app, ["worker", "--slots", "1"], env=env(tmp_path))
    assert NO_REDIS in node.output and DEPRECATED_WORKER not in node.output
    assert worker.stderr.startswith(DEPRECATED_WORKER), worker.stderr
    assert NO_REDIS in worker.output
    assert worker.exit_code == node.exit_code != 0
