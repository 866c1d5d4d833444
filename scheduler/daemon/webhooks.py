"""The scheduler's webhook thread: sends the deliveries that are due (the outbox that
scheduler/store/webhooks.py fills in the transactions that end jobs and sweeps), signed with
each hook's secret (contract/webhooks.py), and records each try's end.

A thread of the scheduler process rather than a Celery task: the outbox in SQL already is the
queue (bounded per hook, kept across restarts), so a broker would only add a second copy of
it; the node agents' Celery queues carry training processes, which a slow receiver must never
hold up. The thread never blocks the placement loop: it shares nothing with it but the
database. Its sends go through a few threads of their own, each bounded by
`webhook_timeout_seconds`, so one slow receiver delays the others of a pass at most that long.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import ThreadPoolExecutor

import httpx

from contract.settings import Settings
from contract.webhooks import DELIVERY_HEADER, EVENT_HEADER, SIGNATURE_HEADER, signature_header
from scheduler.store.database import Database
from scheduler.store.webhooks import Due, due_deliveries, record_try

log = logging.getLogger("trainyard.webhooks")

PASS_SECONDS = 0.5  # how often the outbox is read
PER_PASS = 32  # deliveries tried in one pass
SENDERS = 4  # sends at once


def send(client: httpx.Client, due: Due) -> tuple[str, bool]:
    """One try: the status it ended with ("200", "503", "connection refused..."), and whether
    it was delivered (a 2xx answer)."""
    body = due.body.encode()
    headers = {
        "Content-Type": "application/json",
        SIGNATURE_HEADER: signature_header(due.secret, body),
        EVENT_HEADER: due.event,
        DELIVERY_HEADER: str(due.id),
    }
    try:
        answer = client.post(due.url, content=body, headers=headers)
    except httpx.HTTPError as exc:
        return f"{type(exc).__name__}: {exc}"[:500], False
    return str(answer.status_code), answer.is_success


def deliver_once(
    db: Database, settings: Settings, client: httpx.Client, pool: ThreadPoolExecutor
) -> int:
    """One pass: the due deliveries sent and their ends recorded; how many were tried."""
    with db.session() as session:
        due = due_deliveries(session, limit=PER_PASS)
    if not due:
        return 0
    ends = list(pool.map(lambda one: send(client, one), due))
    with db.session() as session:
        for one, (status, delivered) in zip(due, ends, strict=True):
            record_try(
                session,
                one,
                status,
                delivered=delivered,
                attempts=settings.webhook_attempts,
                retry=settings.webhook_retry_seconds,
            )
    return len(due)


def run_webhooks(db: Database, settings: Settings, stop: threading.Event) -> None:
    """Sends deliveries until `stop` is set: at once while more are due, else every
    PASS_SECONDS."""
    timeout = httpx.Timeout(settings.webhook_timeout_seconds)
    with (
        httpx.Client(timeout=timeout, follow_redirects=False) as client,
        ThreadPoolExecutor(SENDERS, thread_name_prefix="webhook") as pool,
    ):
        while not stop.is_set():
            try:
                tried = deliver_once(db, settings, client, pool)
            except Exception:
                log.exception("webhook pass failed; retrying")
                tried = 0
            if tried < PER_PASS:
                stop.wait(PASS_SECONDS)
