"""The scheduler's webhook thread sending for real: a receiver (an `http.server` on this
machine's loopback, in a thread of this test), the session's real Redis as a port that does
not speak HTTP, real SQL on both backends and the system's resolver, except where a test must
control what a name resolves to (DNS rebinding): there a resolver whose answer changes between
the check at registration and the delivery stands in for the system's, because the system's
answers come from /etc/hosts and DNS, which a test may not change under the other tests.

The receiver runs on 127.0.0.1, which a webhook may not reach unless an administrator allows
it: the tests that deliver to it set `webhook_allow` to loopback, and the tests of refusals
leave it unset."""

from __future__ import annotations

import json
import ssl
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from ipaddress import IPv4Address
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from sqlalchemy import select

from contract.settings import Settings
from contract.webhooks import Address, HostNotFound, verify
from scheduler.cli.redis_server import free_port
from scheduler.daemon.webhooks import Sender, deliver_once, http_client
from scheduler.store.database import Database
from scheduler.store.models import Webhook, WebhookDelivery, utcnow
from scheduler.store.users import create_user
from scheduler.store.webhooks import create_webhook

LOOPBACK = IPv4Address("127.0.0.1")
PUBLIC = IPv4Address("93.184.215.14")  # never connected to: every test refuses it first


@dataclass
class Got:
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class Receiver:
    """Answers 204, or what `answers` says for a path; keeps every request it gets (and, over
    TLS, the name each connection asked for: its SNI)."""

    port: int
    scheme: str = "http"
    answers: dict[str, tuple[int, dict[str, str]]] = field(default_factory=dict)
    got: list[Got] = field(default_factory=list)
    names: list[str | None] = field(default_factory=list)

    def url(self, path: str, host: str = "127.0.0.1") -> str:
        return f"{self.scheme}://{host}:{self.port}{path}"


@contextmanager
def receiving(tls: ssl.SSLContext | None = None) -> Iterator[Receiver]:
    """A receiver on 127.0.0.1, served by a thread; over TLS with `tls`."""
    holder: list[Receiver] = []

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keeps a connection open for the next request

        def do_POST(self) -> None:
            found = holder[0]
            body = self.rfile.read(int(self.headers["Content-Length"]))
            found.got.append(Got(self.path, dict(self.headers), body))
            status, headers = found.answers.get(self.path, (204, {}))
            self.send_response(status)
            for name, value in {**headers, "Content-Length": "0"}.items():
                self.send_header(name, value)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            return None

    class Server(ThreadingHTTPServer):
        def handle_error(self, request: Any, client_address: Any) -> None:
            return None  # a refused handshake is what a test expects, not news

    server = Server(("127.0.0.1", 0), Handler)
    holder.append(Receiver(server.server_address[1], "https" if tls else "http"))
    if tls is not None:
        tls.sni_callback = lambda _socket, name, _context: holder[0].names.append(name)
        server.socket = tls.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield holder[0]
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with receiving() as found:
        yield found


