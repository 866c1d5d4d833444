"""`trainyard up`: starts everything, answers /healthz, and leaves no process behind."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import psutil
import pytest
import redis

from contract.keys import ROLES, Keys
from scheduler.cli.stack import HEALTH_PATH, read_stack_file
from trainyard import Client

if TYPE_CHECKING:
    from conftest import RunningStack

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[3]


def descendants(pid: int) -> list[psutil.Process]:
    return psutil.Process(pid).children(recursive=True)


def child_named(stack: RunningStack, word: str) -> psutil.Process:
    """The child `python -m scheduler <word> ...` (every child's command names `scheduler`)."""
    for process in psutil.Process(stack.process.pid).children():
        if process.cmdline()[3:4] == [word]:
            return process
    raise AssertionError(f"no {word} child of trainyard up")


def assert_all_gone(pids: list[int], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    alive = pids
    while time.monotonic() < deadline:
        alive = [
            pid
            for pid in pids
            if psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        ]
        if not alive:
            return
        time.sleep(0.1)
    raise AssertionError(f"orphans left running: {[psutil.Process(p).cmdline() for p in alive]}")


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One data directory for both tests: the second restarts the first one's stack."""
    return tmp_path_factory.mktemp("up") / "data"


def test_up_serves_and_stops_every_process(
    stack_factory: Callable[..., RunningStack], data_dir: Path
) -> None:
    stack = stack_factory(data_dir=data_dir)
    health = httpx.get(stack.url + HEALTH_PATH, timeout=5).json()
    assert (health["status"], health["db"], health["redis"]) == ("ok", True, True)
    assert health["scheduler"]["alive"] and health["ingest"]["alive"]
    stack_file = data_dir / "stack.json"
    assert stack_file.stat().st_mode & 0o777 == 0o600
    found = read_stack_file(stack_file)
    # The embedded Redis has a generated password, kept private beside the admin token.
    password_file = data_dir / "redis.password"
    assert password_file.stat().st_mode & 0o777 == 0o600
    password = password_file.read_text().strip()
    assert found is not None and found.redis_url.startswith(f"redis://:{password}@127.0.0.1:")
    bare = "redis://" + found.redis_url.split("@", 1)[1]
    with redis.Redis.from_url(bare) as anonymous, pytest.raises(redis.AuthenticationError):
        anonymous.get("anything")
    for name in ("api", "scheduler", "node"):
        assert (data_dir / "logs" / f"{name}.log").exists()

    # A second stack on the same data directory refuses to start.
    second = subprocess.run(
        [sys.executable, "-m", "scheduler", "up", "--port", "1", "--data-dir", str(data_dir)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert second.returncode == 1
    assert "already running" in second.stdout + second.stderr
    # Nor does one on another data directory but the same port.
    port = stack.url.rsplit(":", 1)[1]
    third = subprocess.run(
        [
            sys.executable,
            "-m",
            "scheduler",
            "up",
            "--port",
            port,
            "--data-dir",
            str(data_dir) + "-b",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert third.returncode == 1
    assert "cannot listen" in third.stdout + third.stderr

    # A training process (in its own process group, two levels down) must not survive either.
    with Client(stack.url, stack.token) as client:
        job = client.submit(ROOT / "examples" / "digits_mlp.yaml", {"train_steps": 10_000_000})
        deadline = time.monotonic() + 60
        while job.refresh().state != "RUNNING":
            assert time.monotonic() < deadline, job.state
            time.sleep(0.1)
    processes = descendants(stack.process.pid)
    commands = [" ".join(p.cmdline()) for p in processes]
    assert any("valkey-server" in c for c in commands)  # the bundled one, not PATH's
    assert any("workers.entry" in c for c in commands)
    # Every client authenticates (the job runs), and no command line shows the password.
    assert not [c for c in commands if password in c]
    roles = {
        p.cmdline()[3]
        for p in psutil.Process(stack.process.pid).children()
        if "scheduler" in p.cmdline()
    }
    assert roles == {"api", "scheduler", "node"}
    # Each child logs in to Redis as its role's user, the training process as its job's; only
    # this test's connection uses the default user (the password above).
    keys = Keys()
    role_users = {keys.role_user(role) for role in ROLES}
    with redis.Redis.from_url(found.redis_url) as admin:
        deadline = time.monotonic() + 60  # RUNNING is reported as its process starts
        while keys.job_user(job.id) not in (users := [c["user"] for c in admin.client_list()]):
            assert time.monotonic() < deadline, users
            time.sleep(0.1)
    assert users.count("default") == 1
    assert set(users) == {"default", keys.job_user(job.id), *role_users}

    # What the stack writes is its owner's alone: the data directory and every folder in it
    # 0700, every file 0600 (the SQLite file, the logs, run directories, checkpoints, Redis's
    # files); and no output or log shows the Redis password.
    with Client(stack.url, stack.token) as client:
        short = client.submit(
            ROOT / "examples" / "digits_mlp.yaml", {"train_steps": 20, "checkpoint.freq": 10}
        )
        deadline = time.monotonic() + 90
        while short.refresh().state != "SUCCEEDED":
            assert time.monotonic() < deadline and short.state not in ("FAILED", "CANCELLED")
            time.sleep(0.2)
    run_dir = data_dir / "artifacts" / "jobs" / str(short.id)
    assert list((run_dir / "checkpoints").glob("step-*.safetensors"))
    assert (data_dir / "trainyard.db").is_file()
    assert data_dir.stat().st_mode & 0o777 == 0o700
    readable = [
        f"{path} {path.stat().st_mode & 0o777:o}"
        for path in data_dir.rglob("*")
        if not path.is_symlink() and path.stat().st_mode & 0o077
    ]
    assert not readable, readable
    shown = stack.output_text() + "".join(
        log.read_text(errors="replace") for log in (data_dir / "logs").glob("*.log")
    )
    assert password not in shown

    started = time.monotonic()
    stack.process.send_signal(signal.SIGTERM)
    assert stack.process.wait(timeout=30) == 0, stack.output_text()
    assert time.monotonic() - started < 20
    assert_all_gone([p.pid for p in processes])
    assert "stopped." in stack.output_text()


def test_restart_submit_and_a_dead_child_stops_the_stack(
    stack_factory: Callable[..., RunningStack], data_dir: Path, tmp_path: Path
) -> None:
    previous = read_stack_file(data_dir / "stack.json")
    assert previous is not None
    job_file = tmp_path / "quick.yaml"
    text = (ROOT / "examples" / "digits_mlp.yaml").read_text()
    job_file.write_text(re.sub(r"(?m)^train_steps: \d+", "train_steps: 30", text))
    # `make run`'s flow: start, submit, follow to the end, keep serving.
    again = stack_factory("--submit", str(job_file), data_dir=data_dir)
    assert again.token == previous.token
    # The restarted Redis keeps its password (on a new free port).
    restarted = read_stack_file(data_dir / "stack.json")
    assert restarted is not None
    assert restarted.redis_url.split("@")[0] == previous.redis_url.split("@")[0]
    deadline = time.monotonic() + 120
    while "keeps running" not in again.output_text():
        assert time.monotonic() < deadline, again.output_text()
        time.sleep(0.2)
    assert re.search(
        r"job \d+ SUCCEEDED after 30 steps\s+test/accuracy 0\.\d+", again.output_text()
    )
    with Client(again.url, again.token) as client:
        # The first stack's long job is the oldest (its short one succeeded).
        jobs = list(client.jobs())
        newest, older = jobs[0], jobs[-1]
        assert newest.state == "SUCCEEDED"
        # The first stack's job: its node agent drained it when that stack stopped, and it
        # continues on this one from the restart point it saved.
        drained = [e.reason for e in older.events() if e.state == "QUEUED"][1:]
        assert drained and "stopped; placed again from step" in drained[0], drained
        assert older.info.restarts == 0 and older.state in ("QUEUED", "SCHEDULED", "RUNNING")
        older.cancel()

    processes = descendants(again.process.pid)
    child_named(again, "scheduler").kill()
    assert again.process.wait(timeout=30) == 1
    assert "the scheduler process exited" in again.output_text()
    assert_all_gone([p.pid for p in processes])
