"""/tokens: a user's named API tokens, listed, created (the secret shown once) and revoked."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query, Response
from sqlalchemy.orm import Session

from api.deps import MAX_INT, CurrentUser, ServicesDep, SessionDep, announce_revocation
from api.schemas import errors
from api.schemas_access import TokenCreate, TokenCreated, TokenOut
from scheduler.admission.policy import admins_only
from scheduler.store.errors import NotFound
from scheduler.store.models import ApiToken, User, aware
from scheduler.store.users import find_token_by_id, get_user, issue_token, list_tokens, revoke_token

router = APIRouter(prefix="/tokens", tags=["tokens"])

TokenId = Annotated[int, Path(ge=1, le=MAX_INT, description="the token's id")]


def token_out(token: ApiToken, owner: str) -> TokenOut:
    return TokenOut(
        id=token.id,
        name=token.label,
        user=owner,
        created_at=aware(token.created_at),
        expires_at=aware(token.expires_at) if token.expires_at else None,
        last_used_at=aware(token.last_used_at) if token.last_used_at else None,
    )


def subject(session: Session, caller: User, name: str | None) -> User:
    """The user whose tokens the caller names: their own, or (admins) anyone's."""
    if name is None or name == caller.name:
        return caller
    admins_only(caller, f"the tokens of user '{name}'")
    user = get_user(session, name)
    if user is None:
        raise NotFound(f"no user named '{name}'")
    return user


@router.get(
    "",
    response_model=list[TokenOut],
    summary="List API tokens",
    description="Your tokens (never their secrets), oldest first. An admin may name another "
    "user (`?user=`), or list everyone's with `?all=true`.",
    responses=errors(401, 403, 404, 422),
)
def get_tokens(
    session: SessionDep,
    caller: CurrentUser,
    user: Annotated[str | None, Query(max_length=100, description="admins: whose")] = None,
    all_users: Annotated[bool, Query(alias="all", description="admins: every user's")] = False,
) -> list[TokenOut]:
    if all_users:
        admins_only(caller, "every user's tokens")
        owner = None
    else:
        owner = subject(session, caller, user)
    return [token_out(token, name) for token, name in list_tokens(session, owner)]


@router.post(
    "",
    status_code=201,
    response_model=TokenCreated,
    summary="Create an API token",
    description="A new named token, optionally expiring after `expires_in_days` (then 401 "
    "saying it expired). The secret is in this answer only. An admin may create one for "
    "another user (`user`). 409 if the user has a token of that name.",
    responses=errors(400, 401, 403, 404, 409, 422),
)
def create_token(body: TokenCreate, session: SessionDep, caller: CurrentUser) -> TokenCreated:
    owner = subject(session, caller, body.user)
    token, secret = issue_token(session, owner, body.name, body.expires_in_days)
    session.commit()
    return TokenCreated(**token_out(token, owner.name).model_dump(), token=secret)


@router.delete(
    "/{token_id}",
    status_code=204,
    response_class=Response,
    summary="Revoke an API token",
    description="At once, in every API process: the next request with it gets 401. Yours, or "
    "any user's for an admin (404 otherwise, as for an id that does not exist).",
    responses=errors(401, 404, 422),
)
def delete_token(
    token_id: TokenId, session: SessionDep, caller: CurrentUser, services: ServicesDep
) -> Response:
    token_hash = revoke_token(session, find_token_by_id(session, caller, token_id))
    session.commit()
    services.tokens.drop(token_hash)
    announce_revocation(services.redis, services.keys, token_hash)
    return Response(status_code=204)
