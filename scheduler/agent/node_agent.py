"""The node agent (`trainyard node`): a Celery worker on its node's own queue, plus heartbeats.

It needs only Redis and the shared artifact directory. It registers the node in Redis
(Keys.node(name): slots, GPUs, queue, heartbeat, the parameter-server Redis servers it cannot
reach) and refreshes that every heartbeat_seconds; the scheduler turns it into a SQL Node row
and marks it lost when the heartbeats stop.

A plugin that fails to load (dsl/plugins.py) does not stop the agent: it registers the node
with the error (`plugin_error`), which placement skips and the node card shows, and takes no
jobs (no Celery worker, no worker processes) until it is stopped.

The task `trainyard.run_allocation(allocation_id)` is thin and idempotent: it claims the
allocation once, reports RUNNING, hands the allocation to a worker process, supervises it
(cancel -> kill its process group) and reports how it ended, all on the job's stream. A step of
the start that fails (the claim, its Redis login, its memory cgroup, the fork, whatever raises)
is reported there too, as the process FAILED with the step and the error (`NotStarted`), so its
job's recovery decides and its user sees why; what cannot even be reported is caught by the
scheduler's start timeout (scheduler/daemon/starts.py).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import redis
from celery import Celery
from celery.signals import worker_shutting_down

from contract.allocation import (
    CGROUP,
    CLAIMED,
    FINISHED,
    PID,
    REDIS_PASSWORD,
    SEEN,
    AllocationInfo,
    AllocationState,
    ExitCode,
    not_started,
    stop_requested,
)
from contract.codec import decode
from contract.keys import FINISHED_TTL_SECONDS, Keys
from contract.nodes import NodeRegistration
from contract.settings import Settings, with_user
from contract.stream import JobStream, StateRecord
from dsl.plugins import PluginError, load_plugins
from dsl.plugins import versions as plugin_versions
from scheduler.agent.confine import MemoryCgroups
from scheduler.agent.processes import ForkServer, FreshProcesses, Launcher, WorkerProcess
from scheduler.agent.ps_reach import PS_CHECK_SECONDS, unreachable_ps
from scheduler.celery_app import RUN_ALLOCATION, create_celery, node_queue

log = logging.getLogger("trainyard.agent")

SUPERVISE_SECONDS = 0.25
# A stopped job's worker process sees the stop itself (workers.entry.StopPoll, every 0.1 s)
# and exits, freeing its slot at once; its group is killed if it has not within this time.
STOP_GRACE_SECONDS = 1.0
# How long a draining worker may take to save its restart point and exit (within the
# 10 seconds `docker compose stop` waits before it kills).
DRAIN_SECONDS = 8.0
# A plugin's error, as registered: its message and the start of its traceback's last line.
PLUGIN_ERROR_CHARS = 2000

# The agent's secrets its worker processes (and its fork server) do not inherit: its own Redis
# logins, which reach every job's keys, and the database's. A process gets its job's Redis URLs
# instead (Agent.worker_urls).
SECRET_ENV = (
    "REDIS_URL",
    "TRAINYARD_REDIS_URL",
    "REDIS_PS_URLS",
    "TRAINYARD_REDIS_PS_URLS",
    "DATABASE_URL",
    "TRAINYARD_DATABASE_URL",
)


def exit_cause(code: int) -> str:
    """Why a process exited with `code`, in words (a negative code is the signal)."""
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"killed by {name}" + (", perhaps out of memory" if -code == 9 else "")
    if code == ExitCode.DIVERGED:
        return "the loss diverged; not restarted, as it would diverge again"
    return "failed" if code == ExitCode.FAILED else f"exit code {code}"


def stop_orphan(pid: int) -> bool:
    """SIGKILL the process group of `pid` if it is a worker process; whether one was."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    if b"workers.entry" not in cmdline:
        return False  # the pid was reused by another program
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
    return True


def detect_gpus(settings: Settings) -> int:
    if settings.node_gpus is not None:
        return settings.node_gpus
    import torch  # only when the operator did not say; importing it takes seconds

    return int(torch.cuda.device_count())


def entry_command(settings: Settings) -> list[str]:
    """The worker's command line. The Redis URLs (with their passwords) reach it over the fork
    server's socket or in its environment (REDIS_URL, REDIS_PS_URLS), never here: any local
    user can read a process's command line."""
    assert settings.redis_url is not None
    return [
        sys.executable,
        "-m",
        "workers.entry",
        "--prefix",
        settings.redis_prefix,
        "--cache-dir",
        str(settings.cache_dir()),
    ]


