"""The node agent's fork server (scheduler/agent/processes.py, workers/fork_server.py) with real
processes.

Most tests run a small server script that serves the real protocol (workers.fork_server.serve)
with a cheap payload in place of training, gated on a file so a test decides when it is warm.
One test runs the real `workers.entry --fork-server` to hold the two sides together.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from contract.settings import Settings
from scheduler.agent.node_agent import create_launcher, worker_env
from scheduler.agent.processes import ORPHANED, ForkServer, FreshProcesses, WorkerProcess

TIMEOUT = 60.0
ROOT = Path(__file__).resolve().parents[3]

# Allocation n: prints its number, then 0 exits at once, 1 sleeps (until signalled), 8 prints the
# Redis URL its request brought and exits 0, n exits n.
SERVER = """
import os, pathlib, socket, sys, time
sys.path.insert(0, {root!r})
from workers.fork_server import serve
gate, starts, then, fd = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[-1])
pathlib.Path(starts, str(time.time_ns())).touch()  # one file per server started
while not pathlib.Path(gate).exists():
    time.sleep(0.01)
if then == "die":
    print("cannot import torch", flush=True)
    sys.exit(7)

def run(allocation, redis_url, ps_urls):
    print(f"allocation {{allocation}} in {{os.getpid()}}", flush=True)
    if allocation == 8:
        inherited = os.environ.get("REDIS_URL"), os.environ.get("REDIS_PS_URLS")
        print(f"logs in with {{redis_url}} {{ps_urls}}; inherited {{inherited}}", flush=True)
        return 0
    if allocation == 1:
        time.sleep(600)
    return allocation

