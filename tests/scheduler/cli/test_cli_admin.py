"""`trainyard admin tokens` and `trainyard admin quota` on a real SQLite store and Redis."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis
from sqlalchemy import select
from typer.testing import CliRunner, Result

from scheduler.cli.main import app
from scheduler.store.database import Database
from scheduler.store.models import ApiToken, UserQuota
from scheduler.store.users import create_token, hash_token, user_for_token


@pytest.fixture
def env(tmp_path: Path, redis_url: str) -> dict[str, str]:
    return {
        "TRAINYARD_DATA_DIR": str(tmp_path),
        "DATABASE_URL": f"sqlite:///{tmp_path / 'store.db'}",
        "REDIS_URL": redis_url,
        "TRAINYARD_REDIS_PREFIX": "cli-admin-test",
        "COLUMNS": "200",
    }


def run(env: dict[str, str], *args: str) -> Result:
    return CliRunner().invoke(app, ["admin", *args], env=env)


def test_tokens_are_created_listed_and_revoked(env: dict[str, str], redis_url: str) -> None:
    assert run(env, "create-user", "alice").exit_code == 0
    created = run(env, "tokens", "create", "alice", "laptop", "--expires-in-days", "7")
    assert created.exit_code == 0, created.output
    secret = created.stdout.strip().splitlines()[-1]
    db = Database(env["DATABASE_URL"])
    try:
        with db.session() as session:
            user = user_for_token(session, secret)
            assert user is not None and user.name == "alice"
            token_id = session.scalar(select(ApiToken.id).where(ApiToken.label == "laptop"))
        listed = run(env, "tokens", "list", "--user", "alice")
        assert listed.exit_code == 0 and "laptop" in listed.stdout and secret not in listed.stdout
        twice = run(env, "tokens", "create", "alice", "laptop")
        assert twice.exit_code == 1 and "already has a token named 'laptop'" in twice.stderr
        nobody = run(env, "tokens", "create", "nobody", "x")
        assert nobody.exit_code == 1 and "no user named 'nobody'" in nobody.stderr
        with db.session() as session:  # a token the laptop's minted (through the API)
            child = create_token(session, user, "minted", parent_id=token_id)
        listener = redis.Redis.from_url(redis_url).pubsub()
        listener.subscribe("cli-admin-test:tokens:revoked")
        listener.get_message(timeout=1)  # the subscription's confirmation
        revoked = run(env, "tokens", "revoke", str(token_id))
        assert revoked.exit_code == 0, revoked.output
        assert "and the 1 it minted" in revoked.stdout
        announced = [listener.get_message(timeout=5) for _ in range(2)]
        assert [m["data"] for m in announced if m] == [
            hash_token(secret).encode(),
            hash_token(child).encode(),
        ]
        listener.close()
        with db.session() as session:
            assert user_for_token(session, secret) is None
            assert user_for_token(session, child) is None
        again = run(env, "tokens", "revoke", str(token_id))
        assert again.exit_code == 1 and f"no token {token_id}" in again.stderr
    finally:
        db.dispose()


def test_quotas_are_set_shown_and_reset(env: dict[str, str]) -> None:
    assert run(env, "create-user", "bob").exit_code == 0
    changed = run(env, "quota", "set", "bob", "--running-jobs", "2", "--train-steps", "500")
    assert changed.exit_code == 0, changed.output
    shown = run(env, "quota", "show", "bob")
    assert shown.exit_code == 0
    cells = [line.replace("│", " ").split() for line in shown.stdout.splitlines()]
    rows = {cell[0]: cell[1:] for cell in cells if len(cell) == 4}
    assert rows["running_jobs"][:2] == ["2", "yes"] and rows["train_steps"][:2] == ["500", "yes"]
    assert rows["slots"][:2] == ["none", "default"]
    bad = run(env, "quota", "set", "bob", "--slots", "lots")
    assert bad.exit_code == 2 and "'lots'" in bad.output
    none = run(env, "quota", "set", "bob")
    assert none.exit_code == 1 and "give at least one quota" in none.stderr
    assert run(env, "quota", "set", "bob", "--train-steps", "default").exit_code == 0
    db = Database(env["DATABASE_URL"])
    try:
        with db.session() as session:
            row = session.scalar(select(UserQuota))
            assert row is not None and row.running_jobs == 2 and row.train_steps is None
    finally:
        db.dispose()