def worker_env() -> dict[str, str]:
    """The agent's environment without its secrets (SECRET_ENV)."""
    return {name: value for name, value in os.environ.items() if name not in SECRET_ENV}


def create_launcher(settings: Settings) -> Launcher:
    if settings.fork_workers:
        return ForkServer(entry_command(settings), worker_env())
    return FreshProcesses(entry_command(settings), worker_env())


class NotStarted(Exception):
    """A step of an allocation's start failed; the message is the reason its job is told."""


@contextlib.contextmanager
def starting(step: str) -> Iterator[None]:
    """Whatever `step` raises (a Redis command its user may not run, a file system that will not
    write, a fork that fails, a plugin that raises in the fork server) as a `NotStarted` that
    names the step."""
    try:
        yield
    except NotStarted:
        raise
    except Exception as exc:
        raise NotStarted(not_started(step, exc)) from exc


@dataclass(frozen=True)
class Outcome:
    state: AllocationState
    reason: str
    exit_code: int | None


@dataclass
class Agent:
    settings: Settings
    client: redis.Redis
    gpus: int
    launcher: Launcher
    shutdown: threading.Event = field(default_factory=threading.Event)
    # The parameter-server Redis servers the last check could not reach, "host:port: error".
    ps_unreachable: list[str] = field(default_factory=list)
    # Why a plugin failed to load here ("" when all loaded): the node takes no jobs.
    plugin_error: str = ""
    # Where its processes' memory cgroups go (None: the machine lets it make none; each
    # worker then limits itself, workers/confine.py).
    cgroups: MemoryCgroups | None = None

    @property
    def keys(self) -> Keys:
        return Keys(self.settings.redis_prefix)

    @property
    def name(self) -> str:
        return self.settings.node_name

    @property
    def queue(self) -> str:
        return node_queue(self.settings, self.name)

    # -- registration ---------------------------------------------------------------------------
    def heartbeat(self) -> None:
        pipe = self.client.pipeline(transaction=False)
        registration = NodeRegistration(
            queue=self.queue,
            slots=self.settings.node_slots,
            gpus=self.gpus,
            heartbeat=time.time(),
            host=socket.gethostname(),
            pid=os.getpid(),
            draining=self.shutdown.is_set(),
            ps_unreachable=tuple(self.ps_unreachable),
            plugins=tuple(f"{name}={version}" for name, version in plugin_versions().items()),
            plugin_error=self.plugin_error,
            memory_mb=self.settings.node_memory(),
        )
        pipe.hset(self.keys.node(self.name), mapping=registration.to_hash())  # type: ignore[arg-type]
        # A node that dies unannounced drops out of Redis too, so a scheduler started later
        # does not take it for alive.
        pipe.expire(self.keys.node(self.name), self.registration_ttl)
        pipe.sadd(self.keys.nodes, self.name)
        pipe.execute()

    @property
    def registration_ttl(self) -> int:
        s = self.settings
        return math.ceil(2 * max(s.node_timeout_seconds, 3 * s.heartbeat_seconds))

    def heartbeat_loop(self, stop: threading.Event) -> None:
        while not stop.wait(self.settings.heartbeat_seconds):
            try:
                self.heartbeat()
            except redis.RedisError as exc:  # keep trying: Redis may come back
                log.warning("heartbeat failed: %s", exc)

    def check_ps(self) -> list[str]:
        """PING every parameter-server Redis this node's processes would use (REDIS_PS_URLS);
        the next heartbeat tells the scheduler which did not answer."""
        found = unreachable_ps(self.settings.ps_urls())
        if found and found != self.ps_unreachable:
            log.warning("cannot reach parameter-server Redis %s", "; ".join(found))
        elif self.ps_unreachable and not found:
            log.info("every parameter-server Redis answers again")
        self.ps_unreachable = found
        return found

    def ps_check_loop(self, stop: threading.Event) -> None:
        # Apart from the heartbeats: a server that does not answer takes the check seconds.
        while not stop.wait(PS_CHECK_SECONDS):
            self.check_ps()

    def deregister(self) -> None:
        """A clean exit: the scheduler sees the node gone at its next sync."""
        pipe = self.client.pipeline(transaction=False)
        pipe.delete(self.keys.node(self.name))
        pipe.srem(self.keys.nodes, self.name)
        pipe.execute()

    # -- the task -------------------------------------------------------------------------------
    def run_allocation(self, allocation_id: int) -> str:
        key = self.keys.allocation(allocation_id)
        fields = decode(self.client.hgetall(key))
        if not fields:
            log.warning("allocation %s is not in Redis; ignored", allocation_id)
            return "missing"
        info = AllocationInfo.from_hash(allocation_id, fields)
        try:
            with starting(f"its node agent on {self.name} could not claim it"):
                if not self.client.hsetnx(key, CLAIMED, f"{self.name} {time.time():.3f}"):
                    return "already claimed"
                # Remembered until its end is reported: an agent that starts again reconciles
                # these.
                self.client.sadd(self.keys.node_claims(self.name), str(allocation_id))
            outcome = self._run(info, fields.get(REDIS_PASSWORD, ""))
        except NotStarted as exc:
            log.error("allocation %s (job %s) %s", allocation_id, info.job_id, exc)
            outcome = Outcome(AllocationState.FAILED, str(exc), None)
        return self._report(info, outcome)

    def _report(self, info: AllocationInfo, outcome: Outcome) -> str:
        """Its end on the job's stream, then in its record; the state reported ("unreported"
        when the stream could not be written: the scheduler's timeouts write it off)."""
        key = self.keys.allocation(info.allocation_id)
        stream = JobStream(self.client, self.keys, info.job_id, info.attempt)
        try:
            stream.publish(
                StateRecord(info.allocation_id, outcome.state, outcome.reason, outcome.exit_code)
            )
        except redis.RedisError as exc:
            log.error(
                "allocation %s (job %s) ended %s (%s) and could not say so on its stream: %s",
                info.allocation_id,
                info.job_id,
                outcome.state,
                outcome.reason,
                exc,
            )
            return "unreported"
        pipe = self.client.pipeline(transaction=False)
        pipe.hset(key, FINISHED, outcome.state)
        pipe.expire(key, FINISHED_TTL_SECONDS)
        pipe.srem(self.keys.node_claims(self.name), str(info.allocation_id))
        try:
            pipe.execute()
        except redis.RedisError as exc:  # its end is on the stream, which is what counts
            log.warning("allocation %s: its record keeps no end: %s", info.allocation_id, exc)
        return str(outcome.state)

    def reconcile(self) -> list[int]:
        """At start: the allocations an earlier run of this agent claimed and never reported
        ended (it was killed, or its machine restarted). A process of theirs still running
        is an orphan nobody supervises: it is stopped. Each is reported failed, so its job
        restarts from its restart point instead of holding its slots forever."""
        claims_key = self.keys.node_claims(self.name)
        members: set[bytes] = self.client.smembers(claims_key)  # type: ignore[assignment]
        reported = []
        for raw in sorted(members, key=int):
            allocation_id = int(raw)
            fields = decode(self.client.hgetall(self.keys.allocation(allocation_id)))
            if not fields or FINISHED in fields:
                self.client.srem(claims_key, raw)
                continue
            info = AllocationInfo.from_hash(allocation_id, fields)
            pid = int(fields.get(PID, "0") or 0)
            stopped = pid > 0 and stop_orphan(pid)
            what = f"its process {pid} was stopped" if stopped else "its process was gone"
            reason = f"the node agent on {self.name} restarted; {what}"
            self._report(info, Outcome(AllocationState.FAILED, reason, None))
            log.warning("allocation %s (job %s): %s", allocation_id, info.job_id, reason)
            reported.append(allocation_id)
        return reported

    def worker_urls(self, info: AllocationInfo, password: str) -> tuple[str, str]:
        """The Redis URL the allocation's process logs in with and its parameter-server Redis
        URLs (comma-separated): its job's own user, or, where jobs have no users of their own
        (TRAINYARD_REDIS_JOB_USERS=false), the agent's."""
        assert self.settings.redis_url is not None
        urls = [self.settings.redis_url, *self.settings.ps_urls()]
        if self.settings.redis_job_users:
            if not password:
                raise ValueError(
                    "the scheduler gave this allocation no Redis login of its own; set "
                    "TRAINYARD_REDIS_JOB_USERS alike for the scheduler and the node agents"
                )
            user = self.keys.job_user(info.job_id)
            urls = [with_user(url, user, password) for url in urls]
        return urls[0], ",".join(urls[1:])

    def _run(self, info: AllocationInfo, password: str) -> Outcome:
        """Start the allocation's process, each step named (NotStarted), and supervise it."""
        with starting("its stop flag could not be read"):
            if stop_requested(self.client, self.keys, info.job_id, info.allocation_id):
                return Outcome(AllocationState.CANCELLED, self._stop_reason(info), None)
        with starting("its start could not be reported"):
            JobStream(self.client, self.keys, info.job_id, info.attempt).publish(
                StateRecord(info.allocation_id, AllocationState.RUNNING, reason=f"on {self.name}")
            )
        with starting("its Redis login could not be made"):
            url, ps_urls = self.worker_urls(info, password)
        key = self.keys.allocation(info.allocation_id)
        cgroup = None
        if self.cgroups is not None and info.memory_mb > 0:
            with starting("its memory cgroup could not be made"):
                cgroup = self.cgroups.make(f"alloc-{info.allocation_id}", info.memory_mb)
        try:
            if cgroup is not None:
                with starting("its memory cgroup could not be recorded"):
                    self.client.hset(key, CGROUP, str(cgroup))  # the process joins it first thing
            with starting("its worker process could not be started"), self._vouching(info):
                process = self.launcher.run(info.allocation_id, url, ps_urls)
            try:
                with starting("its worker process could not be recorded"):
                    self.client.hset(key, PID, str(process.pid))
                if cgroup is not None and self.cgroups is not None:
                    # It joins by itself too; whichever is first, nothing of it runs unconfined
                    # long.
                    with contextlib.suppress(OSError):
                        self.cgroups.add(cgroup, process.pid)
                return self._supervise(info, process, cgroup)
            finally:
                if process.alive():
                    process.kill_group()
        finally:
            if cgroup is not None and self.cgroups is not None:
                self.cgroups.remove(cgroup)

    @contextlib.contextmanager
    def _vouching(self, info: AllocationInfo) -> Iterator[None]:
        """While a start blocks (a fork server still importing torch, up to WARM_UP_SECONDS on
        a busy machine), the allocation's seen time is refreshed as `_supervise` refreshes it:
        it has been reported RUNNING, and the scheduler writes off a running process nobody
        vouches for within the node timeout."""
        key, done = self.keys.allocation(info.allocation_id), threading.Event()

        def vouch() -> None:
            while True:
                try:
                    self.client.hset(key, SEEN, repr(time.time()))
                except redis.RedisError as exc:  # as a heartbeat: Redis may come back
                    log.warning("allocation %s: seen time not written: %s", info.allocation_id, exc)
                if done.wait(self.settings.heartbeat_seconds):
                    return

        thread = threading.Thread(target=vouch, name=f"vouch-{info.allocation_id}", daemon=True)
        thread.start()
        try:
            yield
        finally:
            done.set()
            thread.join()

    def _supervise(
        self, info: AllocationInfo, process: WorkerProcess, cgroup: Path | None
    ) -> Outcome:
        seen = -float("inf")
        while True:
            code = process.wait(SUPERVISE_SECONDS)
            if code is not None:
                if cgroup is not None and self.cgroups and self.cgroups.oom_kills(cgroup):
                    code = ExitCode.OUT_OF_MEMORY  # the kernel's SIGKILL, for its limit
                return self._outcome(info, process, code)
            process.sample_memory()
            now = time.monotonic()
            if now - seen >= self.settings.heartbeat_seconds:
                # The scheduler writes off a process whose agent stops saying it supervises
                # it (a stuck agent, or Redis restarted empty and the records with it).
                self.client.hset(self.keys.allocation(info.allocation_id), SEEN, repr(time.time()))
                seen = now
            if self.shutdown.is_set():
                # A drain: the worker saves a restart point on SIGTERM and the job is placed
                # again (here later, or on another node), not failed.
                code = process.drain(DRAIN_SECONDS)
                return Outcome(
                    AllocationState.DRAINED, f"the node agent on {self.name} stopped", code
                )
            if stop_requested(self.client, self.keys, info.job_id, info.allocation_id):
                code = process.wait(STOP_GRACE_SECONDS)
                if code is None:
                    code = process.kill_group()
                return Outcome(AllocationState.CANCELLED, self._stop_reason(info), code)

    def _outcome(self, info: AllocationInfo, process: WorkerProcess, code: int) -> Outcome:
        if code == ExitCode.OK:
            return Outcome(AllocationState.DONE, "finished", code)
        if code == ExitCode.CANCELLED:
            return Outcome(AllocationState.CANCELLED, self._stop_reason(info), code)
        output = process.output_tail()
        if code == ExitCode.OUT_OF_MEMORY:
            # The recovery policy reads this first line: the job fails, not restarted.
            how = (
                f"exceeded its {info.memory_mb} MB limit\n"
                f"(peak memory {process.peak_memory()}; exit code {code})"
            )
            return Outcome(AllocationState.FAILED, f"{how}\n{output}" if output else how, code)
        how = f"exited {code} ({exit_cause(code)}; peak memory {process.peak_memory()})"
        return Outcome(AllocationState.FAILED, f"{how}\n{output}" if output else how, code)

    def _stop_reason(self, info: AllocationInfo) -> str:
        if self.client.exists(self.keys.cancel(info.job_id)):
            return "cancelled"
        return "stopped by the scheduler"


