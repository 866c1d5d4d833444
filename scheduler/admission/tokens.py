"""API tokens as users ask for them (/tokens): listed, issued and revoked, a user's own or, for
an admin, anyone's. A revocation is committed, then announced on Redis, so every API process
drops the token from its few-second cache (api/deps.py listens)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import redis
from sqlalchemy.orm import Session

from contract.keys import Keys
from scheduler.admission.policy import admins_only, user_named
from scheduler.store.models import ApiToken, User
from scheduler.store.users import find_token_by_id, issue_token, list_tokens, revoke_token


@dataclass(frozen=True)
class Issued:
    token: ApiToken
    secret: str  # in this answer only: the store keeps its hash
    owner: str


def token_owner(session: Session, caller: User, name: str | None) -> User:
    """The user whose tokens the caller names: their own (None), or (admins) anyone's."""
    if name is None:
        return caller
    return user_named(session, caller, name, f"the tokens of user '{name}'")


def visible_tokens(
    session: Session, caller: User, *, user: str | None, all_users: bool
) -> list[tuple[ApiToken, str]]:
    """Tokens with their owners' names: the named user's (default the caller's), or every
    user's (admins only)."""
    if all_users:
        admins_only(caller, "every user's tokens")
        return list_tokens(session, None)
    return list_tokens(session, token_owner(session, caller, user))


def issue(
    session: Session, caller: User, *, user: str | None, name: str, expires_in_days: int | None
) -> Issued:
    """A new token named `name` for the named user (default the caller), committed."""
    owner = token_owner(session, caller, user)
    token, secret = issue_token(session, owner, name, expires_in_days)
    session.commit()
    return Issued(token, secret, owner.name)


def revoke(
    session: Session,
    caller: User,
    token_id: int,
    client: redis.Redis,
    keys: Keys,
    *,
    forget: Callable[[str], None],
) -> None:
    """Revoke a token the caller may manage (NotFound otherwise), commit, `forget` it in this
    process's cache, and tell the other API processes."""
    token_hash = revoke_token(session, find_token_by_id(session, caller, token_id))
    session.commit()
    forget(token_hash)
    announce_revocation(client, keys, token_hash)


def announce_revocation(client: redis.Redis, keys: Keys, token_hash: str) -> None:
    client.publish(keys.tokens_revoked, token_hash)
