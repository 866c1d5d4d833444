"""/tokens: a user's named API tokens, listed, created (the secret shown once) and revoked."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query, Response

from api.deps import MAX_INT, CallerDep, CurrentUser, ServicesDep, SessionDep
from api.schemas import errors
from api.schemas_access import TokenCreate, TokenCreated, TokenOut
from scheduler.admission import tokens
from scheduler.store.models import ApiToken, aware

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


@router.get(
    "",
    response_model=list[TokenOut],
    summary="List API tokens",
    description="Your tokens (never their secrets), oldest first. An admin may name another "
    "user (`?user=`), or list everyone's with `?all=true`.",
    responses=errors(401, 403, 404, 422),
)
def list_tokens(
    session: SessionDep,
    caller: CurrentUser,
    user: Annotated[str | None, Query(max_length=100, description="admins: whose")] = None,
    all_users: Annotated[bool, Query(alias="all", description="admins: every user's")] = False,
) -> list[TokenOut]:
    found = tokens.visible_tokens(session, caller, user=user, all_users=all_users)
    return [token_out(token, name) for token, name in found]


@router.post(
    "",
    status_code=201,
    response_model=TokenCreated,
    summary="Create an API token",
    description="A new named token, minted by the token of this request: it expires after "
    "`expires_in_days` (then 401 saying it expired), and never later than the token that "
    "minted it (unset: with it; a minting token that never expires may mint ones that never "
    "expire). Revoking a token revokes the tokens it minted. The secret is in this answer "
    "only. An admin may create one for another user (`user`). 409 if the user has a token of "
    "that name; 429 past the server's token_creations_per_minute, 403 past tokens_per_user.",
    responses=errors(400, 401, 403, 404, 409, 422, 429),
)
def create_token(
    body: TokenCreate, session: SessionDep, caller: CallerDep, services: ServicesDep
) -> TokenCreated:
    issued = tokens.issue(
        session,
        caller.user,
        tokens.Minter(caller.token_id, caller.expires_at),
        user=body.user,
        name=body.name,
        expires_in_days=body.expires_in_days,
        client=services.redis,
        keys=services.keys,
        settings=services.settings,
    )
    return TokenCreated(**token_out(issued.token, issued.owner).model_dump(), token=issued.secret)


@router.delete(
    "/{token_id}",
    status_code=204,
    response_class=Response,
    summary="Revoke an API token",
    description="At once, in every API process: the next request with it, or with any token "
    "it minted (and theirs), gets 401, and live streams opened with them close. Yours, or any "
    "user's for an admin (404 otherwise, as for an id that does not exist); 403 for the token "
    "that minted the one this request came with, or any of its minters.",
    responses=errors(401, 403, 404, 422),
)
def revoke_token(
    token_id: TokenId, session: SessionDep, caller: CallerDep, services: ServicesDep
) -> Response:
    tokens.revoke(
        session,
        caller.user,
        token_id,
        services.redis,
        services.keys,
        forget=services.tokens.drop,
        revoker=caller.token_id,
    )
    return Response(status_code=204)
