"""What only admins may do: act on other users' things, and set a priority above the default.

These are the service's rules, not HTTP's: a refusal is `NotAllowed`, which the API answers 403.
"""

from __future__ import annotations

from sqlalchemy.orm import Session

from scheduler.store.errors import NotFound, StoreError
from scheduler.store.models import User
from scheduler.store.users import get_user

DEFAULT_PRIORITY = 0


class NotAllowed(StoreError):
    """The caller may not do this (an admin may); the message says what was refused."""


def admins_only(user: User, what: str) -> None:
    if not user.is_admin:
        raise NotAllowed(f"{what}: only admins may do this")


def check_priority(user: User, priority: int) -> None:
    """Priorities up to the default are everyone's to set; above it, admins' only."""
    if priority > DEFAULT_PRIORITY and not user.is_admin:
        raise NotAllowed(
            f"priority {priority}: only admins may set a priority above the default "
            f"({DEFAULT_PRIORITY}); lower ones are yours to set"
        )


def user_named(session: Session, caller: User, name: str, what: str) -> User:
    """The user called `name`: the caller themselves, or (admins only) anyone; `what` names
    what the caller asked about another user, for the refusal."""
    if name == caller.name:
        return caller
    admins_only(caller, what)
    user = get_user(session, name)
    if user is None:
        raise NotFound(f"no user named '{name}'")
    return user
