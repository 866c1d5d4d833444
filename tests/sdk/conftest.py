"""A real local stack for SDK and CLI tests: `trainyard up` as a subprocess in a tmp data dir.

It starts its own redis-server, SQLite file, API server, scheduler and node agent, exactly as
a user's `trainyard up` does.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from scheduler.redis_server import free_port
from sdk.stack import read_stack_file

ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT = 120.0


@dataclass
class RunningStack:
    process: subprocess.Popen[bytes]
    data_dir: Path
    url: str
    token: str
    output: Path

    def env(self) -> dict[str, str]:
        """An environment whose Settings find this stack (and nothing of the caller's)."""
        return clean_env(TRAINYARD_DATA_DIR=str(self.data_dir))

    def stop(self, timeout: float = 30.0) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=timeout)

    def output_text(self) -> str:
        return self.output.read_text(errors="replace")


def clean_env(**extra: str) -> dict[str, str]:
    """Our environment without any Trainyard/Redis/SQL configuration, plus `extra`."""
    drop = ("TRAINYARD_", "REDIS_", "DATABASE_URL")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    # COLUMNS: rich wraps lines at 80 columns when it writes to a file.
    env.update(TRAINYARD_NODE_SLOTS="2", TRAINYARD_HEARTBEAT_SECONDS="1", COLUMNS="200", **extra)
    return env


def start_stack(
    data_dir: Path, *extra_args: str, env: dict[str, str] | None = None
) -> RunningStack:
    """`trainyard up` on a free port; returns once the stack file says it is up. Without `env`
    it starts its own Redis and SQLite; `env` may point it at others (REDIS_URL, ...)."""
    data_dir.mkdir(parents=True, exist_ok=True)
    output = data_dir.parent / f"{data_dir.name}-up.out"
    port = free_port()
    with output.open("wb") as sink:
        process = subprocess.Popen(
            [
                *(sys.executable, "-m", "sdk", "up"),
                *("--port", str(port), "--data-dir", str(data_dir)),
                *extra_args,
            ],
            cwd=ROOT,
            env=clean_env(**(env or {})),
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        found = read_stack_file(data_dir / "stack.json")
        if found is not None and found.pid == process.pid:
            return RunningStack(process, data_dir, found.url, found.token, output)
        if process.poll() is not None:
            raise RuntimeError(f"trainyard up exited {process.returncode}:\n{output.read_text()}")
        time.sleep(0.1)
    process.kill()
    raise RuntimeError(f"trainyard up did not come up in {START_TIMEOUT}s:\n{output.read_text()}")


@pytest.fixture(scope="session")
def stack_factory(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Callable[..., RunningStack]]:
    started: list[RunningStack] = []

    def make(
        *extra_args: str, data_dir: Path | None = None, env: dict[str, str] | None = None
    ) -> RunningStack:
        where = data_dir or tmp_path_factory.mktemp("stack") / "data"
        running = start_stack(where, *extra_args, env=env)
        started.append(running)
        return running

    yield make
    for running in started:
        if running.process.poll() is None:
            running.stop()


@pytest.fixture(scope="session")
def stack(stack_factory: Callable[..., RunningStack]) -> RunningStack:
    """One stack shared by the SDK and CLI tests of the session."""
    return stack_factory()
