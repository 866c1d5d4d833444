"""Webhooks: URLs a user registers to be told when a job finishes or fails, or a sweep ends.

An event becomes a delivery row (the outbox, `WebhookDelivery`) in the same transaction as the
state change that made it (scheduler/store/lifecycle.py for jobs, `end_sweep` for sweeps), so
an event is never lost to a crash between the two, nor sent for a change that rolled back. The
scheduler's webhook thread (scheduler/daemon/webhooks.py) sends what is due, signed with the
hook's secret (contract/webhooks.py), and records each try's end here: delivered, retried
later (the wait doubling), or given up after the last try. Each hook's last status says which.

Bounds: `webhooks_per_user` hooks a user (403 past it), MAX_PENDING deliveries waiting per hook
(an event past it is dropped, and the hook's status says so), MAX_URL characters of a URL, whose
host must be a public address or one of the networks `webhook_allow` allows (`check_url`, at
registration; the webhook thread checks again before each send).
"""

from __future__ import annotations

import json
import secrets
import time
import uuid
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import timedelta
from typing import Any
from urllib.parse import urlsplit

from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

from contract.webhooks import HostNotFound, Network, Resolver, literal, refusal, resolve
from scheduler.store.errors import InvalidRequest, NotFound, StoreError
from scheduler.store.models import Job, Sweep, User, Webhook, WebhookDelivery, utcnow
from scheduler.store.states import JobState

JOB_FINISHED = "job.finished"
JOB_FAILED = "job.failed"
SWEEP_FINISHED = "sweep.finished"
EVENTS = (JOB_FINISHED, JOB_FAILED, SWEEP_FINISHED)
# The job states that are events: a job that succeeded, or failed (not cancelled nor pruned).
JOB_EVENTS = {JobState.SUCCEEDED: JOB_FINISHED, JobState.FAILED: JOB_FAILED}
MAX_URL = 2000
MAX_PENDING = 100
# A registration waits this long for its host's addresses, at most. The lookups run in a few
# threads of their own: a tenant's name whose DNS never answers holds one of them, and its
# request LOOKUP_SECONDS, rather than one of the API's few threads for as long as the system's
# resolver keeps trying.
LOOKUP_SECONDS = 2.0
_lookups = ThreadPoolExecutor(4, thread_name_prefix="webhook-lookup")


class TooManyWebhooks(StoreError):
    """A user past `webhooks_per_user`."""


def check_url(url: str, allow: Sequence[Network] = (), resolve: Resolver = resolve) -> str:
    """The URL, if it is an absolute http or https URL whose host is, or resolves to, only
    addresses a webhook may be sent to (contract/webhooks.py); else InvalidRequest. A name
    that does not resolve now, or not within LOOKUP_SECONDS, is accepted: each delivery
    resolves and checks it again."""
    if len(url) > MAX_URL:
        raise InvalidRequest(f"url: a webhook URL has at most {MAX_URL} characters")
    try:
        parts = urlsplit(url)
        port = parts.port  # ValueError for a port that is not a number in range
    except ValueError as exc:
        raise InvalidRequest(f"url: not a URL: {url!r} ({exc})") from exc
    if parts.scheme not in ("http", "https"):
        raise InvalidRequest(f"url: a webhook URL is http:// or https://, not {parts.scheme!r}")
    if not parts.hostname:
        raise InvalidRequest(f"url: a webhook URL names a host: {url!r}")
    if port == 0 or any(c.isspace() for c in url):
        raise InvalidRequest(f"url: not a URL a webhook can be sent to: {url!r}")
    host = parts.hostname
    lookup = _lookups.submit(resolve, host, port or (443 if parts.scheme == "https" else 80))
    try:
        addresses = lookup.result(timeout=LOOKUP_SECONDS)
    except (HostNotFound, TimeoutError):
        lookup.cancel()  # one still waiting for a thread never runs
        return url
    spelled = host if literal(host) else ""
    refusals = [why for one in addresses if (why := refusal(one, allow, spelled=spelled))]
    if refusals:
        # What a literal is, is the user's own to see; what a name resolves to is the
        # service's network, which a tenant's answer does not describe.
        why = refusals[0] if spelled else f"{host} resolves to a non-public address"
        raise InvalidRequest(
            f"url: {why}; webhooks are sent only to public addresses (an administrator may "
            "allow networks with TRAINYARD_WEBHOOK_ALLOW)"
        )
    return url


