"""Worker processes as the node agent runs them: own process group, output tail, fork server.

Starting Python and importing torch takes seconds of a core on a small machine, longer than
the training of a small job's first steps, and a sweep starts a process per trial. The agent
therefore keeps one fork server (workers/fork_server.py) that has done the imports and forks a
worker process per allocation; `TRAINYARD_FORK_WORKERS=false` starts a fresh interpreter
per allocation instead.
"""

from __future__ import annotations

import abc
import contextlib
import logging
import os
import signal
import socket
import subprocess
import threading
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import IO, Protocol

from contract.fork_server import EXITED, FAILED, MESSAGE_BYTES, READY, RUN, STARTED

log = logging.getLogger("trainyard.agent")

TERM_GRACE_SECONDS = 5.0
WARM_UP_SECONDS = 120.0  # a fork server still importing after this is waited for no longer
REAP_SECONDS = 120.0  # how long a SIGKILLed process's exit code is waited for
# What the agent says of a process it stopped because its fork server exited.
ORPHANED = "its node's fork server exited, so it was stopped: its end could not be known"


class WorkerProcess(abc.ABC):
    """A worker process in its own process group (session): its output, memory and signals.
    How it was started, and so how its exit code is learnt, is the subclass's."""

    def __init__(self, output: IO[str], *, tail_lines: int = 40) -> None:
        self.pid = 0  # 0 until it runs
        self.tail: deque[str] = deque(maxlen=tail_lines)
        self.peak_kb = 0  # the largest resident set seen (VmHWM), for a failure's reason
        self.warm = False  # a fork server: it printed READY (its imports are done)
        # Reading continuously keeps a chatty child from blocking on a full pipe.
        self._reader = threading.Thread(target=self._read, args=(output,), daemon=True)
        self._reader.start()

    def _read(self, output: IO[str]) -> None:
        try:
            for raw in output:
                line = raw.rstrip("\n")
                if line == READY and not self.warm:
                    self.warm = True
                else:
                    self.tail.append(line)
        finally:
            output.close()

    @abc.abstractmethod
    def poll(self) -> int | None:
        """Its exit code if it has exited, else None."""

    @abc.abstractmethod
    def wait(self, timeout: float) -> int | None:
        """Its exit code, once it has exited within `timeout` seconds; None if still running."""

    def alive(self) -> bool:
        return self.poll() is None

    def sample_memory(self) -> None:
        """Read the process's peak resident set so far (Linux), kept after it exits."""
        try:
            status = Path(f"/proc/{self.pid}/status").read_text()
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
        self.signal_group(signal.SIGTERM)
        code = self.wait(grace)
        return code if code is not None else self.kill_group(grace=0.0)

    def kill_group(self, grace: float = TERM_GRACE_SECONDS) -> int:
        """SIGTERM the whole process group, SIGKILL it after `grace` seconds; the exit code."""
        self.signal_group(signal.SIGTERM)
        code = self.wait(grace)
        if code is None:
            self.signal_group(signal.SIGKILL)
            code = self.wait(REAP_SECONDS)
        # Children the worker may have started die with the group, even after it exited.
        self.signal_group(signal.SIGKILL)
        return -signal.SIGKILL if code is None else code

    def signal_group(self, sig: signal.Signals) -> None:
        """Send `sig` to its process group (and to it, should it not lead one yet)."""
        if self.pid <= 0:  # never started: killpg(0) would signal the agent's own group
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, sig)
        if self.poll() is None:  # a forked process not yet in its own group: itself
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(self.pid, sig)

    def output_tail(self, max_chars: int = 2000) -> str:
        self._reader.join(timeout=2.0)
        text = "\n".join(line for line in self.tail if line.strip())
        return text[-max_chars:]


