"""The scheduler's webhook thread: sends the deliveries that are due (the outbox that
scheduler/store/webhooks.py fills in the transactions that end jobs and sweeps), signed with
each hook's secret (contract/webhooks.py), and records each try's end.

A thread of the scheduler process rather than a Celery task: the outbox in SQL already is the
queue (bounded per hook, kept across restarts), so a broker would only add a second copy of
it; the node agents' Celery queues carry training processes, which a slow receiver must never
hold up. The thread never blocks the placement loop: it shares nothing with it but the
database. Its sends go through a few threads of their own, each bounded by
`webhook_timeout_seconds`, so one slow receiver delays the others of a pass at most that long.

Each send resolves the hook's host, refuses it unless every address is one a webhook may reach
(contract/webhooks.py: public, or in the networks of `webhook_allow`), and connects to the
address it checked: a name whose answer changes after the check (DNS rebinding) reaches nothing
new. Redirects are not followed, and an answer's body is never read.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import httpx

from contract.settings import Settings
from contract.webhooks import (
    DELIVERY_HEADER,
    EVENT_HEADER,
    SIGNATURE_HEADER,
    HostNotFound,
    Network,
    Resolver,
    refusal,
    resolve,
    signature_header,
)
from scheduler.store.database import Database
from scheduler.store.webhooks import (
    HOST_NOT_FOUND,
    NO_ANSWER,
    REFUSED,
    Due,
    answered,
    due_deliveries,
    record_try,
)

log = logging.getLogger("trainyard.webhooks")

PASS_SECONDS = 0.5  # how often the outbox is read
PER_PASS = 32  # deliveries tried in one pass
SENDERS = 4  # sends at once
PORTS = {"http": 80, "https": 443}


@dataclass(frozen=True)
class Sender:
    """What sending needs besides the delivery: the HTTP client, the networks an administrator
    allows, and the resolver (a test gives one whose answer changes)."""

    client: httpx.Client
    allow: tuple[Network, ...] = ()
    resolve: Resolver = resolve


def http_client(settings: Settings) -> httpx.Client:
    """The client deliveries are sent with. No connection is kept for the next send (nor can
    one be, as `send` reads no answer's body): a pool knows a connection by its address alone,
    and one made, its TLS verified, for one host's name must not carry a request for another
    name at the same address. Its own transport: no proxy of the environment, which would
    resolve the name again."""
    return httpx.Client(
        timeout=httpx.Timeout(settings.webhook_timeout_seconds),
        follow_redirects=False,
        transport=httpx.HTTPTransport(limits=httpx.Limits(max_keepalive_connections=0)),
    )


def send(sender: Sender, due: Due) -> tuple[str, bool]:
    """One try: why it ended as it did (scheduler/store/webhooks.py's words: "HTTP 204",
    "refused: address not allowed"...), and whether it was delivered (a 2xx answer)."""
    try:
        url = httpx.URL(due.url)
        host = url.raw_host.decode("ascii")
        addresses = sender.resolve(host, url.port or PORTS[url.scheme])
    except HostNotFound:
        return HOST_NOT_FOUND, False
    except (httpx.InvalidURL, KeyError, UnicodeError):
        return NO_ANSWER, False
    refusals = [why for one in addresses if (why := refusal(one, sender.allow))]
    if refusals or not addresses:
        why = "; ".join(refusals) or "no address"
        log.warning("webhook %d not sent to %s: %s", due.webhook_id, host, why)
        return REFUSED, False
    body = due.body.encode()
    headers = {
        "Host": url.netloc.decode("ascii"),
        "Content-Type": "application/json",
        SIGNATURE_HEADER: signature_header(due.secret, body),
        EVENT_HEADER: due.event,
        DELIVERY_HEADER: str(due.id),
    }
    # To the address checked above, never the name resolved again; the Host header and TLS
    # (the name sent as SNI, the certificate checked against it) keep the name.
    pinned = url.copy_with(host=str(addresses[0]))
    extensions = {"sni_hostname": host} if url.scheme == "https" else {}
    try:
        request = sender.client.build_request(
            "POST", pinned, content=body, headers=headers, extensions=extensions
        )
        answer = sender.client.send(request, follow_redirects=False, stream=True)
    except (httpx.HTTPError, httpx.InvalidURL):
        return NO_ANSWER, False
    answer.close()  # its body unread: a receiver cannot make the scheduler hold a large one
    return answered(answer.status_code), answer.is_success


def deliver_once(db: Database, settings: Settings, sender: Sender, pool: ThreadPoolExecutor) -> int:
    """One pass: the due deliveries sent and their ends recorded; how many were tried."""
    with db.session() as session:
        due = due_deliveries(session, limit=PER_PASS)
    if not due:
        return 0
    ends = list(pool.map(lambda one: send(sender, one), due))
    with db.session() as session:
        for one, (reason, delivered) in zip(due, ends, strict=True):
            record_try(
                session,
                one,
                reason,
                delivered=delivered,
                attempts=settings.webhook_attempts,
                retry=settings.webhook_retry_seconds,
            )
    return len(due)


def run_webhooks(db: Database, settings: Settings, stop: threading.Event) -> None:
    """Sends deliveries until `stop` is set: at once while more are due, else every
    PASS_SECONDS."""
    with (
        http_client(settings) as client,
        ThreadPoolExecutor(SENDERS, thread_name_prefix="webhook") as pool,
    ):
        sender = Sender(client, tuple(settings.webhook_networks()))
        while not stop.is_set():
            try:
                tried = deliver_once(db, settings, sender, pool)
            except Exception:
                log.exception("webhook pass failed; retrying")
                tried = 0
            if tried < PER_PASS:
                stop.wait(PASS_SECONDS)