def register_tasks(app: Celery, agent: Agent) -> None:
    # Acknowledged when it ends, its result ignored: the application's settings (celery_app.py).
    @app.task(name=RUN_ALLOCATION)
    def run_allocation(allocation_id: int) -> str:
        return agent.run_allocation(int(allocation_id))


def load_plugins_reporting() -> str:
    """Load the plugins (dsl/plugins.py); the error of one that fails, "" when all loaded."""
    try:
        load_plugins()
    except PluginError as exc:
        log.error("%s; this node takes no jobs until its agent restarts without it", exc)
        return str(exc)[:PLUGIN_ERROR_CHARS]
    return ""


def create_agent(settings: Settings, plugin_error: str = "") -> Agent:
    if not settings.redis_url:
        raise RuntimeError(
            "a node agent needs the stack's Redis: set REDIS_URL (or TRAINYARD_REDIS_URL)"
        )
    return Agent(
        settings=settings,
        client=redis.Redis.from_url(settings.redis_url),
        gpus=detect_gpus(settings),
        launcher=create_launcher(settings),
        plugin_error=plugin_error,
        cgroups=MemoryCgroups.find(settings.node_name),
    )


def serve_plugin_error(agent: Agent) -> None:
    """A node whose plugin failed to load: registered with the error, heartbeating so that the
    cluster page shows it, taking no jobs (no Celery worker consumes its queue), until
    SIGTERM/SIGINT."""
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    agent.reconcile()  # what an earlier run of this agent left is reported all the same
    agent.heartbeat()
    try:
        while not stop.wait(agent.settings.heartbeat_seconds):
            try:
                agent.heartbeat()
            except redis.RedisError as exc:
                log.warning("heartbeat failed: %s", exc)
    finally:
        agent.deregister()