class ChildProcess(WorkerProcess):
    """A process the agent starts itself: a fork server, or a worker without one."""

    def __init__(
        self,
        args: list[str],
        *,
        pass_fds: Iterable[int] = (),
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.popen = subprocess.Popen(
            args,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            pass_fds=tuple(pass_fds),
            text=True,
            bufsize=1,
        )
        assert self.popen.stdout is not None
        super().__init__(self.popen.stdout)
        self.pid = self.popen.pid

    def poll(self) -> int | None:
        return self.popen.poll()

    def wait(self, timeout: float) -> int | None:
        try:
            return self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None


class ForkedProcess(WorkerProcess):
    """A process the fork server forked: its pid and exit code come from the server."""

    def __init__(self, output: IO[str]) -> None:
        super().__init__(output)
        self.refusal = ""  # why the server did not start it
        self._started = threading.Event()
        self._exited = threading.Event()
        self._code: int | None = None

    def began(self, pid: int) -> None:
        self.pid = pid
        self._started.set()

    def refused(self, why: str) -> None:
        self.refusal = why
        self._started.set()

    def ended(self, code: int) -> None:
        self._code = code
        self._exited.set()

    def wait_started(self, timeout: float) -> bool:
        return self._started.wait(timeout) and self.pid > 0

    def poll(self) -> int | None:
        return self._code if self._exited.is_set() else None

    def wait(self, timeout: float) -> int | None:
        self._exited.wait(timeout)
        return self.poll()


class Launcher(Protocol):
    """How the agent starts a worker process for an allocation."""

    def start(self) -> None:
        """Get ready (a fork server starts importing); run() does it too."""

    def run(self, allocation_id: int, redis_url: str = "", ps_urls: str = "") -> WorkerProcess:
        """A running worker process for the allocation, logging in to Redis with `redis_url`
        and to the parameter-server Redis servers with `ps_urls` (comma-separated; "": the
        REDIS_URL and REDIS_PS_URLS of its environment); OSError if none could start."""
        ...

    def close(self) -> None:
        """Start nothing more."""


class FreshProcesses:
    """A new interpreter per allocation, each importing torch itself (no fork server), in the
    environment `env` (default the agent's) with its Redis URLs as REDIS_URL and REDIS_PS_URLS."""

    def __init__(self, args: list[str], env: Mapping[str, str] | None = None) -> None:
        self.args = args
        self.env = env

    def start(self) -> None:
        return None

    def run(self, allocation_id: int, redis_url: str = "", ps_urls: str = "") -> WorkerProcess:
        env = dict(os.environ if self.env is None else self.env)
        if redis_url:
            env["REDIS_URL"] = redis_url
        if ps_urls:
            env["REDIS_PS_URLS"] = ps_urls
        return ChildProcess([*self.args, "--allocation", str(allocation_id)], env=env)

    def close(self) -> None:
        return None


class ForkServer:
    """The node's fork server (workers/fork_server.py), started again when it exits: at once if it
    had been warm (it was killed), else at the next run() (an import that fails would fail
    again). It runs in the environment `env` (default the agent's)."""

    def __init__(self, args: list[str], env: Mapping[str, str] | None = None) -> None:
        self.args = args
        self.env = env
        self._lock = threading.Lock()
        self._server: _Server | None = None
        self._closed = False

    def start(self) -> None:
        with self._lock:
            self._current()

    def run(self, allocation_id: int, redis_url: str = "", ps_urls: str = "") -> WorkerProcess:
        with self._lock:
            server = self._current()
        return server.run(allocation_id, redis_url, ps_urls)

    def server_process(self) -> WorkerProcess | None:
        """The fork server's own process, if one is running."""
        with self._lock:
            return None if self._server is None else self._server.process

    def close(self) -> None:
        with self._lock:
            self._closed = True
            server, self._server = self._server, None
        if server is not None:
            server.close()

    def _current(self) -> _Server:
        if self._closed:
            raise BrokenPipeError("the node agent is stopping")
        if self._server is None or self._server.ended.is_set():
            self._server = _Server(self.args, self.env, on_end=self._server_ended)
        return self._server

    def _server_ended(self, server: _Server) -> None:
        with self._lock:
            if server is self._server and server.process.warm and not self._closed:
                log.warning("the fork server exited: %s", server.process.output_tail())
                try:
                    self._server = _Server(self.args, self.env, on_end=self._server_ended)
                except OSError:  # out of processes or memory: the next run() tries again
                    log.exception("cannot start the fork server again")


class _Server:
    """One fork-server process and the agent's end of its socket."""

    def __init__(
        self,
        args: list[str],
        env: Mapping[str, str] | None,
        *,
        on_end: Callable[[_Server], None],
    ) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.process = ChildProcess(
                [*args, "--fork-server", str(theirs.fileno())],
                pass_fds=[theirs.fileno()],
                env=env,
            )
        except OSError:
            ours.close()
            raise
        finally:
            theirs.close()
        self.channel = ours
        self.ended = threading.Event()
        self._on_end = on_end
        self._lock = threading.Lock()
        self._starting: dict[int, ForkedProcess] = {}  # by allocation id
        self._running: dict[int, ForkedProcess] = {}  # by pid
        threading.Thread(target=self._listen, name="fork-server", daemon=True).start()

    def run(self, allocation_id: int, redis_url: str, ps_urls: str) -> WorkerProcess:
        read_fd, write_fd = os.pipe()
        process = ForkedProcess(open(read_fd, encoding="utf-8", errors="replace"))  # noqa: SIM115
        try:
            with self._lock:
                if self.ended.is_set():
                    raise BrokenPipeError(f"the fork server exited: {self.process.output_tail()}")
                self._starting[allocation_id] = process
            request = f"{RUN} {allocation_id} {redis_url} {ps_urls}".rstrip()
            socket.send_fds(self.channel, [request.encode()], [write_fd])
        except OSError:
            with self._lock:
                self._starting.pop(allocation_id, None)
            raise
        finally:
            os.close(write_fd)  # the forked process holds it now: its end is our reader's EOF
        if not process.wait_started(WARM_UP_SECONDS):
            with self._lock:
                self._starting.pop(allocation_id, None)
            raise OSError(process.refusal or f"no process in {WARM_UP_SECONDS:.0f} s")
        return process

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.channel.shutdown(socket.SHUT_RDWR)  # the server's EOF: it exits
        self.process.kill_group(grace=1.0)

    def _listen(self) -> None:
        with contextlib.suppress(OSError):
            while message := self.channel.recv(MESSAGE_BYTES):
                self._handle(message.decode().split(" ", 2))
        self._end()

    def _handle(self, words: list[str]) -> None:
        verb, first, second = (*words, "", "")[:3]
        number = int(first) if first.isdigit() else -1  # an allocation id or a pid
        with self._lock:
            if verb == STARTED and second.isdigit():
                waiting = self._starting.pop(number, None)
                if waiting is None:  # its run() gave up waiting: nobody would supervise it
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(int(second), signal.SIGKILL)
                    return
                self._running[int(second)] = waiting
                waiting.began(int(second))
            elif verb == FAILED and number in self._starting:
                self._starting.pop(number).refused(second)
            elif verb == EXITED and number in self._running:
                self._running.pop(number).ended(int(second))

    def _end(self) -> None:
        """The server exited: what waits to start cannot, and what it forked and still runs
        is stopped, as nothing can learn its exit code any more."""
        self.channel.close()
        with self._lock:
            self.ended.set()
            starting, self._starting = list(self._starting.values()), {}
            running, self._running = list(self._running.values()), {}
        self.process.kill_group(grace=0.0)
        why = f"the fork server exited {self.process.poll()}: {self.process.output_tail()}"
        for process in starting:
            process.refused(why)
        for process in running:
            process.tail.append(ORPHANED)
            process.signal_group(signal.SIGKILL)
            process.ended(-signal.SIGKILL)
        self._on_end(self)
