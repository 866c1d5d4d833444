"""Webhooks and the environment of a run against the session's real stack: a receiver (an
`http.server` in a thread of this test, on loopback, which the stack's TRAINYARD_WEBHOOK_ALLOW
admits: tests/conftest.py) gets signed deliveries for a finished and a failed job, the first
refused once and retried; the webhook commands manage hooks; a finished job's environment is
its worker's, shown by `trainyard show`."""

from __future__ import annotations

import hashlib
import hmac
import json
import platform
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import torch
from typer.testing import CliRunner, Result

from scheduler.cli.main import app
from trainyard import Client, Job
from trainyard.models import WebhookCreated

if TYPE_CHECKING:
    from conftest import RunningStack

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
DIGITS = ROOT / "examples" / "digits_mlp.yaml"
QUICK = {"train_steps": 30, "disp_freq": 10, "test.freq": 30, "checkpoint.freq": 0}


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes
    answered: int


@dataclass
class Receiver:
    """Answers 500 to the first delivery it gets and 200 to every other; keeps them all."""

    url: str
    got: list[Received] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def accepted(self) -> list[Received]:
        with self.lock:
            return [one for one in self.got if one.answered == 200]


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    holder: list[Receiver] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            found = holder[0]
            with found.lock:
                status = 500 if not found.got else 200
                found.got.append(Received(self.path, dict(self.headers), body, status))
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            return None

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    holder.append(Receiver(f"http://127.0.0.1:{server.server_address[1]}/hook"))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield holder[0]
    server.shutdown()
    server.server_close()


def verified(secret: str, delivery: Received) -> dict[str, Any]:
    """The delivery's body, once its signature is checked as a receiver would, by hand."""
    header = delivery.headers["Trainyard-Signature"]
    parts = dict(item.split("=", 1) for item in header.split(","))
    stamp = parts["t"]
    assert abs(time.time() - int(stamp)) < 300
    expected = hmac.new(
        secret.encode(), stamp.encode() + b"." + delivery.body, hashlib.sha256
    ).hexdigest()
    assert hmac.compare_digest(expected, parts["v1"])
    forged = hmac.new(b"another secret", stamp.encode() + b"." + delivery.body, hashlib.sha256)
    assert forged.hexdigest() != parts["v1"]
    body: dict[str, Any] = json.loads(delivery.body)
    assert delivery.headers["Trainyard-Event"] == body["event"]
    return body


def run(stack: RunningStack, *args: str) -> Result:
    environment: dict[str, str | None] = {
        "TRAINYARD_DATA_DIR": str(stack.data_dir),
        "TRAINYARD_URL": None,
        "TRAINYARD_TOKEN": None,
        "COLUMNS": "200",
    }
    return CliRunner().invoke(app, list(args), env=environment)


@dataclass
class Ended:
    client: Client
    hook: WebhookCreated
    finished: Job
    failed: Job


@pytest.fixture(scope="module")
def ended(stack: RunningStack, receiver: Receiver) -> Ended:
    """A hook on the receiver, then a job that finishes and one that fails (its loss
    diverges), both run to their end."""
    client = Client(stack.url, stack.token)
    for hook in client.webhooks():  # another test's hooks would hear these jobs too
        client.remove_webhook(hook.id)
    hook = client.add_webhook(receiver.url, ["job.finished", "job.failed"])
    finished = client.submit(DIGITS, overrides=QUICK)
    failed = client.submit(DIGITS, overrides={**QUICK, "updater.lr.base": 1e38})
    assert isinstance(finished, Job) and isinstance(failed, Job)
    finished.wait(timeout=120, poll=0.2)
    failed.wait(timeout=120, poll=0.2)
    return Ended(client, hook, finished, failed)


