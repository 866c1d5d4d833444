"""Worker processes as the node agent runs them: own process group, output tail, standbys.

Starting Python and importing torch takes seconds on a small machine, longer than the
training of a small job's first steps. The agent therefore keeps one standby process that has
done its imports and waits for an allocation id on stdin; taking it starts the next one.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
from collections import deque
from pathlib import Path

TERM_GRACE_SECONDS = 5.0


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
        # Reading continuously keeps a chatty child from blocking on a full pipe.
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.popen.stdout is not None
        for line in self.popen.stdout:
            self.tail.append(line.rstrip("\n"))

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
    """Keeps one warmed-up worker process ready to take an allocation."""

    def __init__(self, args: list[str]) -> None:
        self.args = args
        self._lock = threading.Lock()
        self._ready: WorkerProcess | None = None
        self._closed = False

    def start(self) -> None:
        with self._lock:
            if self._ready is None and not self._closed:
                self._ready = WorkerProcess(self.args)

    def take(self) -> WorkerProcess:
        """The standby if it is alive (a fresh process otherwise); a new standby starts."""
        with self._lock:
            ready, self._ready = self._ready, None
            if not self._closed:
                self._ready = WorkerProcess(self.args)
        if ready is not None and ready.alive():
            return ready
        if ready is not None:
            ready.kill_group(grace=0.0)
        return WorkerProcess(self.args)

    def close(self) -> None:
        with self._lock:
            ready, self._ready = self._ready, None
            self._closed = True
        if ready is not None:
            ready.kill_group(grace=1.0)
