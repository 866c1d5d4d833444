"""API tokens as users ask for them (/tokens): listed, issued and revoked, a user's own or, for
an admin, anyone's. A revocation is committed, then announced on Redis, so every API process
drops the token from its few-second cache (api/deps.py listens).

A stolen token must not outlive itself through its offspring: a token mints only tokens that
expire no later than it does (one that never expires may mint ones that never expire: it is
the root an admin handed out, and revoking it revokes them all), revoking a token revokes the
tokens it minted, each user creates at most `token_creations_per_minute` tokens a minute and
holds at most `tokens_per_user`."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

import redis
from sqlalchemy.orm import Session

from contract.keys import Keys
from contract.settings import Settings
from scheduler.admission.policy import NotAllowed, admins_only, user_named
from scheduler.admission.rate_limit import RateLimited, take_slot
from scheduler.store.errors import InvalidRequest
from scheduler.store.models import ApiToken, User, aware, utcnow
from scheduler.store.users import (
    expiry,
    find_token_by_id,
    issue_token,
    list_tokens,
    minters_of,
    revoke_token,
    token_count,
)


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


@dataclass(frozen=True)
class Minter:
    """The token a request came with, as far as minting goes: its id and expiry."""

    token_id: int
    expires_at: datetime | None


def issue(
    session: Session,
    caller: User,
    minter: Minter,
    *,
    user: str | None,
    name: str,
    expires_in_days: int | None,
    client: redis.Redis,
    keys: Keys,
    settings: Settings,
) -> Issued:
    """A new token named `name` for the named user (default the caller), minted by the
    caller's token, committed. Unset `expires_in_days`: it expires with its minter."""
    wait = take_slot(client, keys.token_creations(caller.id), settings.token_creations_per_minute)
    if wait is not None:
        seconds = max(1, math.ceil(wait))
        raise RateLimited(
            f"too many tokens created: at most {settings.token_creations_per_minute} a minute "
            f"(token_creations_per_minute); retry in {seconds} s",
            retry_after=seconds,
        )
    if session.get(ApiToken, minter.token_id) is None:  # revoked since this process cached it
        raise NotAllowed("the API token this request came with has been revoked")
    owner = token_owner(session, caller, user)
    if token_count(session, owner) >= settings.tokens_per_user:
        raise NotAllowed(
            f"{owner.name} holds {settings.tokens_per_user} tokens, the most a user may hold "
            "(tokens_per_user); revoke one first"
        )
    token, secret = issue_token(
        session, owner, name, _child_expiry(minter, expires_in_days), minter.token_id
    )
    session.commit()
    return Issued(token, secret, owner.name)


def _child_expiry(minter: Minter, days: int | None) -> datetime | None:
    """When a token `minter` makes for `days` days expires: never later than `minter`."""
    asked = expiry(days)
    if minter.expires_at is None:
        return asked
    limit = aware(minter.expires_at)
    if asked is None:
        return limit
    if asked > limit:
        left = max((limit - utcnow()).days, 0)
        raise InvalidRequest(
            f"expires_in_days: {days} days would outlive the token this request came with "
            f"(it expires at {limit.isoformat(timespec='seconds')}); ask for at most {left} "
            "days, or leave it unset to expire with it"
        )
    return asked


def revoke(
    session: Session,
    caller: User,
    token_id: int,
    client: redis.Redis,
    keys: Keys,
    *,
    forget: Callable[[str], None],
    revoker: int | None = None,
) -> None:
    """Revoke a token the caller may manage (NotFound otherwise) and the tokens it minted,
    commit, `forget` them in this process's cache, and tell the other API processes.

    `revoker`, the id of the token the request came with, may not revoke a token that minted
    it, or that one's minters (NotAllowed): a stolen short-lived token could otherwise lock its
    user out by revoking the user's root token. It may revoke itself."""
    token = find_token_by_id(session, caller, token_id)
    if revoker is not None and token.id in minters_of(session, revoker):
        raise NotAllowed(
            f"token {token_id} minted the token this request came with (or its minter did): "
            "a token may not revoke its minters; send the request with that token, or one "
            "above it"
        )
    hashes = revoke_token(session, token)
    session.commit()
    for token_hash in hashes:
        forget(token_hash)
        announce_revocation(client, keys, token_hash)


def announce_revocation(client: redis.Redis, keys: Keys, token_hash: str) -> None:
    client.publish(keys.tokens_revoked, token_hash)
