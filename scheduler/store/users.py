"""Users and their API tokens: plain functions over a SQLAlchemy Session.

A user has several named tokens, each with an optional expiry, listed and revoked; the API
(/tokens) and `trainyard admin tokens` share these. A user manages their own tokens, an admin
anyone's. A token made through the API remembers the token that made it (its parent):
revoking a token revokes its offspring too. Revoking deletes the rows: the next request with
one is refused (API processes also drop them from their few-second cache, api/deps.py). Only
the hash is stored, so a token's secret is shown once, when it is created.
"""

from __future__ import annotations

import hashlib
import secrets
from datetime import datetime, timedelta

from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

from scheduler.store.errors import Conflict, Expired, NotFound
from scheduler.store.models import ApiToken, User, aware, utcnow

TOKEN_TOUCH_INTERVAL = timedelta(minutes=1)
MAX_EXPIRY_DAYS = 3650


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def create_user(session: Session, name: str, is_admin: bool = False) -> User:
    if session.scalar(select(User.id).where(User.name == name)) is not None:
        raise Conflict(f"a user named '{name}' exists")
    user = User(name=name, is_admin=is_admin)
    session.add(user)
    session.flush()
    return user


def get_user(session: Session, name: str) -> User | None:
    return session.scalar(select(User).where(User.name == name))


def create_token(
    session: Session,
    user: User,
    label: str = "",
    expires_at: datetime | None = None,
    parent_id: int | None = None,
) -> str:
    """A new random token for `user`; only its hash is stored, so this is the one chance to
    show it."""
    token = secrets.token_urlsafe(32)
    session.add(
        ApiToken(
            user_id=user.id,
            token_hash=hash_token(token),
            label=label,
            expires_at=expires_at,
            parent_id=parent_id,
        )
    )
    session.flush()
    return token


def find_token(session: Session, token: str) -> tuple[User, ApiToken] | None:
    """The token's user and row, or None; `Expired` past its expiry. Marks the token used, at
    most once a minute (writes are costly on the hot path of every request)."""
    return find_token_hash(session, hash_token(token))


def find_token_hash(session: Session, token_hash: str) -> tuple[User, ApiToken] | None:
    """`find_token` by the token's hash (what a stream ticket remembers of it)."""
    row = session.execute(
        select(User, ApiToken)
        .join(ApiToken, ApiToken.user_id == User.id)
        .where(ApiToken.token_hash == token_hash)
    ).first()
    if row is None:
        return None
    user, api_token = row
    now = utcnow()
    if api_token.expires_at is not None and aware(api_token.expires_at) <= now:
        raise Expired(
            f"the API token '{api_token.label}' expired at "
            f"{aware(api_token.expires_at).isoformat(timespec='seconds')}; create a new one"
        )
    if api_token.last_used_at is None or aware(api_token.last_used_at) < now - TOKEN_TOUCH_INTERVAL:
        api_token.last_used_at = now
    return user, api_token


def user_for_token(session: Session, token: str) -> User | None:
    found = find_token(session, token)
    return found[0] if found else None


# Jobs ---------------------------------------------------------------------------------------


def expiry(days: int | None, now: datetime | None = None) -> datetime | None:
    """When a token made now for `days` days expires (None: never)."""
    if days is None:
        return None
    return (now or utcnow()) + timedelta(days=days)


def issue_token(
    session: Session,
    user: User,
    name: str,
    expires_at: datetime | None = None,
    parent_id: int | None = None,
) -> tuple[ApiToken, str]:
    """A new token named `name` for `user` (names are unique among the user's tokens), made
    by the token `parent_id` (None: on the server): its row and its secret, which nothing
    shows again."""
    taken = session.scalar(
        select(ApiToken.id).where(ApiToken.user_id == user.id, ApiToken.label == name)
    )
    if taken is not None:
        raise Conflict(
            f"{user.name} already has a token named '{name}' (id {taken}); revoke it or "
            "choose another name"
        )
    secret = create_token(session, user, name, expires_at, parent_id)
    row = session.scalar(select(ApiToken).where(ApiToken.token_hash == hash_token(secret)))
    assert row is not None  # just added
    return row, secret


def token_count(session: Session, user: User) -> int:
    return session.scalar(select(func.count()).where(ApiToken.user_id == user.id)) or 0


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


def minters_of(session: Session, token_id: int) -> set[int]:
    """The ids of the token that minted `token_id`, of the one that minted that, and so on."""
    found: set[int] = set()
    parent = session.scalar(select(ApiToken.parent_id).where(ApiToken.id == token_id))
    while parent is not None and parent not in found:  # one query per generation
        found.add(parent)
        parent = session.scalar(select(ApiToken.parent_id).where(ApiToken.id == parent))
    return found


def revoke_token(session: Session, token: ApiToken) -> list[str]:
    """Delete the token and every token it minted, theirs, and so on; returns their hashes
    (for caches to drop)."""
    ids, hashes = {token.id}, [token.token_hash]
    frontier = [token.id]
    while frontier:  # one query per generation
        children = session.execute(
            select(ApiToken.id, ApiToken.token_hash).where(ApiToken.parent_id.in_(frontier))
        ).all()
        frontier = [child_id for child_id, _ in children if child_id not in ids]
        ids.update(frontier)
        hashes += [token_hash for child_id, token_hash in children if child_id in frontier]
    session.execute(delete(ApiToken).where(ApiToken.id.in_(ids)))
    return hashes