def test_signed_deliveries_for_a_finished_and_a_failed_job(
    stack: RunningStack, receiver: Receiver, ended: Ended
) -> None:
    client, hook, finished, failed = ended.client, ended.hook, ended.finished, ended.failed
    assert (finished.state, failed.state) == ("SUCCEEDED", "FAILED")
    deadline = time.monotonic() + 30
    bodies: dict[int, dict[str, Any]] = {}
    while not {finished.id, failed.id} <= bodies.keys():
        assert time.monotonic() < deadline, f"deliveries: {receiver.got}"
        time.sleep(0.1)
        for delivery in receiver.accepted():
            body = verified(hook.secret, delivery)
            bodies[body["data"]["job"]["id"]] = body
    assert bodies[finished.id]["event"] == "job.finished"
    assert bodies[finished.id]["data"]["job"]["state"] == "SUCCEEDED"
    assert bodies[failed.id]["event"] == "job.failed"
    assert "diverged" in bodies[failed.id]["data"]["job"]["error"]
    # The first try was refused (500) and sent again: the same delivery, signed anew.
    first = receiver.got[0]
    assert first.answered == 500
    again = [d for d in receiver.accepted() if d.body == first.body]
    assert again and again[0].headers["Trainyard-Delivery"] == first.headers["Trainyard-Delivery"]
    # Other jobs of this user on the shared stack end meanwhile: wait for the outbox to empty.
    deadline = time.monotonic() + 30
    while True:
        (listed,) = [h for h in client.webhooks() if h.id == hook.id]
        if listed.pending == 0 or time.monotonic() >= deadline:
            break
        time.sleep(0.1)
    assert (listed.last_status, listed.pending) == ("delivered (HTTP 200)", 0)

    shown = run(stack, "webhooks", "list")
    assert shown.exit_code == 0 and receiver.url in shown.stdout and "200" in shown.stdout
    removed = run(stack, "webhooks", "remove", str(hook.id))
    assert removed.exit_code == 0, removed.output
    assert all(h.id != hook.id for h in client.webhooks())


def test_the_webhook_commands(stack: RunningStack) -> None:
    added = run(stack, "webhooks", "add", "https://example.org/hook", "--events", "sweep.finished")
    assert added.exit_code == 0, added.output
    found = re.search(r"webhook (\d+): https://example.org/hook \(sweep.finished\)", added.stdout)
    assert found and re.search(r"secret whsec_\S{40,}", added.stdout)
    listed = json.loads(run(stack, "webhooks", "list", "--json").stdout)
    assert {"id": int(found.group(1)), "events": ["sweep.finished"]}.items() <= next(
        h for h in listed if h["id"] == int(found.group(1))
    ).items()
    unknown = run(stack, "webhooks", "add", "https://example.org/", "--events", "job.started")
    assert unknown.exit_code == 2 and "job.started" in unknown.output
    refused = run(stack, "webhooks", "add", "ftp://example.org/")
    assert refused.exit_code != 0 and "http" in refused.output
    assert run(stack, "webhooks", "remove", found.group(1)).exit_code == 0
    assert run(stack, "webhooks", "remove", found.group(1)).exit_code != 0


def test_a_jobs_environment_is_its_workers(stack: RunningStack, ended: Ended) -> None:
    job = ended.finished
    (first,) = job.environment().processes
    assert (first.group, first.rank) == (0, 0)
    assert (first.python, first.torch) == (platform.python_version(), torch.__version__)
    assert first.cpu_count > 0 and first.hostname == platform.node()
    packages = job.packages()
    assert f"torch=={torch.__version__}" in packages and len(packages) == first.packages_total
    expected = hashlib.sha256("\n".join(packages).encode()).hexdigest()
    assert first.packages_hash == expected
    shown = run(stack, "show", str(job.id))
    assert shown.exit_code == 0, shown.output
    assert f"python {first.python}   torch {first.torch}" in shown.stdout
    assert f"packages {first.packages_total} (sha256 {expected[:16]}" in shown.stdout
    as_json = json.loads(run(stack, "show", str(job.id), "--json", "--packages").stdout)
    assert as_json["environment"]["processes"][0]["packages_hash"] == expected
    assert as_json["packages"] == packages
