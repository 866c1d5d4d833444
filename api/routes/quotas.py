"""/quota and /users/{name}/quota: a user's quotas in force, what they use, and (admins) changes."""

from __future__ import annotations

from dataclasses import asdict
from typing import Annotated

from fastapi import APIRouter, Path
from sqlalchemy.orm import Session

from api.deps import CurrentUser, ServicesDep, SessionDep
from api.schemas import errors
from api.schemas_access import USER_NAME_PATTERN, QuotaLimits, QuotaOut, QuotaUpdate, QuotaUsage
from contract.settings import Settings
from scheduler.admission.policy import admins_only
from scheduler.admission.quotas import Limits, overrides, set_quotas, usage_of
from scheduler.store.errors import NotFound
from scheduler.store.models import QUOTA_NAMES, User
from scheduler.store.users import get_user

router = APIRouter(tags=["quotas"])

UserName = Annotated[
    str, Path(pattern=USER_NAME_PATTERN, max_length=100, description="the user's name")
]


def quota_out(session: Session, user: User, settings: Settings) -> QuotaOut:
    own = overrides(session, user.id)
    limits = Limits.defaults(settings).with_overrides(own)
    return QuotaOut(
        user=user.name,
        limits=QuotaLimits(**asdict(limits)),
        overrides=[
            name for name in QUOTA_NAMES if own is not None and getattr(own, name) is not None
        ],
        usage=QuotaUsage(**asdict(usage_of(session, user))),
    )


def named_user(session: Session, caller: User, name: str) -> User:
    if name != caller.name:
        admins_only(caller, f"the quotas of user '{name}'")
    user = get_user(session, name)
    if user is None:
        raise NotFound(f"no user named '{name}'")
    return user


@router.get(
    "/quota",
    response_model=QuotaOut,
    summary="Your quotas and use",
    description="The quotas in force for you (null: no limit) and what you use now.",
    responses=errors(401),
)
def my_quota(session: SessionDep, caller: CurrentUser, services: ServicesDep) -> QuotaOut:
    return quota_out(session, caller, services.settings)


@router.get(
    "/users/{name}/quota",
    response_model=QuotaOut,
    summary="A user's quotas and use",
    description="Your own, or any user's for an admin (403 otherwise).",
    responses=errors(401, 403, 404, 422),
)
def user_quota(
    name: UserName, session: SessionDep, caller: CurrentUser, services: ServicesDep
) -> QuotaOut:
    return quota_out(session, named_user(session, caller, name), services.settings)


@router.patch(
    "/users/{name}/quota",
    response_model=QuotaOut,
    summary="Change a user's quotas (admins)",
    description="Each quota given is set for this user (null: back to the operator's "
    "default); quotas not given stay. Placement follows at its next pass: jobs waiting for a "
    "raised quota start, lowered ones stop nothing that runs.",
    responses=errors(400, 401, 403, 404, 422),
)
def change_quota(
    name: UserName,
    body: QuotaUpdate,
    session: SessionDep,
    caller: CurrentUser,
    services: ServicesDep,
) -> QuotaOut:
    admins_only(caller, "changing quotas")
    user = named_user(session, caller, name)
    set_quotas(session, user, body.model_dump(include=body.model_fields_set))
    session.commit()
    return quota_out(session, user, services.settings)