def authority_and_server(tmp_path: Path, name: str) -> tuple[Path, ssl.SSLContext]:
    """A certificate authority of this test's (its certificate's file, for SSL_CERT_FILE),
    and a server's TLS context whose certificate it signed for `name` alone."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    def certificate(
        subject: str, key: ec.EllipticCurvePrivateKey, issuer: x509.Certificate | None
    ) -> x509.Certificate:
        now = datetime.now(UTC)
        named = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
        builder = (
            x509.CertificateBuilder()
            .subject_name(named)
            .issuer_name(issuer.subject if issuer else named)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - timedelta(minutes=5))
            .not_valid_after(now + timedelta(hours=1))
        )
        if issuer is None:
            builder = builder.add_extension(x509.BasicConstraints(ca=True, path_length=0), True)
        else:
            builder = builder.add_extension(
                x509.SubjectAlternativeName([x509.DNSName(subject)]), critical=False
            )
        return builder.sign(ca_key if issuer else key, hashes.SHA256())

    ca_key, server_key = (
        ec.generate_private_key(ec.SECP256R1()),
        ec.generate_private_key(ec.SECP256R1()),
    )
    ca = certificate("test authority", ca_key, None)
    leaf = certificate(name, server_key, ca)
    ca_file, chain, key_file = tmp_path / "ca.pem", tmp_path / "server.pem", tmp_path / "key.pem"
    ca_file.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    chain.write_bytes(leaf.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        server_key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(chain, key_file)
    return ca_file, context


@pytest.fixture
def store(migrated_sql_url: str) -> Iterator[Database]:
    database = Database(migrated_sql_url)
    yield database
    database.dispose()


def settings_of(tmp_path: Path, **extra: Any) -> Settings:
    return Settings(data_dir=tmp_path, **extra)


def changing(answers: dict[str, list[list[Address]]]) -> Callable[[str, int], list[Address]]:
    """A resolver whose answer for a name is the next of its list at each question."""

    def resolve(host: str, port: int) -> list[Address]:
        if not answers.get(host):
            raise HostNotFound(host)
        return answers[host].pop(0)

    return resolve


def with_delivery(store: Database, url: str, **create: Any) -> int:
    """A hook of alice's on `url` with one delivery due: registered through the store's
    checks when `create` gives them (allow, resolve), else written as a row, as a hook
    registered before the checks was; its id."""
    with store.session() as session:
        alice = create_user(session, f"alice-{urlsplit(url).path.strip('/')}", False)
        if create:
            hook = create_webhook(session, alice, url, ["job.failed"], limit=10, **create)
        else:
            hook = Webhook(owner_id=alice.id, url=url, events=["job.failed"], secret="whsec_x")
            session.add(hook)
            session.flush()
        body = json.dumps({"id": "d1", "event": "job.failed", "data": {"job": {"id": 1}}})
        session.add(
            WebhookDelivery(webhook_id=hook.id, event="job.failed", body=body, due_at=utcnow())
        )
        session.commit()
        return hook.id


def deliver(store: Database, settings: Settings, resolve: Any = None) -> dict[int, str | None]:
    """One pass of the webhook thread; each hook's last status after it."""
    with http_client(settings) as client, ThreadPoolExecutor(1) as pool:  # in order
        allow = tuple(settings.webhook_networks())
        sender = Sender(client, allow, resolve) if resolve else Sender(client, allow)
        deliver_once(store, settings, sender, pool)
    with store.session() as session:
        return {hook.id: hook.last_status for hook in session.scalars(select(Webhook))}


def test_a_delivery_goes_to_the_address_checked_under_its_own_name(
    tmp_path: Path, store: Database, receiver: Receiver
) -> None:
    # hooks.test is no name the system resolves: only a send to the address this resolver
    # gave, not to the name resolved again, reaches the receiver.
    resolve = changing({"hooks.test": [[LOOPBACK], [LOOPBACK]]})
    allow = {"webhook_allow": "127.0.0.0/8"}  # the receiver is on loopback
    settings = settings_of(tmp_path, **allow)
    url = receiver.url("/hook", host="hooks.test")
    hook_id = with_delivery(store, url, allow=settings.webhook_networks(), resolve=resolve)
    assert deliver(store, settings, resolve) == {hook_id: "delivered (HTTP 204)"}
    (got,) = receiver.got
    assert (got.path, got.headers["Host"]) == ("/hook", f"hooks.test:{receiver.port}")
    with store.session() as session:
        secret = session.get_one(Webhook, hook_id).secret
    assert verify(secret, got.body, got.headers["Trainyard-Signature"])


def test_a_name_that_resolves_elsewhere_after_its_check_reaches_nothing(
    tmp_path: Path, store: Database, receiver: Receiver
) -> None:
    # DNS rebinding: public when the hook is registered, loopback (alone, or beside a public
    # address) when it is sent to.
    resolve = changing(
        {"rebind.test": [[PUBLIC], [LOOPBACK]], "mixed.test": [[PUBLIC], [PUBLIC, LOOPBACK]]}
    )
    settings = settings_of(tmp_path)
    rebound = with_delivery(store, receiver.url("/a", host="rebind.test"), resolve=resolve)
    mixed = with_delivery(store, receiver.url("/b", host="mixed.test"), resolve=resolve)
    refused = "not delivered (refused: address not allowed); try 1 of 5, next in 1 s"
    assert deliver(store, settings, resolve) == {rebound: refused, mixed: refused}
    assert receiver.got == []


