"""The job store's domain errors: what it refuses, and why, in words users see.

Nothing in the store speaks HTTP; only `api/` translates these to status codes.
"""

from __future__ import annotations


class StoreError(Exception):
    """A request the store refuses; `str()` is the message users see."""


class NotFound(StoreError):
    pass


class Conflict(StoreError):
    """The request clashes with the current state (cancel a finished job, a duplicate name)."""


class Expired(StoreError):
    """A token past its expiry."""


class InvalidRequest(StoreError):
    """A malformed argument the schema could not catch (a bad cursor)."""


class TooLarge(InvalidRequest):
    """A request past a size limit; the message names the limit and what passed it."""


class UnpacksTooLarge(TooLarge):
    """An upload that would unpack past what its owner's quota leaves or the server allows."""


class UnsupportedKind(InvalidRequest):
    """A file of a kind the service does not take."""
