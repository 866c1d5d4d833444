"""`trainyard admin`: user, token and quota administration with direct database access (on a
machine with DATABASE_URL, or the local stack's data directory).

    trainyard admin create-user alice [--admin]
    trainyard admin tokens list [--user alice]
    trainyard admin tokens create alice laptop [--expires-in-days 30]
    trainyard admin tokens revoke 7
    trainyard admin quota show alice
    trainyard admin quota set alice --running-jobs 2 --train-steps 100000 --slots default
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.table import Table

from contract.settings import Settings

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

    from scheduler.store.models import User

console = Console()
err_console = Console(stderr=True)

admin_app = typer.Typer(help="Administration with direct database access.", no_args_is_help=True)
tokens_app = typer.Typer(help="Users' named API tokens.", no_args_is_help=True)
quota_app = typer.Typer(
    help="Users' quotas (defaults: the quota_* settings).", no_args_is_help=True
)
admin_app.add_typer(tokens_app, name="tokens")
admin_app.add_typer(quota_app, name="quota")

QUOTA_HELP = "a number, or 'default' for the operator's default"


def fail(message: str) -> typer.Exit:
    err_console.print(f"[bold red]error[/] {message}", highlight=False)
    return typer.Exit(1)


@contextmanager
def database(settings: Settings) -> Iterator[Session]:
    """A migrated database's session, committed when the command succeeds."""
    from scheduler.store.database import Database, migrate

    migrate(settings.sql_url())
    db = Database(settings.sql_url())
    try:
        with db.session() as session:
            yield session
    finally:
        db.dispose()


def existing_user(session: Session, name: str) -> User:
    from scheduler.store import users as user_store

    user = user_store.get_user(session, name)
    if user is None:
        raise fail(f"no user named {name!r}")
    return user


@admin_app.command("create-user")
def create_user(
    name: Annotated[str, typer.Argument(help="the new user's name")],
    admin: Annotated[bool, typer.Option(help="may see and manage every user's jobs")] = False,
) -> None:
    """Create a user and print their first API token (shown once)."""
    from scheduler.store import users as user_store

    with database(Settings()) as session:
        if user_store.get_user(session, name) is not None:
            raise fail(f"a user named {name!r} already exists")
        user = user_store.create_user(session, name, admin)
        token = user_store.create_token(session, user, "created by trainyard admin")
    err_console.print(f"created {'admin ' if admin else ''}user {name}; their token:")
    sys.stdout.write(token + "\n")


@tokens_app.command("list")
def list_tokens(
    user: Annotated[str | None, typer.Option(help="only this user's [default: everyone's]")] = None,
) -> None:
    """Tokens (never their secrets): id, user, name, created, expires, last used."""
    from scheduler.store import users as user_store

    with database(Settings()) as session:
        owner = existing_user(session, user) if user else None
        rows = user_store.list_tokens(session, owner)
    table = Table("id", "user", "name", "created", "expires", "last used")
    for token, name in rows:
        table.add_row(
            str(token.id),
            name,
            token.label,
            f"{token.created_at:%Y-%m-%d %H:%M}",
            f"{token.expires_at:%Y-%m-%d %H:%M}" if token.expires_at else "never",
            f"{token.last_used_at:%Y-%m-%d %H:%M}" if token.last_used_at else "-",
        )
    console.print(table)


@tokens_app.command("create")
def create_token(
    user: Annotated[str, typer.Argument(help="whose token")],
    name: Annotated[str, typer.Argument(help="its name, unique among the user's tokens")],
    expires_in_days: Annotated[
        int | None, typer.Option(min=1, max=3650, help="[default: never expires]")
    ] = None,
) -> None:
    """Create a named token and print it (shown once)."""
    from scheduler.store import users as user_store
    from scheduler.store.errors import Conflict

    with database(Settings()) as session:
        owner = existing_user(session, user)
        try:
            row, secret = user_store.issue_token(
                session, owner, name, user_store.expiry(expires_in_days)
            )
        except Conflict as error:
            raise fail(str(error)) from None
        token_id = row.id
    err_console.print(f"created token {token_id} {name!r} of {user}:")
    sys.stdout.write(secret + "\n")