serve(socket.socket(fileno=fd), run)
"""


class Servers:
    """Command lines of the script above, with its gate and the record of its starts."""

    def __init__(self, root: Path) -> None:
        self.script = root / "server.py"
        self.script.write_text(SERVER.format(root=str(ROOT)))
        self.gate = root / "gate"
        self.starts = root / "starts"
        self.starts.mkdir()

    def args(self, then: str = "serve") -> list[str]:
        return [sys.executable, str(self.script), str(self.gate), str(self.starts), then]

    def open_gate(self) -> None:
        self.gate.touch()

    def started(self) -> int:
        return len(list(self.starts.iterdir()))


@pytest.fixture
def servers(tmp_path: Path) -> Servers:
    return Servers(tmp_path)


@pytest.fixture
def launchers() -> Iterator[list[ForkServer]]:
    made: list[ForkServer] = []
    yield made
    for launcher in made:
        launcher.close()


def wait_for(what: str, check: Callable[[], bool]) -> None:
    deadline = time.monotonic() + TIMEOUT
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def fork_server(
    servers: Servers, launchers: list[ForkServer], *, then: str = "serve", gate: bool = True
) -> ForkServer:
    """A launcher of the script above, closed after the test; its server "imports" at once
    unless `gate` is False (the test opens it)."""
    if gate:
        servers.open_gate()
    launcher = ForkServer(servers.args(then))
    launchers.append(launcher)
    return launcher


def server_process(launcher: ForkServer) -> WorkerProcess:
    process = launcher.server_process()
    assert process is not None
    return process


def test_each_allocation_gets_a_forked_process_of_its_own_with_its_exit_code(
    servers: Servers, launchers: list[ForkServer]
) -> None:
    launcher = fork_server(servers, launchers, gate=False)
    launcher.start()
    server = server_process(launcher)
    time.sleep(0.3)
    assert not server.warm  # still "importing": run() waits for it
    servers.open_gate()
    long = launcher.run(1)
    short = launcher.run(5)
    assert server.warm and servers.started() == 1
    assert short.wait(TIMEOUT) == 5 and long.alive()
    assert short.output_tail() == f"allocation 5 in {short.pid}"
    assert len({server.pid, long.pid, short.pid}) == 3
    # Each is the leader of a session of its own, so the agent stops it with its group (the
    # forked child calls setsid itself, just after the server has reported it started).
    wait_for("its own session", lambda: os.getsid(long.pid) == long.pid)
    assert os.getpgid(long.pid) == long.pid
    assert psutil.Process(long.pid).ppid() == server.pid
    assert long.kill_group(grace=1.0) == -signal.SIGTERM
    assert gone(long.pid) and server.alive()
    assert launcher.run(0).wait(TIMEOUT) == 0 and servers.started() == 1


def test_a_killed_worker_reports_the_signal_and_the_server_goes_on(
    servers: Servers, launchers: list[ForkServer]
) -> None:
    launcher = fork_server(servers, launchers)
    process = launcher.run(1)
    wait_for("its output", lambda: f"in {process.pid}" in "".join(process.tail))
    os.kill(process.pid, signal.SIGKILL)
    assert process.wait(TIMEOUT) == -signal.SIGKILL
    assert launcher.run(3).wait(TIMEOUT) == 3


def test_a_killed_server_stops_what_it_forked_and_is_started_again(
    servers: Servers, launchers: list[ForkServer]
) -> None:
    launcher = fork_server(servers, launchers)
    running = launcher.run(1)
    first = server_process(launcher)
    os.killpg(first.pid, signal.SIGKILL)  # its group only: the forked process has its own
    # Nothing can learn the forked process's end any more, so the agent stops it.
    assert running.wait(TIMEOUT) == -signal.SIGKILL
    assert ORPHANED in running.output_tail()
    wait_for("the orphan gone", lambda: gone(running.pid))
    # It had been warm, so a new server starts at once, and serves.
    wait_for("a second server", lambda: servers.started() == 2)
    assert launcher.run(4).wait(TIMEOUT) == 4
    assert server_process(launcher).pid != first.pid


def test_a_server_that_dies_importing_fails_the_run_with_its_output_and_is_not_respawned(
    servers: Servers, launchers: list[ForkServer]
) -> None:
    launcher = fork_server(servers, launchers, then="die")
    with pytest.raises(OSError, match="exited 7: cannot import torch"):
        launcher.run(0)
    time.sleep(0.5)
    assert servers.started() == 1  # no restart loop; the next run() tries again
    with pytest.raises(OSError, match="cannot import torch"):
        launcher.run(0)
    assert servers.started() == 2


def test_close_ends_the_server_and_starts_nothing_after(
    servers: Servers, launchers: list[ForkServer]
) -> None:
    launcher = fork_server(servers, launchers)
    assert launcher.run(0).wait(TIMEOUT) == 0
    server = server_process(launcher)
    launcher.close()
    assert server.wait(TIMEOUT) is not None and launcher.server_process() is None
    with pytest.raises(OSError, match="stopping"):
        launcher.run(0)
    assert servers.started() == 1


def test_a_forked_process_logs_in_with_its_requests_url_and_no_agent_secret_is_inherited(
    servers: Servers, launchers: list[ForkServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("REDIS_URL", "redis://:agent-secret@127.0.0.1:9/0")
    monkeypatch.setenv("REDIS_PS_URLS", "redis://:agent-secret@127.0.0.1:10/0")
    monkeypatch.setenv("DATABASE_URL", "postgresql://trainyard:db-secret@127.0.0.1/trainyard")
    servers.open_gate()
    launcher = ForkServer(servers.args(), worker_env())
    launchers.append(launcher)
    url, ps_url = (f"redis://trainyard-job-3:job-secret@127.0.0.1:{p}/0" for p in (9, 10))
    process = launcher.run(8, url, ps_url)
    assert process.wait(TIMEOUT) == 0
    assert process.output_tail().endswith(f"logs in with {url} {ps_url}; inherited (None, None)")
    server_environ = Path(f"/proc/{server_process(launcher).pid}/environ").read_bytes()
    assert b"agent-secret" not in server_environ and b"db-secret" not in server_environ


def test_without_a_fork_server_each_allocation_starts_a_fresh_interpreter(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("REDIS_URL", "redis://:agent-secret@127.0.0.1:9/0")
    monkeypatch.setenv("REDIS_PS_URLS", "redis://:agent-secret@127.0.0.1:10/0")
    script = tmp_path / "worker.py"
    script.write_text(
        "import os, sys; print(sys.argv[1:], os.environ.get('REDIS_URL'), "
        "os.environ.get('REDIS_PS_URLS'), os.environ.get('DATABASE_URL')); "
        "sys.exit(int(sys.argv[-1]))"
    )
    url, ps_url = (f"redis://trainyard-job-3:job-secret@127.0.0.1:{p}/0" for p in (9, 10))
    process = FreshProcesses([sys.executable, str(script)], worker_env()).run(6, url, ps_url)
    assert process.wait(TIMEOUT) == 6
    assert process.output_tail() == f"['--allocation', '6'] {url} {ps_url} None"


@pytest.mark.slow
def test_the_worker_entry_serves_forks_once_warm(redis_url: str, tmp_path: Path) -> None:
    launcher = ForkServer(
        [
            sys.executable,
            "-m",
            "workers.entry",
            "--redis-url",
            redis_url,
            "--cache-dir",
            str(tmp_path),
        ]
    )
    try:
        process = launcher.run(987654321)  # no such allocation: it says so and exits 2
        assert process.wait(TIMEOUT) == 2
        assert process.output_tail() == "allocation 987654321 is not in Redis"
        assert server_process(launcher).warm
    finally:
        launcher.close()


def test_the_fork_workers_setting_chooses_how_processes_start() -> None:
    forked = create_launcher(Settings(redis_url="redis://127.0.0.1:9/0"))
    fresh = create_launcher(Settings(redis_url="redis://127.0.0.1:9/0", fork_workers=False))
    assert isinstance(forked, ForkServer) and isinstance(fresh, FreshProcesses)
    assert forked.args == fresh.args and "workers.entry" in fresh.args
