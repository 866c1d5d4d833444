"""No job waits on a failure it cannot see: real processes whose start is broken for real.

A node agent (`trainyard node`, a subprocess) and the scheduler (its loop in a thread, one per
test, each with the start timeout the test needs) log in to the session's real redis-server as
Redis users of their own with their roles' rights, as under `trainyard up`; a SQLite file; the
API in-process, through which each test reads the job's detail and events as its user would.
Each test breaks one step with the real thing: a real `ACL SETUSER` takes a right away from the
agent's or the scheduler's Redis user, the agent's folder of memory cgroups is removed under it,
or SIGSTOP stops the agent.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import threading
import time
import uuid
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest
import redis
from sqlalchemy import select

from api.app import create_app
from contract.keys import Keys
from contract.settings import Settings, with_user
from harness.service_cluster import Cluster, stop_process
from scheduler.daemon.loop import run_scheduler
from scheduler.store.database import Database, migrate
from scheduler.store.models import Node
from scheduler.store.states import JobState, NodeState
from scheduler.store.users import create_token, create_user, get_user

warnings.filterwarnings("ignore", message="Using `httpx` with `starlette.testclient`")

from fastapi.testclient import TestClient  # noqa: E402  (after its deprecation filter)

pytestmark = pytest.mark.slow

NODE = "node-s"
# Long: the node must not be lost (nor its tasks sent again) while a test stops its agent, so
# that what writes the job off is the start timeout.
NODE_TIMEOUT = 300.0
SHORT_START = 5.0  # the start timeout of the test that stops the agent
SILENT = 8.0  # the node timeout of the test that holds the fork server for twice as long
WAIT = 120.0  # how long a test waits for an outcome on a busy 2-core machine


@dataclass
class Stack:
    cluster: Cluster
    api: TestClient
    token: str
    users: dict[str, str]  # role -> its Redis user

    def detail(self, job_id: int) -> dict[str, Any]:
        response = self.api.get(f"/api/v1/jobs/{job_id}", headers=self.auth)
        assert response.status_code == 200, response.text
        body: dict[str, Any] = response.json()
        return body

    def events(self, job_id: int) -> list[tuple[str, str]]:
        response = self.api.get(f"/api/v1/jobs/{job_id}/events", headers=self.auth)
        assert response.status_code == 200, response.text
        return [(event["state"], event["reason"]) for event in response.json()]

    @property
    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    def acl(self, role: str, *rules: str) -> None:
        """A real `ACL SETUSER` on the role's Redis user."""
        self.cluster.client.execute_command("ACL", "SETUSER", self.users[role], *rules)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> Iterator[Stack]:
    data_dir = tmp_path_factory.mktemp("start-data")
    prefix = f"n{uuid.uuid4().hex[:8]}"
    keys = Keys(prefix)
    admin = redis.Redis.from_url(redis_url)
    users, urls = {}, {}
    for role in ("scheduler", "agent"):
        users[role], password = keys.role_user(role), secrets.token_urlsafe(16)
        rules = keys.role_user_rules(role)
        admin.execute_command("ACL", "SETUSER", users[role], "on", f">{password}", *rules)
        urls[role] = with_user(redis_url, users[role], password)
    settings = Settings(
        data_dir=data_dir,
        redis_url=urls["scheduler"],
        redis_prefix=prefix,
        heartbeat_seconds=0.5,
        node_timeout_seconds=NODE_TIMEOUT,
        schedule_seconds=0.1,
    )
    migrate(settings.sql_url())
    cluster = Cluster(settings, Database(settings.sql_url()), admin, keys, {}, data_dir)
    cluster.vital = (NODE,)
    env = cluster.environment(
        TRAINYARD_NODE_NAME=NODE, TRAINYARD_NODE_SLOTS="2", TRAINYARD_NODE_GPUS="0"
    )
    env["REDIS_URL"] = urls["agent"]
    cluster.spawn(NODE, "node", env)
    with cluster.db.session() as session:
        user = get_user(session, "alice") or create_user(session, "alice")
        token = create_token(session, user, "tests")
    api_settings = settings.model_copy(update={"redis_url": redis_url})
    try:
        with TestClient(create_app(api_settings)) as api:
            yield Stack(cluster, api, token, users)
    finally:
        for process in cluster.agents.values():
            stop_process(process)
        for name in users.values():
            admin.execute_command("ACL", "DELUSER", name)
        cluster.db.dispose()
        admin.close()


