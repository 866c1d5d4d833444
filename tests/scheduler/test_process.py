"""The node agent's standby pool (scheduler/process.py) with real child processes.

The children run a small script that keeps the standby protocol of `workers.entry --standby`:
it "imports" until its gate file exists, prints STANDBY_READY, then waits for an allocation id
on stdin. One test runs the real `workers.entry --standby` to hold the two sides together.
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

from scheduler.process import StandbyPool, WorkerProcess
from workers.entry import STANDBY_READY

TIMEOUT = 60.0

STANDBY = f"""
import pathlib, sys, time
pathlib.Path(sys.argv[2], str(time.time_ns())).touch()  # one file per start
while not pathlib.Path(sys.argv[1]).exists():
    time.sleep(0.01)
if sys.argv[3] == "die":
    sys.exit(7)
print({STANDBY_READY!r}, flush=True)
line = sys.stdin.readline()
sys.exit(0 if line.strip() else 5)
"""


class Standbys:
    """Command lines of the script above, with their gate and the record of their starts."""

    def __init__(self, root: Path) -> None:
        self.script = root / "standby.py"
        self.script.write_text(STANDBY)
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
def standbys(tmp_path: Path) -> Standbys:
    return Standbys(tmp_path)


@pytest.fixture
def pools() -> Iterator[list[StandbyPool]]:
    made: list[StandbyPool] = []
    yield made
    for pool in made:
        pool.close()


def wait_for(what: str, check: Callable[[], bool]) -> None:
    deadline = time.monotonic() + TIMEOUT
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def warm(pool: StandbyPool) -> list[WorkerProcess]:
    return [p for p in pool.standbys() if p.warm and p.alive()]


def warm_pool(standbys: Standbys, pools: list[StandbyPool], size: int) -> StandbyPool:
    """A pool whose standbys import at once, once all `size` of them are warm."""
    standbys.open_gate()
    pool = StandbyPool(standbys.args(), size=size)
    pools.append(pool)
    pool.start()
    wait_for(f"{size} warm standbys", lambda: len(warm(pool)) == size)
    return pool


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_the_pool_fills_to_its_size_one_import_at_a_time(
    standbys: Standbys, pools: list[StandbyPool]
) -> None:
    pool = StandbyPool(standbys.args(), size=3)
    pools.append(pool)
    pool.start()
    wait_for("the first standby", lambda: standbys.started() == 1)
    time.sleep(0.5)  # while it "imports", no second one starts beside it
    assert standbys.started() == 1 and len(pool.standbys()) == 1
    standbys.open_gate()
    wait_for("three warm standbys", lambda: len(warm(pool)) == 3)
    assert standbys.started() == 3


def test_allocations_at_once_each_take_a_warm_standby_and_the_pool_refills(
    standbys: Standbys, pools: list[StandbyPool]
) -> None:
    pool = warm_pool(standbys, pools, size=2)
    first, second = pool.take(), pool.take()
    assert first.warm and second.warm and first.pid != second.pid
    for number, process in enumerate((first, second)):
        process.hand(number + 1)
        assert process.wait(TIMEOUT) == 0
    wait_for("two new warm standbys", lambda: len(warm(pool)) == 2)
    assert {p.pid for p in pool.standbys()}.isdisjoint({first.pid, second.pid})
    assert standbys.started() == 4


def test_a_dead_standby_is_replaced_idle_or_at_take(
    standbys: Standbys, pools: list[StandbyPool]
) -> None:
    pool = warm_pool(standbys, pools, size=2)
    idle = pool.standbys()[0]
    os.killpg(idle.pid, signal.SIGKILL)
    # Nobody takes it: the pool notices on its own and starts another.
    wait_for("a replacement", lambda: len(warm(pool)) == 2 and idle not in pool.standbys())
    oldest = pool.standbys()[0]
    os.killpg(oldest.pid, signal.SIGKILL)
    wait_for("it to die", lambda: not oldest.alive())
    taken = pool.take()  # skips the dead one
    assert taken is not oldest and taken.alive() and taken.warm
    taken.hand(1)
    assert taken.wait(TIMEOUT) == 0
    wait_for("the pool full again", lambda: len(warm(pool)) == 2)
    assert gone(idle.pid) and gone(oldest.pid)


def test_standbys_that_die_warming_up_are_not_restarted_in_a_loop(
    standbys: Standbys, pools: list[StandbyPool]
) -> None:
    standbys.open_gate()
    pool = StandbyPool(standbys.args(then="die"), size=2)
    pools.append(pool)
    pool.start()
    wait_for("the first standby", lambda: standbys.started() == 1)
    time.sleep(1.0)  # it dies at once; the next waits CHECK_SECONDS
    assert standbys.started() == 1


def test_a_pool_that_cannot_start_processes_keeps_trying(
    standbys: Standbys, pools: list[StandbyPool], caplog: pytest.LogCaptureFixture
) -> None:
    pool = StandbyPool([str(standbys.script.parent / "no-such-python")], size=1)
    pools.append(pool)
    pool.start()
    wait_for("the failure logged", lambda: "cannot start a standby" in caplog.text)
    with pytest.raises(FileNotFoundError):
        pool.take()  # no standby, and no fresh process either
    pool.args = standbys.args()  # the installation repaired
    standbys.open_gate()
    wait_for("a warm standby", lambda: len(warm(pool)) == 1)


def test_close_kills_every_standby_and_starts_none_after(
    standbys: Standbys, pools: list[StandbyPool]
) -> None:
    pool = StandbyPool(standbys.args(), size=3)
    pool.start()
    wait_for("a warming standby", lambda: len(pool.standbys()) == 1)
    standbys.open_gate()
    wait_for("three warm standbys", lambda: len(warm(pool)) == 3)
    pids = [p.pid for p in pool.standbys()]
    pool.close()
    assert all(gone(pid) for pid in pids)
    assert pool.standbys() == []
    fresh = pool.take()  # still serves, from a fresh process, and keeps no standby
    fresh.hand(1)
    assert fresh.wait(TIMEOUT) == 0
    assert pool.standbys() == [] and standbys.started() == 4


def test_a_pool_of_none_starts_a_process_per_take(standbys: Standbys) -> None:
    standbys.open_gate()
    pool = StandbyPool(standbys.args(), size=0)
    pool.start()
    process = pool.take()
    process.hand(1)
    assert process.wait(TIMEOUT) == 0
    assert pool.standbys() == [] and standbys.started() == 1
    pool.close()


@pytest.mark.slow
def test_the_worker_entry_says_when_its_standby_is_warm(tmp_path: Path) -> None:
    process = WorkerProcess(
        [
            sys.executable,
            "-m",
            "workers.entry",
            "--standby",
            "--redis-url",
            "redis://127.0.0.1:9/0",  # never reached: no allocation is handed
            "--cache-dir",
            str(tmp_path),
        ]
    )
    try:
        assert process.wait_warm(TIMEOUT), process.output_tail()
        assert process.alive() and STANDBY_READY not in process.output_tail()
    finally:
        process.kill_group(grace=1.0)
