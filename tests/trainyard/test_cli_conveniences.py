"""The CLI's conveniences against the session's real stack: --version, --json on stdout alone,
submit -q, jobs --state repeated, logs --tail/--grep/--follow (the live stream), metrics with a
did-you-mean, cancel and delete, tokens, and named server profiles."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.trainyard.test_cli_client import DIGITS, HELD_OUT, run
from trainyard import Client, NotFound, __version__

if TYPE_CHECKING:
    from conftest import RunningStack

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
# Stops early after a hundred-odd steps: its log holds the worker's first line, a training line
# for each report (every 20 steps) and validation, the line saying it stopped and the final
# test's line.
QUICK = HELD_OUT
STOPPED = r"^stopped early at step (\d+)"
REPORT = r"^step (\d+): loss \d+\.\d{4}  acc \d\.\d{3}  lr [\d.e-]+  samples/s [\d,]+$"
VALIDATION = r"^step (\d+): val accuracy \d\.\d{4}  val loss \d+\.\d{4}$"
FINAL_TEST = r"^step (\d+): test accuracy \d\.\d{4}  test loss \d+\.\d{4}$"
# Long enough to be caught running.
LONG = ["--set", "train_steps=1000000", "--set", "disp_freq=100"]


def as_json(stack: RunningStack, *args: str, **env: str | None) -> object:
    """The one JSON document a --json command prints (stdout holds nothing else)."""
    result = run(stack, *args, "--json", **env)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


@pytest.fixture(scope="module")
def finished(stack: RunningStack) -> int:
    """A short job, submitted with -q (stdout: its id alone), waited for."""
    result = run(stack, "submit", DIGITS, *QUICK, "-q")
    assert result.exit_code == 0, result.output
    assert re.fullmatch(r"\d+\n", result.stdout), result.stdout
    job_id = int(result.stdout)
    with Client(stack.url, stack.token) as client:
        assert client.job(job_id).wait(timeout=120, poll=0.3).state == "SUCCEEDED"
    return job_id


def test_version() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "scheduler", "--version"], capture_output=True, text=True, cwd=ROOT
    )
    assert done.returncode == 0 and done.stdout == f"trainyard {__version__}\n"


def test_json_outputs(stack: RunningStack, finished: int, tmp_path: Path) -> None:
    shown = as_json(stack, "show", str(finished))
    assert isinstance(shown, dict) and shown["state"] == "SUCCEEDED"
    latest = as_json(stack, "metrics", str(finished))
    assert isinstance(latest, dict) and set(latest) >= {"train/loss", "test/accuracy"}
    points = as_json(stack, "metrics", str(finished), "--name", "train/loss")
    assert isinstance(points, dict)
    assert [p[0] for p in points["train/loss"]][:3] == [20, 40, 60]
    local = as_json(stack, "validate", DIGITS)
    assert isinstance(local, dict) and local["name"] == "digits-mlp" and local["total_params"] > 0
    remote = as_json(stack, "validate", DIGITS, "--server")
    assert isinstance(remote, dict) and remote["placement"]["feasible"] is True
    assert remote["total_params"] == local["total_params"]
    submitted = as_json(stack, "submit", DIGITS, *QUICK, "--set", "name=json-submit")
    assert isinstance(submitted, dict) and submitted["name"] == "json-submit"
    with Client(stack.url, stack.token) as client:
        client.job(submitted["id"]).wait(timeout=120, poll=0.3)
    listed = as_json(stack, "jobs", "--state", "succeeded", "--state", "failed")
    assert isinstance(listed, list) and {finished, submitted["id"]} <= {j["id"] for j in listed}
    assert {j["state"] for j in listed} <= {"SUCCEEDED", "FAILED"}
    none = as_json(stack, "jobs", "--state", "queued", "--state", "cancelled", "--name", "json-")
    assert none == []


def test_an_unknown_metric_name_says_what_was_meant(stack: RunningStack, finished: int) -> None:
    wrong = run(stack, "metrics", str(finished), "--name", "train/los")
    assert wrong.exit_code == 1
    assert "has no metric 'train/los'; did you mean 'train/loss'?" in wrong.stderr
    with (
        Client(stack.url, stack.token) as client,
        pytest.raises(NotFound, match="did you mean 'test/accuracy'"),
    ):
        client.job(finished).metrics("test/acuracy")


def steps_of(pattern: str, lines: list[str]) -> list[int]:
    return [int(found.group(1)) for line in lines if (found := re.match(pattern, line))]


def test_logs_tail_grep_and_json(stack: RunningStack, finished: int) -> None:
    every = run(stack, "logs", str(finished)).stdout.splitlines()
    assert len(every) >= 2 and every[0].startswith("worker 0/0: ")
    # the training lines `submit --follow` shows, one per report and evaluation, in order
    stopped = steps_of(STOPPED, every[-2:-1])
    assert stopped and steps_of(FINAL_TEST, every[-1:]) == stopped, every
    reports = steps_of(REPORT, every)
    assert reports == list(range(20, stopped[0] + 1, 20)), every
    assert steps_of(VALIDATION, every) == reports
    assert len(every) == 1 + 2 * len(reports) + 2, every
    timed = as_json(stack, "logs", str(finished))
    assert isinstance(timed, list) and [line["line"] for line in timed] == every
    times = [line["at"] for line in timed]
    shown = as_json(stack, "show", str(finished))
    assert isinstance(shown, dict) and times == sorted(times)
    started, ended = (
        datetime.fromisoformat(shown[key]).timestamp() for key in ("started_at", "ended_at")
    )
    assert started - 5 <= times[0] and times[-1] <= ended + 5, (started, times, ended)
    stamped = run(stack, "logs", str(finished), "--timestamps").stdout.splitlines()
    assert [line.split("  ", 1)[1] for line in stamped] == every
    assert [datetime.fromisoformat(line.split("  ", 1)[0]).timestamp() for line in stamped] == [
        pytest.approx(at, abs=1e-3) for at in times
    ]
    assert run(stack, "logs", str(finished), "--tail", "1").stdout.splitlines() == every[-1:]
    assert run(stack, "logs", str(finished), "--tail", "0").stdout == ""
    grepped = run(stack, "logs", str(finished), "--grep", "^worker").stdout.splitlines()
    assert grepped == [line for line in every if line.startswith("worker")] == every[:1]
    both = run(stack, "logs", str(finished), "--grep", "step", "--tail", "1")
    assert both.stdout.splitlines() == every[-1:]
    lines = as_json(stack, "logs", str(finished), "--tail", "2")
    assert isinstance(lines, list) and [line["line"] for line in lines] == every[-2:]
    bad = run(stack, "logs", str(finished), "--grep", "(")
    assert bad.exit_code == 2 and "--grep" in bad.stderr


def test_logs_follow_the_live_stream_until_the_job_ends(stack: RunningStack) -> None:
    job_id = int(run(stack, "submit", DIGITS, *QUICK, "-q").stdout)
    follower = subprocess.run(
        [sys.executable, "-m", "scheduler", "logs", str(job_id), "--follow"],
        cwd=ROOT,
        env=stack.env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert follower.returncode == 0, follower.stderr
    lines = follower.stdout.splitlines()
    assert lines[0].startswith("worker 0/0: ") and re.match(STOPPED, lines[-2]), lines
    assert re.match(FINAL_TEST, lines[-1]) and re.match(REPORT, lines[1]), lines
    assert lines == run(stack, "logs", str(job_id)).stdout.splitlines()  # each line once
    with Client(stack.url, stack.token) as client:
        job = client.job(job_id)
        assert job.done  # --follow returned when the stream said it ended
        tail = [line.line for line in job.follow_logs(tail=1, grep="step")]
        assert tail == lines[-1:]


def test_delete_refuses_a_running_job_unless_cancelled(stack: RunningStack) -> None:
    job_id = int(run(stack, "submit", DIGITS, *LONG, "--set", "name=delete-me", "-q").stdout)
    try:
        refused = run(stack, "delete", str(job_id))
        assert refused.exit_code == 1 and "cancel it first, or pass --cancel" in refused.stderr
        shown = as_json(stack, "show", str(job_id))
        assert isinstance(shown, dict) and shown["state"] in {"QUEUED", "SCHEDULED", "RUNNING"}
        cancelled = as_json(stack, "cancel", str(job_id))
        assert isinstance(cancelled, dict) and cancelled["id"] == job_id
        deleted = as_json(stack, "delete", str(job_id), "--cancel")
        assert deleted == {
            "id": job_id,
            "state": "CANCELLED",
            "checkpoints_freed": 0,
            "bytes_freed": 0,
        }
        gone = run(stack, "show", str(job_id))
        assert gone.exit_code == 1 and "404" in gone.stderr
    finally:  # never left holding the node's slots for the tests after this one
        run(stack, "cancel", str(job_id))


def test_tokens_and_profiles(stack: RunningStack, tmp_path: Path) -> None:
    created = as_json(stack, "tokens", "create", "ci", "--expires-in-days", "1")
    assert isinstance(created, dict) and created["name"] == "ci" and created["expires_at"]
    listed = as_json(stack, "tokens", "list")
    assert isinstance(listed, list) and created["id"] in {t["id"] for t in listed}
    assert all("token" not in t for t in listed)  # never a secret
    secret_only = run(stack, "tokens", "create", "plain")
    assert secret_only.exit_code == 0 and len(secret_only.stdout.strip()) >= 32
    home = {"TRAINYARD_DATA_DIR": str(tmp_path)}
    login = run(stack, "login", stack.url, "--token", created["token"], "--profile", "lab", **home)
    assert login.exit_code == 0, login.output
    through_lab = as_json(stack, "--profile", "lab", "tokens", "list", **home)
    assert isinstance(through_lab, list) and created["id"] in {t["id"] for t in through_lab}
    by_env = run(stack, "jobs", "--json", TRAINYARD_PROFILE="lab", **home)
    assert by_env.exit_code == 0 and isinstance(json.loads(by_env.stdout), list)
    typo = run(stack, "--profile", "lba", "jobs", **home)
    assert typo.exit_code == 1 and "did you mean 'lab'?" in typo.stderr
    revoked = run(stack, "tokens", "revoke", str(created["id"]))
    assert revoked.exit_code == 0, revoked.output
    refused = run(stack, "--profile", "lab", "jobs", **home)
    assert refused.exit_code == 1 and "401" in refused.stderr