@tokens_app.command("revoke")
def revoke_token(
    token_id: Annotated[int, typer.Argument(help="the token's id (tokens list)")],
) -> None:
    """Revoke a token at once: API processes drop it from their cache when Redis tells them."""
    from scheduler.store import users as user_store
    from scheduler.store.models import ApiToken

    settings = Settings()
    with database(settings) as session:
        row = session.get(ApiToken, token_id)
        if row is None:
            raise fail(f"no token {token_id}")
        hashes = user_store.revoke_token(session, row)
    if not announce(settings, hashes):
        err_console.print(
            "note: no Redis to tell the API servers (set REDIS_URL): they may accept the token "
            "for up to 10 s from their cache"
        )
    minted = f" and the {len(hashes) - 1} it minted" if len(hashes) > 1 else ""
    console.print(f"revoked token {token_id}{minted}")


def announce(settings: Settings, hashes: list[str]) -> bool:
    """Tell the API processes (Redis pub/sub) to drop the tokens from their caches."""
    import redis

    from contract.keys import Keys
    from scheduler.admission.tokens import announce_revocation
    from scheduler.cli.stack import read_stack_file

    stack = read_stack_file(settings.stack_file())
    url = settings.redis_url or (stack.redis_url if stack else None)
    if not url:
        return False
    client = redis.Redis.from_url(url, socket_timeout=5)
    try:
        for token_hash in hashes:
            announce_revocation(client, Keys(settings.redis_prefix), token_hash)
    except redis.RedisError:
        return False
    finally:
        client.close()
    return True


@quota_app.command("show")
def show_quota(user: Annotated[str, typer.Argument(help="the user")]) -> None:
    """The user's quotas in force (own or default) and what they use now."""
    from scheduler.store.models import QUOTA_NAMES
    from scheduler.store.quotas import Limits, overrides, usage_of

    settings = Settings()
    with database(settings) as session:
        owner = existing_user(session, user)
        own = overrides(session, owner.id)
        limits = Limits.defaults(settings).with_overrides(own)
        usage = usage_of(session, owner)
    table = Table("quota", "limit", "set for the user", "in use")
    for name in QUOTA_NAMES:
        limit = getattr(limits, name)
        table.add_row(
            name,
            "none" if limit is None else str(limit),
            "yes" if getattr(own, name, None) is not None else "default",
            str(getattr(usage, name, "-")),
        )
    console.print(table)


def _quota_value(name: str, text: str | None) -> tuple[str, int | None] | None:
    if text is None:
        return None
    if text == "default":
        return name, None
    try:
        value = int(text)
    except ValueError:
        raise typer.BadParameter(f"{text!r}: {QUOTA_HELP}", param_hint=f"--{name}") from None
    at_least_one = (
        "train_steps",
        "submissions_per_minute",
        "validations_per_minute",
        "sweep_trials",
    )
    if value < (1 if name in at_least_one else 0):
        raise typer.BadParameter(f"{value} is too small", param_hint=f"--{name.replace('_', '-')}")
    return name, value


Value = Annotated[str | None, typer.Option(help=QUOTA_HELP)]


@quota_app.command("set")
def set_quota(
    user: Annotated[str, typer.Argument(help="the user")],
    running_jobs: Value = None,
    slots: Value = None,
    gpus: Value = None,
    train_steps: Value = None,
    dataset_bytes: Value = None,
    artifact_bytes: Value = None,
    submissions_per_minute: Value = None,
    validations_per_minute: Value = None,
    queued_jobs: Value = None,
    sweep_trials: Value = None,
) -> None:
    """Set the user's own quotas (the ones given; 'default' returns one to the default)."""
    from scheduler.store.quotas import set_quotas

    given = {
        "running_jobs": running_jobs,
        "slots": slots,
        "gpus": gpus,
        "train_steps": train_steps,
        "dataset_bytes": dataset_bytes,
        "artifact_bytes": artifact_bytes,
        "submissions_per_minute": submissions_per_minute,
        "validations_per_minute": validations_per_minute,
        "queued_jobs": queued_jobs,
        "sweep_trials": sweep_trials,
    }
    changes = dict(item for name, text in given.items() if (item := _quota_value(name, text)))
    if not changes:
        raise fail("give at least one quota to set, e.g. --running-jobs 2")
    with database(Settings()) as session:
        set_quotas(session, existing_user(session, user), changes)
    console.print(f"set {', '.join(f'{k}={v}' for k, v in changes.items())} for {user}")
