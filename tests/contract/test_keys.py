"""Every Redis key and time-to-live is defined in contract/keys.py alone, under the stack's
prefix."""

from __future__ import annotations

import ast
import re
import secrets
from pathlib import Path

import pytest

from contract.keys import ROLES, Keys

ROOT = Path(__file__).resolve().parents[2]
SOURCE_PACKAGES = ("api", "bench", "dsl", "scheduler", "scripts", "trainyard", "workers")


def test_every_key_lives_under_the_prefix() -> None:
    keys = Keys("stack-a")
    names = [
        keys.job_stream(1),
        keys.cancel(1),
        keys.streams_with_data,
        keys.ingested_points,
        keys.allocation(2),
        keys.node("n"),
        keys.nodes,
        keys.ps_pattern(1),
        keys.announcements,
        keys.pattern,
    ]
    assert all(name.startswith("stack-a:") for name in names)
    assert len(set(names)) == len(names)
    assert keys.job_stream(1) == "stack-a:job:1:stream"  # stored streams are found by this
    assert re.fullmatch(keys.pattern.replace("*", ".*"), keys.ps_pattern(1))


def source_files() -> list[Path]:
    files = [path for package in SOURCE_PACKAGES for path in (ROOT / package).rglob("*.py")]
    assert len(files) > 50, "the source tree was not found"
    return files


def test_time_to_lives_are_defined_only_in_contract() -> None:
    defined = []
    for path in source_files():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets = (
                node.targets
                if isinstance(node, ast.Assign)
                else [node.target]
                if isinstance(node, ast.AnnAssign)
                else []
            )
            for target in targets:
                if isinstance(target, ast.Name) and target.id.endswith("_TTL_SECONDS"):
                    defined.append(f"{path.relative_to(ROOT)}:{node.lineno} {target.id}")
    assert defined == []


def test_key_names_are_spelled_only_in_contract() -> None:
    """No f-string outside contract builds a key from the stack's prefix (use Keys)."""
    spelled = []
    for path in source_files():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.JoinedStr) and re.search(
                r"\{[\w.]*prefix\}:", ast.unparse(node)
            ):
                spelled.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert spelled == []


def test_role_users_reach_what_their_role_needs_and_no_more(redis_url: str) -> None:
    """On a real Redis: the API and node agents run no administrative command and reach no key
    outside the platform's (an agent: and the Celery broker's); the scheduler manages users."""
    import redis

    from contract.settings import with_user

    keys = Keys(f"roles-{secrets.token_hex(4)}")
    admin = redis.Redis.from_url(redis_url)
    logins = {}
    for role in ROLES:
        password = secrets.token_urlsafe(16)
        rules = ["on", f">{password}", *keys.role_user_rules(role)]
        admin.execute_command("ACL", "SETUSER", keys.role_user(role), *rules)
        logins[role] = redis.Redis.from_url(with_user(redis_url, keys.role_user(role), password))
    queue = f"{keys.prefix}.node.n1"  # scheduler.celery_app.node_queue
    try:
        for role in ("api", "agent"):
            client = logins[role]
            client.set(f"{keys.prefix}:job:1:cancel", "1")  # the platform's keys
            for attempt in (
                lambda c=client: c.execute_command("ACL", "LIST"),
                lambda c=client: c.execute_command("ACL", "SETUSER", "mine", "on", "allkeys"),
                lambda c=client: c.config_get("requirepass"),
                lambda c=client: c.keys("*"),
                lambda c=client: c.flushall(),
                lambda c=client: c.get("another-stack:job:1:cancel"),
            ):
                with pytest.raises(redis.exceptions.NoPermissionError):
                    attempt()
        logins["agent"].lpush(queue, "task")  # the broker's queues: an agent's, not the API's
        with pytest.raises(redis.exceptions.NoPermissionError):
            logins["api"].lrange(queue, 0, -1)
        logins["scheduler"].execute_command("ACL", "DELUSER", keys.job_user(1))
    finally:
        admin.delete(queue, f"{keys.prefix}:job:1:cancel")
        admin.execute_command("ACL", "DELUSER", *(keys.role_user(role) for role in ROLES))
        for client in (admin, *logins.values()):
            client.close()


def test_an_unknown_role_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="the roles are api, scheduler, agent"):
        Keys().role_user("worker")