def check_events(events: list[str]) -> list[str]:
    """The events, each once, in EVENTS' order; InvalidRequest for an unknown one or none."""
    unknown = sorted(set(events) - set(EVENTS))
    if unknown:
        raise InvalidRequest(f"unknown webhook events {unknown} (known: {', '.join(EVENTS)})")
    if not events:
        raise InvalidRequest(f"a webhook needs at least one event of {', '.join(EVENTS)}")
    return [event for event in EVENTS if event in events]


def create_webhook(
    session: Session,
    owner: User,
    url: str,
    events: list[str],
    *,
    limit: int,
    allow: Sequence[Network] = (),
    resolve: Resolver = resolve,
) -> Webhook:
    """A new hook with a random secret (the caller shows it once), committed; TooManyWebhooks
    past `limit` hooks of the owner, InvalidRequest for a URL `check_url` refuses."""
    held = session.scalar(select(func.count(Webhook.id)).where(Webhook.owner_id == owner.id))
    if (held or 0) >= limit:  # before the URL's lookup, which a user past it never costs
        raise TooManyWebhooks(
            f"a user may register {limit} webhooks; remove one first (trainyard webhooks remove)"
        )
    url, events = check_url(url, allow, resolve), check_events(events)
    hook = Webhook(
        owner_id=owner.id, url=url, events=events, secret=f"whsec_{secrets.token_urlsafe(32)}"
    )
    session.add(hook)
    session.commit()
    return hook


def list_webhooks(session: Session, owner: User) -> list[Webhook]:
    return list(
        session.scalars(select(Webhook).where(Webhook.owner_id == owner.id).order_by(Webhook.id))
    )


def pending_counts(session: Session, hook_ids: list[int]) -> dict[int, int]:
    """How many deliveries wait for each of the hooks."""
    rows = session.execute(
        select(WebhookDelivery.webhook_id, func.count())
        .where(WebhookDelivery.webhook_id.in_(hook_ids))
        .group_by(WebhookDelivery.webhook_id)
    )
    return {hook_id: count for hook_id, count in rows}


def delete_webhook(session: Session, owner: User, hook_id: int) -> None:
    """Removes one of the owner's hooks and what waits to be sent to it, committed (NotFound
    for another's)."""
    hook = session.get(Webhook, hook_id)
    if hook is None or hook.owner_id != owner.id:
        raise NotFound(f"no webhook {hook_id}")
    session.execute(delete(WebhookDelivery).where(WebhookDelivery.webhook_id == hook_id))
    session.delete(hook)
    session.commit()


# -- events ------------------------------------------------------------------------------------
def job_ended(session: Session, job: Job) -> None:
    """The job's end as an event for its owner's hooks, if it is one (finished or failed)."""
    event = JOB_EVENTS.get(JobState(job.state))
    if event is not None:
        _announce(session, job.owner_id, event, {"job": _job_data(job)})


def sweep_ended(session: Session, sweep: Sweep) -> None:
    _announce(
        session,
        sweep.owner_id,
        SWEEP_FINISHED,
        {
            "sweep": {
                "id": sweep.id,
                "name": sweep.name,
                "state": str(sweep.state),
                "error": sweep.error,
                "best_trial": sweep.best_trial,
                "best_value": sweep.best_value,
            }
        },
    )