def run_agent(settings: Settings) -> None:
    """Run a node agent in the foreground until SIGTERM/SIGINT."""
    agent = create_agent(settings, plugin_error=load_plugins_reporting())
    if agent.plugin_error:
        serve_plugin_error(agent)
        return
    app = create_celery(settings)
    register_tasks(app, agent)

    def on_shutdown(**_: object) -> None:
        # Celery's warm shutdown waits for running tasks; make them drain their processes,
        # and tell the scheduler to place nothing new here meanwhile.
        agent.shutdown.set()
        with contextlib.suppress(redis.RedisError):
            agent.heartbeat()  # its registration says it is draining

    worker_shutting_down.connect(on_shutdown, weak=False)
    settings.cache_dir().mkdir(parents=True, exist_ok=True)
    agent.launcher.start()
    agent.reconcile()
    agent.check_ps()
    agent.heartbeat()
    stop = threading.Event()
    for loop in (agent.heartbeat_loop, agent.ps_check_loop):
        threading.Thread(target=loop, args=(stop,), daemon=True).start()
    log.info(
        "node %s: %d slot(s), %d GPU(s), %d MB for workers (%s), queue %s",
        agent.name,
        settings.node_slots,
        agent.gpus,
        settings.node_memory(),
        f"memory cgroups v{agent.cgroups.version}" if agent.cgroups else "RLIMIT_DATA",
        agent.queue,
    )
    try:
        app.worker_main(
            [
                "worker",
                "--pool=threads",
                f"--concurrency={settings.node_slots}",
                f"--queues={agent.queue}",
                f"--hostname={agent.name}@trainyard",
                "--loglevel=INFO",
                "--without-gossip",
                "--without-mingle",
                "--without-heartbeat",
            ]
        )
    finally:
        stop.set()
        agent.launcher.close()
        agent.deregister()
        if agent.cgroups is not None:
            agent.cgroups.close()
