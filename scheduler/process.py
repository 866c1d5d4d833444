"""Worker processes as the node agent runs them: own process group, output tail, standbys.

Starting Python and importing torch takes seconds on a small machine, longer than the
training of a small job's first steps. The agent therefore keeps standby processes (one per
slot by default) that have done their imports and wait for an allocation id on stdin; taking
one starts its replacement.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import threading
from collections import deque
from pathlib import Path

from workers.entry import STANDBY_READY

log = logging.getLogger("trainyard.agent")

TERM_GRACE_SECONDS = 5.0
WARM_UP_SECONDS = 120.0  # a standby still importing after this is waited for no longer
CHECK_SECONDS = 5.0  # how often the idle standbys are looked at (a dead one is replaced)


class WorkerProcess:
    """A `python -m workers.entry --standby` child in its own process group (session)."""

    def __init__(self, args: list[str], *, tail_lines: int = 40) -> None:
        self.popen = subprocess.Popen(
            args,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            text=True,
            bufsize=1,
        )
        self.tail: deque[str] = deque(maxlen=tail_lines)
        self.peak_kb = 0  # the largest resident set seen (VmHWM), for a failure's reason
        self.warm = False  # it printed STANDBY_READY: its imports are done
        self._settled = threading.Event()  # warm, or its output ended (it exited)
        # Reading continuously keeps a chatty child from blocking on a full pipe.
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.popen.stdout is not None
        try:
            for raw in self.popen.stdout:
                line = raw.rstrip("\n")
                if line == STANDBY_READY and not self.warm:
                    self.warm = True
                    self._settled.set()
                else:
                    self.tail.append(line)
        finally:
            self._settled.set()

    def wait_warm(self, timeout: float) -> bool:
        """Wait until it is warm or has exited; whether it is warm."""
        self._settled.wait(timeout)
        return self.warm

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def hand(self, allocation_id: int) -> None:
        """Give the standby its allocation; raises OSError if it already died."""
        assert self.popen.stdin is not None
        if self.popen.poll() is not None:
            raise BrokenPipeError(f"the worker process exited with {self.popen.returncode}")
        self.tail.clear()  # what the warm-up printed is no reason for this allocation's end
        self.popen.stdin.write(f"{allocation_id}\n")
        self.popen.stdin.flush()
        self.popen.stdin.close()

    def wait(self, timeout: float) -> int | None:
        try:
            return self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def sample_memory(self) -> None:
        """Read the process's peak resident set so far (Linux), kept after it exits."""
        try:
            status = Path(f"/proc/{self.popen.pid}/status").read_text()
        except OSError:
            return
        for line in status.splitlines():
            if line.startswith("VmHWM:"):
                self.peak_kb = max(self.peak_kb, int(line.split()[1]))
                return

    def peak_memory(self) -> str:
        if self.peak_kb == 0:
            return "unknown"
        mb = self.peak_kb / 1024
        return f"{mb / 1024:.1f} GB" if mb >= 1024 else f"{mb:.0f} MB"

    def drain(self, grace: float) -> int:
        """SIGTERM the worker (it saves a restart point and exits), then the group as usual."""
        self._signal(signal.SIGTERM)
        code = self.wait(grace)
        return code if code is not None else self.kill_group(grace=0.0)

    def kill_group(self, grace: float = TERM_GRACE_SECONDS) -> int:
        """SIGTERM the whole process group, SIGKILL it after `grace` seconds; the exit code."""
        self._signal(signal.SIGTERM)
        code = self.wait(grace)
        if code is None:
            self._signal(signal.SIGKILL)
            code = self.popen.wait()
        # Children the worker may have started die with the group, even after it exited.
        self._signal(signal.SIGKILL)
        return code

    def _signal(self, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.popen.pid, sig)

    def output_tail(self, max_chars: int = 2000) -> str:
        self._reader.join(timeout=2.0)
        text = "\n".join(line for line in self.tail if line.strip())
        return text[-max_chars:]


class StandbyPool:
    """Keeps up to `size` warmed-up worker processes ready to take allocations.

    Allocations that arrive together (a gang, or a sweep's trials that ended together) each
    find one. Replacements start one at a time, each once the one before it is warm: an
    import takes a core for seconds, and the jobs that just took standbys need the node's
    cores more than the next standby does. A thread of the pool's own starts them.
    """

    def __init__(self, args: list[str], size: int = 1) -> None:
        self.args, self.size = args, size
        self._cond = threading.Condition()
        self._ready: deque[WorkerProcess] = deque()  # the oldest, the warmest, first
        self._filler: threading.Thread | None = None
        self._closed = False

    def start(self) -> None:
        """Start filling the pool; take() does it too."""
        with self._cond:
            if self._filler is None and self.size > 0 and not self._closed:
                self._filler = threading.Thread(target=self._fill, name="standbys", daemon=True)
                self._filler.start()

    def take(self) -> WorkerProcess:
        """The oldest live standby, or a fresh process when there is none; dead ones are
        dropped, and the pool starts their replacements and the taken one's."""
        self.start()
        dead: list[WorkerProcess] = []
        taken = None
        with self._cond:
            while self._ready and taken is None:
                process = self._ready.popleft()
                if process.alive():
                    taken = process
                else:
                    dead.append(process)
            self._cond.notify_all()
        for process in dead:
            _discard(process)
        return taken if taken is not None else WorkerProcess(self.args)

    def standbys(self) -> list[WorkerProcess]:
        """The standbys now, the oldest first (warm ones and at most one warming up)."""
        with self._cond:
            return list(self._ready)

    def close(self) -> None:
        """Start no more standbys and kill every one there is."""
        with self._cond:
            self._closed = True
            standbys, self._ready = list(self._ready), deque()
            filler = self._filler
            self._cond.notify_all()
        for process in standbys:
            process.kill_group(grace=1.0)
        if filler is not None:
            filler.join(timeout=WARM_UP_SECONDS)

    def _fill(self) -> None:
        while True:
            with self._cond:
                if self._closed:
                    return
                dead = [process for process in self._ready if not process.alive()]
                for process in dead:
                    self._ready.remove(process)
                starting = None
                if len(self._ready) < self.size:
                    try:
                        starting = WorkerProcess(self.args)
                    except OSError:  # out of processes or memory: take() starts its own
                        log.exception("cannot start a standby process; trying again")
                        self._cond.wait(CHECK_SECONDS)
                    else:
                        self._ready.append(starting)
                elif not dead:
                    self._cond.wait(CHECK_SECONDS)
            for process in dead:
                _discard(process)
            if starting is not None and not starting.wait_warm(WARM_UP_SECONDS):
                with self._cond:
                    if self._closed:
                        return
                    # It died (or hangs) importing: no new one at once, which would spin.
                    self._cond.wait(CHECK_SECONDS)


def _discard(standby: WorkerProcess) -> None:
    """A standby that exited on its own: why, in the agent's log; its group, gone."""
    code = standby.kill_group(grace=0.0)
    log.warning("standby process %s exited %s: %s", standby.pid, code, standby.output_tail())
