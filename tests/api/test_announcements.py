"""The API announces new jobs and sweeps on Redis (contract/announcements.py); the scheduler's relay
wakes the loop that acts on each. A real Redis, a real subscriber thread, real routes."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from contract.announcements import JOB, SWEEP, relay
from tests.api.conftest import example
from tests.api.test_sweeps import SWEEP as SWEEP_DOCUMENT


class Relay:
    def __init__(self, api: Any) -> None:
        self.stop = threading.Event()
        self.woken = {JOB: threading.Event(), SWEEP: threading.Event()}
        self.thread = threading.Thread(
            target=relay, args=(api.redis, api.keys, self.stop, self.woken)
        )
        self.thread.start()
        deadline = time.monotonic() + 10
        while not api.redis.pubsub_numsub(api.keys.announcements)[0][1]:
            assert time.monotonic() < deadline, "the relay never subscribed"
            time.sleep(0.01)


@pytest.fixture
def relayed(api: Any) -> Iterator[Relay]:
    running = Relay(api)
    yield running
    running.stop.set()
    running.thread.join(timeout=10)
    assert not running.thread.is_alive()


def test_a_submitted_job_wakes_placement_and_a_sweep_the_sweep_thread(
    api: Any, relayed: Relay
) -> None:
    api.submit(example("digits_mlp.yaml"))
    assert relayed.woken[JOB].wait(10) and not relayed.woken[SWEEP].is_set()
    relayed.woken[JOB].clear()
    response = api.client.post("/api/v1/sweeps", content=SWEEP_DOCUMENT, headers=api.yaml_headers())
    assert response.status_code == 201, response.text
    assert relayed.woken[SWEEP].wait(10) and not relayed.woken[JOB].is_set()


def test_a_refused_submission_announces_nothing(api: Any, relayed: Relay) -> None:
    response = api.client.post(
        "/api/v1/jobs", content="name: [unclosed", headers=api.yaml_headers()
    )
    assert response.status_code == 422
    api.redis.publish(api.keys.announcements, "")  # an empty message is ignored, too
    api.redis.publish(api.keys.announcements, "sweep 1")  # a marker: the relay got this far
    assert relayed.woken[SWEEP].wait(10)
    assert not relayed.woken[JOB].is_set()