def _job_data(job: Job) -> dict[str, Any]:
    return {
        "id": job.id,
        "name": job.name,
        "state": str(job.state),
        "error": job.error,
        "step": job.step,
        "train_steps": job.train_steps,
        "objective": job.objective,
        "best_metric": job.best_metric,
        "best_step": job.best_step,
        "summary": job.summary or {},
        "sweep_id": job.sweep_id,
    }


def _announce(session: Session, owner_id: int, event: str, data: dict[str, Any]) -> None:
    hooks = session.scalars(select(Webhook).where(Webhook.owner_id == owner_id)).all()
    hooks = [hook for hook in hooks if event in hook.events]
    if not hooks:
        return
    waiting = pending_counts(session, [hook.id for hook in hooks])
    now = utcnow()
    for hook in hooks:
        if waiting.get(hook.id, 0) >= MAX_PENDING:
            hook.last_status = f"not delivered (dropped: {MAX_PENDING} deliveries were waiting)"
            hook.last_event, hook.last_delivery_at = event, now
            continue
        body = {
            "id": str(uuid.uuid4()),
            "event": event,
            "created": round(time.time(), 3),
            "data": data,
        }
        session.add(
            WebhookDelivery(
                webhook_id=hook.id,
                event=event,
                body=json.dumps(body, separators=(",", ":"), allow_nan=False, default=str),
                due_at=now,
            )
        )


# -- what the scheduler's webhook thread sends -------------------------------------------------
# Why a try ended as it did, in a hook's last status. General words only, never a transport
# error's text: which port of which host answered what is the service's network, and a
# tenant's webhook must not be a way to scan it.
REFUSED = "refused: address not allowed"  # contract.webhooks.refusal, after resolving
HOST_NOT_FOUND = "host not found"
NO_ANSWER = "no HTTP answer"  # refused, timed out, TLS failed, not HTTP: all alike


def answered(status: int) -> str:
    """The reason of a try the receiver answered: "HTTP 204"."""
    return f"HTTP {status}"


@dataclass(frozen=True)
class Due:
    """A delivery to try now, with what sending it needs."""

    id: int
    webhook_id: int
    url: str
    secret: str
    event: str
    body: str
    attempts: int  # tries before this one


def due_deliveries(session: Session, *, limit: int) -> list[Due]:
    """The deliveries due now, oldest first."""
    rows = session.execute(
        select(WebhookDelivery, Webhook)
        .join(Webhook, Webhook.id == WebhookDelivery.webhook_id)
        .where(WebhookDelivery.due_at <= utcnow())
        .order_by(WebhookDelivery.due_at, WebhookDelivery.id)
        .limit(limit)
    )
    return [Due(d.id, h.id, h.url, h.secret, d.event, d.body, d.attempts) for d, h in rows]


def record_try(
    session: Session, due: Due, reason: str, *, delivered: bool, attempts: int, retry: float
) -> None:
    """One try's end, `reason` one of the words above: delivered or given up (the delivery
    goes), or tried again after `retry` * 2**(tries - 1) seconds. The hook's last status says
    which: "delivered (HTTP 204)", "not delivered (HTTP 503); try 1 of 5, next in 1 s",
    "not delivered (no HTTP answer); gave up after try 5 of 5"."""
    delivery = session.get(WebhookDelivery, due.id)
    hook = session.get(Webhook, due.webhook_id)
    if delivery is None or hook is None:  # the hook was removed meanwhile
        return
    tries = delivery.attempts + 1
    now = utcnow()
    hook.last_event, hook.last_delivery_at = due.event, now
    if delivered:
        hook.last_status = f"delivered ({reason})"
        session.delete(delivery)
    elif tries >= attempts:
        hook.last_status = f"not delivered ({reason}); gave up after try {tries} of {attempts}"
        session.delete(delivery)
    else:
        wait = retry * 2 ** (tries - 1)
        hook.last_status = (
            f"not delivered ({reason}); try {tries} of {attempts}, next in {wait:g} s"
        )
        delivery.attempts, delivery.due_at = tries, now + timedelta(seconds=wait)
