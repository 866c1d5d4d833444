"""/webhooks: registered, listed and removed, bounded, validated (a URL at an address that is
not public is refused, however spelled); and the outbox a job's end fills, tried and retried as
the scheduler's webhook thread records its tries (real SQL). No URL here is ever sent to: the
sends are tests/scheduler/daemon/test_webhooks.py's."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from api.app import create_app
from contract.settings import Settings
from contract.webhooks import Address, HostNotFound
from scheduler.store.jobs import get_job
from scheduler.store.lifecycle import transition
from scheduler.store.models import Sweep, User, Webhook, WebhookDelivery
from scheduler.store.states import JobState, SweepState
from scheduler.store.sweeps import end_sweep
from scheduler.store.webhooks import (
    LOOKUP_SECONDS,
    NO_ANSWER,
    answered,
    create_webhook,
    due_deliveries,
    record_try,
)
from tests.api.conftest import TestClient, make_settings

ROOT = Path(__file__).resolve().parents[2]
MLP = (ROOT / "examples" / "digits_mlp.yaml").read_text()
HOOKS = "/api/v1/webhooks"


@pytest.fixture
def api_settings(tmp_path: Path, migrated_sql_url: str, redis_url: str) -> Settings:
    return make_settings(tmp_path, migrated_sql_url, redis_url, webhooks_per_user=3)


def add(api: Any, url: str, events: list[str], user: str = "alice") -> Any:
    return api.client.post(HOOKS, json={"url": url, "events": events}, headers=api.auth(user))


def test_a_user_registers_lists_and_removes_webhooks(api: Any) -> None:
    made = add(api, "https://example.org/hook", ["job.failed", "job.finished"])
    assert made.status_code == 201, made.text
    hook = made.json()
    assert hook["secret"].startswith("whsec_") and len(hook["secret"]) > 40
    assert hook["events"] == ["job.finished", "job.failed"]  # in the events' own order
    assert (hook["last_status"], hook["pending"]) == (None, 0)
    listed = api.client.get(HOOKS, headers=api.auth()).json()
    assert [h["url"] for h in listed] == ["https://example.org/hook"]
    assert "secret" not in listed[0]  # shown once, at creation
    assert api.client.get(HOOKS, headers=api.auth("bob")).json() == []
    assert api.client.delete(f"{HOOKS}/{hook['id']}", headers=api.auth("bob")).status_code == 404
    assert api.client.delete(f"{HOOKS}/{hook['id']}", headers=api.auth()).status_code == 204
    assert api.client.get(HOOKS, headers=api.auth()).json() == []
    assert api.client.delete(f"{HOOKS}/{hook['id']}", headers=api.auth()).status_code == 404


def test_bad_webhooks_are_refused_and_their_number_bounded(api: Any) -> None:
    for url, events in (
        ("ftp://example.org/hook", ["job.failed"]),
        ("javascript:alert(1)", ["job.failed"]),
        ("http://", ["job.failed"]),
        ("https://example.org:99999/", ["job.failed"]),
        ("https://exa mple.org/", ["job.failed"]),
        ("https://example.org/" + "a" * 2000, ["job.failed"]),
        ("https://example.org/", ["job.started"]),
        ("https://example.org/", []),
    ):
        answer = add(api, url, events)
        assert answer.status_code == 422, (url, events, answer.text)
    assert api.client.get(HOOKS, headers=api.auth()).json() == []
    for i in range(3):
        assert add(api, f"https://example.org/{i}", ["job.failed"]).status_code == 201
    refused = add(api, "https://example.org/4", ["job.failed"])
    assert refused.status_code == 403 and "3 webhooks" in refused.json()["detail"]
    assert add(api, "https://example.org/4", ["job.failed"], user="bob").status_code == 201


# Hosts a webhook may not reach, each with what the 422 says of it (a name's answer unsaid).
NOT_PUBLIC = {
    "127.0.0.1": "127.0.0.1 is a loopback address",
    "localhost": "localhost resolves to a non-public address",  # /etc/hosts, read for real
    "[::1]": "::1 is a loopback address",
    "10.0.0.1": "10.0.0.1 is a private address",
    "192.168.1.20": "192.168.1.20 is a private address",
    "[fc00::1]": "fc00::1 is a private address",
    "169.254.169.254": "169.254.169.254 is a link-local address",  # cloud metadata
    "[fe80::1]": "fe80::1 is a link-local address",
    "0x7f000001": "0x7f000001 is a loopback address",
    "2130706433": "2130706433 is a loopback address",
    "017700000001": "017700000001 is a loopback address",
    "127.1": "127.1 is a loopback address",
    "[::ffff:127.0.0.1]": "::ffff:127.0.0.1 reaches 127.0.0.1, a loopback address",
    "[::ffff:a00:1]": "::ffff:a00:1 reaches 10.0.0.1, a private address",
    "[2002:7f00:1::]": "2002:7f00:1:: reaches 127.0.0.1, a loopback address",  # 6to4
    "0.0.0.0": "0.0.0.0 is an unspecified address",
    "[::]": ":: is an unspecified address",
    "224.0.0.1": "224.0.0.1 is a multicast address",
    "[ff02::1]": "ff02::1 is a multicast address",
    "240.0.0.1": "240.0.0.1 is a private address",  # reserved, which ipaddress counts private
    "100.64.0.1": "100.64.0.1 is a non-public address",  # carrier-grade NAT
}


@pytest.mark.parametrize("host", sorted(NOT_PUBLIC))
def test_webhooks_to_addresses_that_are_not_public_are_refused(api: Any, host: str) -> None:
    answer = add(api, f"http://{host}:8000/hook", ["job.failed"])
    assert answer.status_code == 422, answer.text
    detail = answer.json()["detail"]
    assert detail.startswith(f"url: {NOT_PUBLIC[host]}; webhooks are sent only to public"), detail
    assert "TRAINYARD_WEBHOOK_ALLOW" in detail
    assert api.client.get(HOOKS, headers=api.auth()).json() == []


def test_an_administrator_allows_networks_and_only_those(api: Any) -> None:
    allow = {"webhook_allow": "127.0.0.0/8, ::1/128,fd00::/8", "webhooks_per_user": 10}
    allowed = api.settings.model_copy(update=allow)
    with TestClient(create_app(allowed, web_dist=None)) as client:
        for host, status in (
            ("127.0.0.1", 201),
            ("localhost", 201),
            ("[::ffff:127.0.0.1]", 201),  # the IPv4 address it is
            ("[fd00::5]", 201),
            ("10.0.0.1", 422),
            ("169.254.169.254", 422),
            ("[fc00::1]", 422),
        ):
            answer = client.post(
                HOOKS,
                json={"url": f"http://{host}:8000/", "events": ["job.failed"]},
                headers=api.auth(),
            )
            assert answer.status_code == status, (host, answer.text)
    # The same host, on the server whose settings allow nothing: refused (bob's: alice holds
    # more hooks than this server's bound, which is checked first).
    assert add(api, "http://127.0.0.1:8000/", ["job.failed"], user="bob").status_code == 422


def test_a_registration_waits_for_its_hosts_addresses_a_bounded_time(api: Any) -> None:
    # A name whose DNS never answers: the system's resolver would try for many seconds, each
    # holding an API thread. The registration goes on after LOOKUP_SECONDS, the name unchecked
    # until its deliveries check it.
    release = threading.Event()

    def stuck(host: str, port: int) -> list[Address]:
        release.wait(30)
        raise HostNotFound(host)

    started = time.monotonic()
    try:
        with api.db.session() as session:
            alice = session.scalar(select(User).where(User.name == "alice"))
            assert alice is not None
            hook = create_webhook(
                session, alice, "https://slow.example/", ["job.failed"], limit=3, resolve=stuck
            )
            url = hook.url
    finally:
        release.set()
    assert LOOKUP_SECONDS <= time.monotonic() - started < LOOKUP_SECONDS + 3
    assert url == "https://slow.example/"


def test_a_jobs_end_waits_in_the_outbox_and_is_retried_then_given_up(api: Any) -> None:
    add(api, "https://example.org/failed", ["job.failed"])
    add(api, "https://example.org/finished", ["job.finished"])
    add(api, "https://example.org/other", ["job.failed"], user="bob")
    ids = [
        api.client.post("/api/v1/jobs", content=MLP, headers=api.yaml_headers()).json()["id"]
        for _ in range(3)
    ]
    with api.db.session() as session:
        alice = session.scalar(select(User).where(User.name == "alice"))
        assert alice is not None
        ends = (JobState.FAILED, JobState.CANCELLED, JobState.FAILED)
        for job_id, state in zip(ids, ends, strict=True):
            job = get_job(session, alice, job_id)
            job.error = "boom"
            transition(session, job, state, "test")
    with api.db.session() as session:
        due = due_deliveries(session, limit=10)
    # Alice's two failed jobs reach her job.failed hook; a cancelled job is no event, and
    # bob's hook hears nothing of alice's jobs.
    assert [(d.url, d.event) for d in due] == [("https://example.org/failed", "job.failed")] * 2
    body = json.loads(due[0].body)
    assert body["event"] == "job.failed" and body["data"]["job"]["id"] == ids[0]
    assert body["data"]["job"]["state"] == "FAILED" and body["data"]["job"]["error"] == "boom"
    with api.db.session() as session:
        record_try(session, due[0], answered(200), delivered=True, attempts=3, retry=60.0)
        record_try(session, due[1], answered(503), delivered=False, attempts=3, retry=60.0)
    with api.db.session() as session:
        assert due_deliveries(session, limit=10) == []  # the retry waits a minute
        waiting = session.scalars(select(WebhookDelivery)).all()
        assert [(w.attempts, w.event) for w in waiting] == [(1, "job.failed")]
        waiting[0].due_at = waiting[0].created_at  # its minute has passed
    listed = api.client.get(HOOKS, headers=api.auth()).json()
    status = "not delivered (HTTP 503); try 1 of 3, next in 60 s"
    assert (listed[0]["last_status"], listed[0]["pending"]) == (status, 1)
    for tries in (2, 3):
        with api.db.session() as session:
            (again,) = due_deliveries(session, limit=10)
            assert again.attempts == tries - 1
            record_try(session, again, NO_ANSWER, delivered=False, attempts=3, retry=0.0)
    listed = api.client.get(HOOKS, headers=api.auth()).json()
    assert listed[0]["last_status"] == "not delivered (no HTTP answer); gave up after try 3 of 3"
    assert listed[0]["pending"] == 0 and listed[0]["last_event"] == "job.failed"
    with api.db.session() as session:
        assert session.scalars(select(WebhookDelivery)).all() == []
        assert len(session.scalars(select(Webhook)).all()) == 3


def test_a_sweeps_end_is_an_event_for_its_owners_sweep_hooks(api: Any) -> None:
    add(api, "https://example.org/sweeps", ["sweep.finished"])
    add(api, "https://example.org/jobs", ["job.finished", "job.failed"])
    with api.db.session() as session:
        alice = session.scalar(select(User).where(User.name == "alice"))
        assert alice is not None
        sweep = Sweep(
            owner_id=alice.id,
            name="a-sweep",
            spec_yaml="name: a-sweep",
            base_job={},
            search={},
            study_name="webhook-test-study",
            best_trial=3,
            best_value=0.9,
        )
        session.add(sweep)
        session.flush()
        end_sweep(sweep, SweepState.SUCCEEDED)
    with api.db.session() as session:
        (due,) = due_deliveries(session, limit=10)
    assert (due.url, due.event) == ("https://example.org/sweeps", "sweep.finished")
    sent = json.loads(due.body)["data"]["sweep"]
    assert (sent["name"], sent["state"], sent["best_trial"]) == ("a-sweep", "SUCCEEDED", 3)