@contextlib.contextmanager
def scheduler(stack: Stack, **changes: Any) -> Iterator[Settings]:
    """The scheduler's loop in a thread with `changes` to the module's settings, until the
    test ends; the jobs a failed test left unfinished are cancelled first."""
    settings = stack.cluster.settings.model_copy(update=changes)
    stop = threading.Event()
    thread = threading.Thread(target=run_scheduler, args=(settings, stop), daemon=True)
    thread.start()
    try:
        stack.cluster.wait_for(f"{NODE} to be alive", lambda: node_state(stack) == NodeState.ALIVE)
        yield settings
    finally:
        for job_id in stack.cluster.cancel_unfinished():
            with contextlib.suppress(AssertionError):
                stack.cluster.wait_state(job_id, *TERMINAL, timeout=30)
        stop.set()
        thread.join(timeout=60)


TERMINAL = tuple(state for state in JobState if state.terminal)


def node_state(stack: Stack) -> str | None:
    with stack.cluster.db.session() as session:
        return session.scalar(select(Node.state).where(Node.name == NODE))


def test_an_agent_whose_redis_user_may_not_claim_fails_the_job_with_the_reason(
    stack: Stack,
) -> None:
    """The agent's Redis user loses the right to HSETNX, with which it claims an allocation:
    it cannot start the job's process, and says so on the job's stream. The job is placed
    again once (cluster.max_restarts 1), fails the same way, and ends FAILED well before the
    start timeout, the agent's words in its error and events as the API serves them."""
    cluster = stack.cluster
    with scheduler(stack) as settings:
        stack.acl("agent", "-hsetnx")
        try:
            job_id = cluster.submit(train_steps=20, **{"cluster.max_restarts": 1})
            took = cluster.wait_state(job_id, *TERMINAL, timeout=WAIT)
        finally:
            stack.acl("agent", "+hsetnx")
        assert took < settings.start_timeout_seconds
    detail = stack.detail(job_id)
    assert detail["state"] == JobState.FAILED
    said = f"did not start: its node agent on {NODE} could not claim it (NoPermissionError: "
    assert detail["error"].startswith(said), detail["error"]
    assert "'hsetnx'" in detail["error"]
    events = stack.events(job_id)
    assert [state for state, _ in events] == [
        "QUEUED", "SCHEDULED", "QUEUED", "SCHEDULED", "FAILED",
    ]  # fmt: skip
    assert events[2][1].startswith(f"worker 0/0 on {NODE} {said}")
    assert events[2][1].endswith("; restart 1 of 1 from step 0")
    assert events[-1][1] == f"worker 0/0 on {NODE} failed: {detail['error']}"
    assert cluster.agents[NODE].poll() is None  # the agent lived through it


def test_a_scheduler_whose_redis_user_may_not_make_job_users_fails_the_job_with_the_reason(
    stack: Stack,
) -> None:
    """The scheduler's Redis user loses the right to manage users: the job's own Redis user
    cannot be made, so its process cannot be dispatched; the job fails at once
    (cluster.max_restarts 0) with Redis's refusal, not SCHEDULED for ever."""
    cluster = stack.cluster
    with scheduler(stack):
        stack.acl("scheduler", "-acl")
        try:
            job_id = cluster.submit(train_steps=20, **{"cluster.max_restarts": 0})
            cluster.wait_state(job_id, *TERMINAL, timeout=WAIT)
        finally:
            stack.acl("scheduler", "+acl")
    detail = stack.detail(job_id)
    assert detail["state"] == JobState.FAILED
    said = "did not start: the scheduler could not make its job's Redis user (NoPermissionError: "
    assert detail["error"].startswith(said), detail["error"]
    assert stack.events(job_id)[-1] == ("FAILED", f"worker 0/0 on {NODE} failed: {detail['error']}")