def test_over_https_the_name_is_the_tls_servers_name_though_the_address_was_checked(
    tmp_path: Path, store: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A certificate for hooks.test alone: the delivery to 127.0.0.1 must ask for hooks.test
    # (SNI) and check the certificate against it; other.test, the same address under another
    # name and sent next, fails the check on a connection of its own (not the one kept from
    # hooks.test's delivery).
    ca_file, tls = authority_and_server(tmp_path, "hooks.test")
    monkeypatch.setenv("SSL_CERT_FILE", str(ca_file))  # the client trusts the test's authority
    resolve = changing({name: [[LOOPBACK]] * 2 for name in ("hooks.test", "other.test")})
    settings = settings_of(tmp_path, webhook_allow="127.0.0.0/8")  # the receiver is on loopback
    checks = {"allow": settings.webhook_networks(), "resolve": resolve}
    with receiving(tls) as secure:
        named = with_delivery(store, secure.url("/named", host="hooks.test"), **checks)
        other = with_delivery(store, secure.url("/other", host="other.test"), **checks)
        statuses = deliver(store, settings, resolve)
    assert statuses == {
        named: "delivered (HTTP 204)",
        other: "not delivered (no HTTP answer); try 1 of 5, next in 1 s",
    }
    assert [got.path for got in secure.got] == ["/named"]
    assert sorted(secure.names, key=str) == ["hooks.test", "other.test"]


def test_hooks_registered_before_the_check_are_refused_at_delivery_however_spelled(
    tmp_path: Path, store: Database, receiver: Receiver
) -> None:
    hosts = ["127.0.0.1", "0x7f000001", "2130706433", "017700000001", "127.1", "localhost"]
    hosts.append("[::ffff:127.0.0.1]")
    ids = [with_delivery(store, receiver.url(f"/{i}", host=host)) for i, host in enumerate(hosts)]
    statuses = deliver(store, settings_of(tmp_path))
    refused = "not delivered (refused: address not allowed); try 1 of 5, next in 1 s"
    assert statuses == dict.fromkeys(ids, refused)
    assert receiver.got == []


def test_redirects_are_not_followed(tmp_path: Path, store: Database, receiver: Receiver) -> None:
    receiver.answers["/hook"] = (307, {"Location": receiver.url("/elsewhere")})
    settings = settings_of(tmp_path, webhook_allow="127.0.0.1/32")  # the receiver's
    hook_id = with_delivery(store, receiver.url("/hook"))
    status = "not delivered (HTTP 307); try 1 of 5, next in 1 s"
    assert deliver(store, settings) == {hook_id: status}
    assert [got.path for got in receiver.got] == ["/hook"]


def test_a_hooks_last_status_says_how_a_try_ended_in_general_words(
    tmp_path: Path, store: Database, receiver: Receiver, redis_url: str
) -> None:
    # What the finding read from last_status: which local ports answer, and what (Redis
    # closing on an HTTP request, a refused connection). Both are now the same words.
    receiver.answers["/busy"] = (503, {})
    redis = urlsplit(redis_url)
    urls = {
        "delivered": receiver.url("/ok"),
        "busy": receiver.url("/busy"),
        "closed": f"http://127.0.0.1:{free_port()}/closed",
        "redis": f"http://{redis.hostname}:{redis.port}/redis",
        "no host": "http://nowhere.invalid/nowhere",
    }
    allow = {"webhook_allow": "127.0.0.0/8", "webhook_attempts": 2}  # the receiver is on loopback
    settings = settings_of(tmp_path, **allow)
    ids = {name: with_delivery(store, url) for name, url in urls.items()}
    first = deliver(store, settings)
    assert {name: first[hook_id] for name, hook_id in ids.items()} == {
        "delivered": "delivered (HTTP 204)",
        "busy": "not delivered (HTTP 503); try 1 of 2, next in 1 s",
        "closed": "not delivered (no HTTP answer); try 1 of 2, next in 1 s",
        "redis": "not delivered (no HTTP answer); try 1 of 2, next in 1 s",
        "no host": "not delivered (host not found); try 1 of 2, next in 1 s",
    }
    with store.session() as session:
        for delivery in session.scalars(select(WebhookDelivery)):
            delivery.due_at = utcnow()
        session.commit()
    last = deliver(store, settings)
    assert last[ids["redis"]] == "not delivered (no HTTP answer); gave up after try 2 of 2"
    assert last[ids["busy"]] == "not delivered (HTTP 503); gave up after try 2 of 2"
