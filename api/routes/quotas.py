"""/quota and /users/{name}/quota: a user's quotas in force, what they use, and (admins) changes."""

from __future__ import annotations

from dataclasses import asdict
from typing import Annotated

from fastapi import APIRouter, Path

from api.deps import CurrentUser, ServicesDep, SessionDep
from api.schemas import errors
from api.schemas_access import USER_NAME_PATTERN, QuotaLimits, QuotaOut, QuotaUpdate, QuotaUsage
from scheduler.admission.policy import admins_only, user_named
from scheduler.store.quotas import QuotaReport, change_quotas, quota_report

router = APIRouter(tags=["quotas"])

UserName = Annotated[
    str, Path(pattern=USER_NAME_PATTERN, max_length=100, description="the user's name")
]


def quota_out(report: QuotaReport) -> QuotaOut:
    return QuotaOut(
        user=report.user,
        limits=QuotaLimits(**asdict(report.limits)),
        overrides=report.overrides,
        usage=QuotaUsage(**asdict(report.usage)),
    )


def whose(name: str) -> str:
    return f"the quotas of user '{name}'"


@router.get(
    "/quota",
    response_model=QuotaOut,
    summary="Your quotas and use",
    description="The quotas in force for you (null: no limit) and what you use now.",
    responses=errors(401),
)
def my_quota(session: SessionDep, caller: CurrentUser, services: ServicesDep) -> QuotaOut:
    return quota_out(quota_report(session, caller, services.settings))


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
    user = user_named(session, caller, name, whose(name))
    return quota_out(quota_report(session, user, services.settings))


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
    user = user_named(session, caller, name, whose(name))
    change_quotas(session, user, body.model_dump(include=body.model_fields_set))
    return quota_out(quota_report(session, user, services.settings))
