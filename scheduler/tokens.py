"""Named API tokens: several per user, each with an optional expiry, listed and revoked.

The API (/tokens) and `trainyard admin tokens` share these. A user manages their own tokens;
an admin anyone's. Revoking deletes the row: the next request with it is refused (API
processes also drop it from their few-second cache, api/deps.py). Only the hash is stored, so
a token's secret is shown once, when it is created.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from scheduler.models import ApiToken, User, utcnow
from scheduler.store import Conflict, NotFound, create_token, hash_token

MAX_EXPIRY_DAYS = 3650


def expiry(days: int | None, now: datetime | None = None) -> datetime | None:
    """When a token made now for `days` days expires (None: never)."""
    if days is None:
        return None
    return (now or utcnow()) + timedelta(days=days)


def issue_token(
    session: Session, user: User, name: str, expires_in_days: int | None = None
) -> tuple[ApiToken, str]:
    """A new token named `name` for `user` (names are unique among the user's tokens): its row
    and its secret, which nothing shows again."""
    taken = session.scalar(
        select(ApiToken.id).where(ApiToken.user_id == user.id, ApiToken.label == name)
    )
    if taken is not None:
        raise Conflict(
            f"{user.name} already has a token named '{name}' (id {taken}); revoke it or "
            "choose another name"
        )
    secret = create_token(session, user, name, expiry(expires_in_days))
    row = session.scalar(select(ApiToken).where(ApiToken.token_hash == hash_token(secret)))
    assert row is not None  # just added
    return row, secret


def list_tokens(session: Session, owner: User | None) -> list[tuple[ApiToken, str]]:
    """Tokens with their owner's name, oldest first: `owner`'s, or everyone's (None)."""
    query = select(ApiToken, User.name).join(User, User.id == ApiToken.user_id)
    if owner is not None:
        query = query.where(ApiToken.user_id == owner.id)
    return [(token, name) for token, name in session.execute(query.order_by(ApiToken.id))]


def find_token_by_id(session: Session, caller: User, token_id: int) -> ApiToken:
    """The token if `caller` may manage it (their own, any for an admin); else NotFound, the
    same answer as for an id that does not exist."""
    query = select(ApiToken).where(ApiToken.id == token_id)
    if not caller.is_admin:
        query = query.where(ApiToken.user_id == caller.id)
    token = session.scalar(query)
    if token is None:
        raise NotFound(f"no token {token_id}")
    return token


def revoke_token(session: Session, token: ApiToken) -> str:
    """Delete the token; returns its hash (for caches to drop)."""
    token_hash = token.token_hash
    session.delete(token)
    session.flush()
    return token_hash