def test_a_job_whose_agent_is_stopped_fails_within_the_start_timeout(stack: Stack) -> None:
    """SIGSTOP holds the agent before it takes the job's task: nothing reports the process
    started or why not. After the start timeout (a short one here; its node is not lost for
    minutes) the job fails (cluster.max_restarts 0) and says why."""
    cluster = stack.cluster
    agent = cluster.agents[NODE]
    with scheduler(stack, start_timeout_seconds=SHORT_START):
        os.kill(agent.pid, signal.SIGSTOP)
        try:
            job_id = cluster.submit(train_steps=20, **{"cluster.max_restarts": 0})
            cluster.wait_state(job_id, *TERMINAL, timeout=WAIT)
            assert node_state(stack) == NodeState.ALIVE  # not written off as a lost node
        finally:
            os.kill(agent.pid, signal.SIGCONT)
    detail = stack.detail(job_id)
    assert detail["state"] == JobState.FAILED
    said = (
        f"worker 0/0 on {NODE} did not start within {SHORT_START:g}s "
        "(TRAINYARD_START_TIMEOUT_SECONDS): nothing reported it started or why it could not"
    )
    assert detail["error"].startswith(said), detail["error"]
    assert detail["error"].endswith("(no restarts left: cluster.max_restarts is 0)")
    assert stack.events(job_id)[-1] == ("FAILED", detail["error"])
    # Continued, the agent finds the process written off (its stop flag) and starts nothing.
    [(alloc, _)] = cluster.allocations(job_id)
    cluster.wait_for(
        "the agent to report the written-off process",
        lambda: cluster.client.hget(cluster.keys.allocation(alloc.id), "finished") is not None,
        timeout=WAIT,
    )
    assert cluster.client.hget(cluster.keys.allocation(alloc.id), "pid") is None


def test_a_start_held_longer_than_the_node_timeout_is_not_written_off(stack: Stack) -> None:
    """The node's fork server is held (SIGSTOP) while the job's process is reported RUNNING and
    the agent waits for the fork, for twice the node timeout, as a fork server still importing
    torch on a busy machine holds it: the agent vouches for the process meanwhile (its seen
    time), so the scheduler does not write it off as silent, and the job ends SUCCEEDED with
    no restart."""
    cluster = stack.cluster
    agent = psutil.Process(cluster.agents[NODE].pid)

    def fork_servers() -> list[psutil.Process]:
        return [p for p in agent.children(recursive=True) if "--fork-server" in p.cmdline()]

    with scheduler(stack, node_timeout_seconds=SILENT):
        cluster.wait_for("the agent's fork server", lambda: len(fork_servers()) == 1)
        [fork_server] = fork_servers()
        fork_server.suspend()
        try:
            job_id = cluster.submit(train_steps=20, **{"cluster.max_restarts": 1})
            cluster.wait_state(job_id, JobState.RUNNING, timeout=WAIT)
            time.sleep(2 * SILENT)
        finally:
            fork_server.resume()
        cluster.wait_state(job_id, *TERMINAL, timeout=WAIT)
    assert stack.detail(job_id)["state"] == JobState.SUCCEEDED, stack.events(job_id)
    states = [state for state, _ in stack.events(job_id)]
    assert states == ["QUEUED", "SCHEDULED", "RUNNING", "SUCCEEDED"], stack.events(job_id)


def agent_cgroups(pid: int) -> Path | None:
    """The folder the agent makes its processes' memory cgroups in (scheduler/agent/confine.py),
    below its own cgroup; None where the machine let it make none."""
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            root = Path("/sys/fs/cgroup/memory")
        elif controllers == "":
            root = Path("/sys/fs/cgroup")
        else:
            continue
        folder = root / path.lstrip("/") / f"trainyard-{NODE}-{pid}"
        if folder.is_dir():
            return folder
    return None


def test_a_memory_cgroup_that_cannot_be_made_fails_the_job_with_the_reason(stack: Stack) -> None:
    """The agent's folder of memory cgroups is removed under it (as a machine's cgroup
    manager may): the cgroup of the job's process cannot be made, and the job fails
    (cluster.max_restarts 0) with the step and the error."""
    cluster = stack.cluster
    folder = agent_cgroups(cluster.agents[NODE].pid)
    if folder is None:
        pytest.skip("this machine lets the node agent make no memory cgroups")
    with scheduler(stack):
        folder.rmdir()  # empty: no process of the agent's runs
        try:
            job_id = cluster.submit(train_steps=20, **{"cluster.max_restarts": 0})
            cluster.wait_state(job_id, *TERMINAL, timeout=WAIT)
        finally:
            folder.mkdir()
    detail = stack.detail(job_id)
    assert detail["state"] == JobState.FAILED
    said = "did not start: its memory cgroup could not be made (FileNotFoundError: "
    assert detail["error"].startswith(said), detail["error"]
    assert stack.events(job_id)[-1] == ("FAILED", f"worker 0/0 on {NODE} failed: {detail['error']}")
    assert cluster.agents[NODE].poll() is None
