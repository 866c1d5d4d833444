"""The node's fork server: one process that has imported torch forks each worker process.

Starting Python and importing torch takes seconds of a core on a small machine, longer than
the training of a small job's first steps, and a sweep starts a process per trial. The node
agent therefore starts one `python -m workers.entry --fork-server`
(scheduler/agent/processes.py); it does the imports once and then forks a process per
allocation, which costs milliseconds and shares the imported pages with its siblings.

The protocol is contract/fork_server.py's. The server holds no Redis login of its own (the agent
starts it without REDIS_URL): each request brings the URLs its process logs in with, its job's
own Redis user (scheduler/daemon/job_users.py), so a process inherits no other job's rights. The
server exits when the agent's end closes; the processes it forked go on, each in its own
session, and stop themselves once the scheduler gives their allocation up, as any orphaned
worker process does.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import socket
import sys
import traceback
from collections.abc import Callable
from typing import NoReturn

from contract.fork_server import EXITED, FAILED, MESSAGE_BYTES, READY, RUN, STARTED


def serve(channel: socket.socket, run: Callable[[int, str, str], int]) -> None:
    """Fork a process that calls `run(allocation_id, redis_url, ps_urls)` for every request
    ("" for what the request leaves out); return when the agent's end closes. Called once warm
    (the imports done), from the main thread."""
    print(READY, flush=True)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    # SIGCHLD writes a byte to wake_w, which wakes the loop to reap and report.
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.set_wakeup_fd(wake_w)
    selector = selectors.DefaultSelector()
    selector.register(channel, selectors.EVENT_READ)
    selector.register(wake_r, selectors.EVENT_READ)
    own_fds = [channel.fileno(), wake_r, wake_w]
    while True:
        for key, _ in selector.select():
            if key.fileobj is channel:
                message, fds, _, _ = socket.recv_fds(channel, MESSAGE_BYTES, 1)
                if not message:
                    return  # the agent is gone
                _fork(channel, message.decode(), fds, own_fds, run)
            else:
                with contextlib.suppress(BlockingIOError):
                    os.read(wake_r, MESSAGE_BYTES)
                _reap(channel)


def _fork(
    channel: socket.socket,
    request: str,
    fds: list[int],
    own_fds: list[int],
    run: Callable[[int, str, str], int],
) -> None:
    verb, raw_id, redis_url, ps_urls, *rest = (*request.split(" "), "", "", "")
    if verb != RUN or not raw_id.isdigit() or len(fds) != 1 or any(rest):
        for fd in fds:
            os.close(fd)
        # The request is not echoed: it may hold the process's Redis password.
        _send(channel, f"{FAILED} {raw_id or '?'} a malformed request")
        return
    allocation_id, output = int(raw_id), fds[0]
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        pid = os.fork()
    except OSError as exc:  # out of processes or memory
        _send(channel, f"{FAILED} {allocation_id} cannot fork: {exc}")
        os.close(output)
        return
    if pid == 0:
        _child(allocation_id, (redis_url, ps_urls), output, own_fds, run)
    os.close(output)
    _send(channel, f"{STARTED} {allocation_id} {pid}")


def _child(
    allocation_id: int,
    urls: tuple[str, str],
    output: int,
    own_fds: list[int],
    run: Callable[[int, str, str], int],
) -> NoReturn:
    """In the forked process: the server's state dropped, a session of its own (the agent
    signals its process group), its output into the pipe, then the allocation."""
    code = 1
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for fd in own_fds:
            os.close(fd)
        os.setsid()
        os.dup2(output, 1)
        os.dup2(output, 2)
        os.close(output)
        stdin = os.open(os.devnull, os.O_RDONLY)
        os.dup2(stdin, 0)
        os.close(stdin)
        code = run(allocation_id, *urls)
    except BaseException:  # whatever happens, never back into the server's loop
        traceback.print_exc()
    finally:
        with contextlib.suppress(OSError, ValueError):  # the agent's end of the pipe closed
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def _reap(channel: socket.socket) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        _send(channel, f"{EXITED} {pid} {os.waitstatus_to_exitcode(status)}")


def _send(channel: socket.socket, message: str) -> None:
    with contextlib.suppress(OSError):  # the agent is gone: the loop sees it next
        channel.send(message.encode())
