"""/webhooks: URLs a user registers to be told when jobs finish or fail and sweeps end."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Response

from api.deps import MAX_INT, CurrentUser, ServicesDep, SessionDep
from api.schemas import errors
from api.schemas_integrations import WebhookCreate, WebhookCreated, WebhookOut
from scheduler.store import webhooks

router = APIRouter(prefix="/webhooks", tags=["webhooks"])

WebhookId = Annotated[int, Path(ge=1, le=MAX_INT, description="the webhook's id")]


@router.get(
    "",
    response_model=list[WebhookOut],
    summary="List your webhooks",
    description="Oldest first, each with its last delivery's status (never its secret).",
    responses=errors(401, 422),
)
def list_webhooks(session: SessionDep, user: CurrentUser) -> list[WebhookOut]:
    hooks = webhooks.list_webhooks(session, user)
    pending = webhooks.pending_counts(session, [hook.id for hook in hooks])
    return [WebhookOut.of(hook, pending.get(hook.id, 0)) for hook in hooks]


@router.post(
    "",
    status_code=201,
    response_model=WebhookCreated,
    summary="Register a webhook",
    description="The scheduler POSTs each event (job.finished: a job succeeded; job.failed; "
    "sweep.finished: a sweep ended, in any state) to the URL as JSON, signed in the "
    "Trainyard-Signature header (`t=<unix time>,v1=<hex HMAC-SHA256 of '<t>.<body>'>` keyed "
    "with the secret in this answer, shown only here), retrying with a doubling wait. 422 for "
    "a URL that is not http(s), whose host is or resolves to an address that is not public "
    "(loopback, private, link-local...; unless the server's webhook_allow allows it), or an "
    "unknown event; 403 past the server's webhooks_per_user.",
    responses=errors(401, 403, 422),
)
def create_webhook(
    body: WebhookCreate, session: SessionDep, user: CurrentUser, services: ServicesDep
) -> WebhookCreated:
    hook = webhooks.create_webhook(
        session,
        user,
        body.url,
        list(body.events),
        limit=services.settings.webhooks_per_user,
        allow=services.settings.webhook_networks(),
    )
    return WebhookCreated(**WebhookOut.of(hook, 0).model_dump(), secret=hook.secret)


@router.delete(
    "/{webhook_id}",
    status_code=204,
    response_class=Response,
    summary="Remove a webhook",
    description="Its waiting deliveries are dropped. 404 for another user's, as for none.",
    responses=errors(401, 404, 422),
)
def delete_webhook(webhook_id: WebhookId, session: SessionDep, user: CurrentUser) -> Response:
    webhooks.delete_webhook(session, user, webhook_id)
    return Response(status_code=204)
