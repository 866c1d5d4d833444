"""The node agent's check of the parameter-server Redis servers, against the session's real
redis-server (with a password), a port nothing listens on and a socket that never answers."""

from __future__ import annotations

import socket
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from contract.allocation import AllocationInfo
from contract.codec import decode
from contract.keys import Keys
from contract.nodes import NodeRegistration
from contract.settings import Settings, with_user
from scheduler.agent.node_agent import Agent, create_agent
from scheduler.agent.ps_reach import unreachable_ps
from scheduler.cli.redis_server import free_port


def closed_url(password: str = "s3cret-ps") -> tuple[str, str]:
    """A Redis URL (with a password) of a port nothing listens on, and its host:port."""
    port = free_port()
    return f"redis://:{password}@127.0.0.1:{port}/0", f"127.0.0.1:{port}"


def address(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.hostname}:{parts.port}"


@pytest.fixture
def silent_socket() -> Iterator[str]:
    """A listening socket that accepts connections and never answers: a hung server."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(4)
        yield f"127.0.0.1:{sock.getsockname()[1]}"


def test_a_closed_port_is_reported_with_its_address_and_never_the_password(
    redis_url: str,
) -> None:
    url, where = closed_url()
    started = time.monotonic()
    found = unreachable_ps([redis_url, url, redis_url])
    assert found == [f"{where}: connection refused"]
    assert time.monotonic() - started < 2.0
    assert unreachable_ps([redis_url]) == []


def test_a_wrong_password_and_a_hung_server_are_unreachable_too(
    redis_url: str, silent_socket: str
) -> None:
    wrong = redis_url.replace(urlsplit(redis_url).password or "", "not-the-password")
    started = time.monotonic()
    found = unreachable_ps([wrong, f"redis://:pw@{silent_socket}/0"], timeout=0.5)
    assert time.monotonic() - started < 3.0  # the timeout bounds each server's check
    assert len(found) == 2 and "not-the-password" not in "".join(found)
    assert found[0].startswith(f"{address(redis_url)}: ") and "password" in found[0]
    assert found[1].startswith(f"{silent_socket}: timeout"), found[1]


@pytest.fixture
def agent(tmp_path: Path, redis_url: str) -> Iterator[Agent]:
    url, _ = closed_url()
    settings = Settings(
        data_dir=tmp_path,
        redis_url=redis_url,
        redis_ps_urls=f"{redis_url},{url}",
        redis_prefix=f"t{uuid.uuid4().hex[:8]}",
        node_name="node-2",
        node_gpus=0,
    )
    made = create_agent(settings)
    yield made
    made.client.close()


def test_the_agent_registers_what_it_cannot_reach(agent: Agent, redis_url: str) -> None:
    closed = agent.settings.ps_urls()[1]
    key = Keys(agent.settings.redis_prefix).node("node-2")
    assert agent.check_ps() == [f"{address(closed)}: connection refused"]
    agent.heartbeat()
    fields = decode(agent.client.hgetall(key))
    registration = NodeRegistration.from_hash(fields)
    assert registration.ps_unreachable == (f"{address(closed)}: connection refused",)
    password = urlsplit(closed).password
    assert password and not any(password in value for value in fields.values())
    # Every server answers again: the next check and heartbeat say so.
    agent.settings = agent.settings.model_copy(update={"redis_ps_urls": redis_url})
    assert agent.check_ps() == []
    agent.heartbeat()
    assert NodeRegistration.from_hash(decode(agent.client.hgetall(key))).ps_unreachable == ()


def test_a_process_logs_in_as_its_job_on_every_redis_or_as_the_agent_without_job_users(
    agent: Agent, redis_url: str
) -> None:
    info = AllocationInfo(
        allocation_id=7,
        job_id=3,
        role="worker",
        group=0,
        rank=0,
        world=1,
        slots=1,
        gpus=0,
        node="node-2",
        framework="downpour",
        topology={},
        spec={},
        run_dir=Path("/runs/3"),
    )
    user = Keys(agent.settings.redis_prefix).job_user(3)
    url, ps_urls = agent.worker_urls(info, "job-pw")
    expected = [with_user(u, user, "job-pw") for u in (redis_url, *agent.settings.ps_urls())]
    assert [url, *ps_urls.split(",")] == expected
    # The scheduler created no user for it (its setting differs): it does not run as the agent.
    with pytest.raises(ValueError, match="TRAINYARD_REDIS_JOB_USERS alike"):
        agent.worker_urls(info, "")
    agent.settings = agent.settings.model_copy(update={"redis_job_users": False})
    assert agent.worker_urls(info, "") == (redis_url, agent.settings.redis_ps_urls)
