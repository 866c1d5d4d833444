"""A cluster of real service processes on this machine: node agents (`trainyard node`) and
the scheduler (`trainyard scheduler`) as subprocesses of their own, so that each can be killed
and started again, over a redis-server and a SQLite file; helpers to submit jobs and wait on
their states. The fault tests (tests/scheduler/test_faults.py and
tests/scheduler/agent/test_node_agent.py) and the fault campaign (bench/faults.py) use it;
tests import it as `harness.service_cluster`."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import redis
from sqlalchemy import select

from contract.keys import Keys
from contract.settings import Settings
from dsl.compiler import compile_job
from dsl.layers.base import BuildContext
from dsl.topology import resolve_topology
from scheduler.placement.cluster import node_capacities
from scheduler.store.database import Database, migrate
from scheduler.store.jobs import NewJob, create_job, request_cancel
from scheduler.store.models import Allocation, Job, JobEvent, Metric, Node
from scheduler.store.states import JobState
from scheduler.store.users import create_user, get_user

ROOT = Path(__file__).resolve().parents[1]
JOB_TEXT = (ROOT / "examples" / "digits_mlp.yaml").read_text()
DIGITS = BuildContext(sample_shape=(1, 8, 8), num_classes=10)
TIMEOUT = 120.0  # a cold start imports torch in fresh processes; slow on a busy 2-core machine


class ClusterError(AssertionError):
    """A wait that timed out, or a vital process that died (with the processes' logs)."""


@dataclass
class Cluster:
    settings: Settings
    db: Database
    client: redis.Redis
    keys: Keys
    agents: dict[str, subprocess.Popen[bytes]]  # every process started, by name
    logs: Path
    vital: tuple[str, ...] = ("node-1",)  # processes whose death fails a wait at once

    def environment(self, **extra: str) -> dict[str, str]:
        """The environment of a `trainyard node` or `trainyard scheduler` of this cluster."""
        drop = ("TRAINYARD_", "REDIS_", "DATABASE_URL")
        env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
        s = self.settings
        env.update(
            REDIS_URL=str(s.redis_url),
            TRAINYARD_REDIS_PREFIX=s.redis_prefix,
            TRAINYARD_DATA_DIR=str(s.data_dir),
            TRAINYARD_HEARTBEAT_SECONDS=repr(s.heartbeat_seconds),
            TRAINYARD_NODE_TIMEOUT_SECONDS=repr(s.node_timeout_seconds),
            TRAINYARD_SCHEDULE_SECONDS=repr(s.schedule_seconds),
            TRAINYARD_START_TIMEOUT_SECONDS=repr(s.start_timeout_seconds),
            TRAINYARD_SCHEDULER_LEASE_SECONDS=repr(s.scheduler_lease_seconds),
            TRAINYARD_RESTART_POINT_SECONDS=repr(s.restart_point_seconds),
            **extra,
        )
        if s.redis_ps_urls:
            env.setdefault("REDIS_PS_URLS", s.redis_ps_urls)
        return env

    def spawn(self, name: str, command: str, env: dict[str, str]) -> subprocess.Popen[bytes]:
        with (self.logs / f"{name}.log").open("ab") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", "scheduler", command],
                cwd=ROOT,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.agents[name] = process
        return process

    def start_agent(self, name: str, slots: int) -> subprocess.Popen[bytes]:
        env = self.environment(
            TRAINYARD_NODE_NAME=name, TRAINYARD_NODE_SLOTS=str(slots), TRAINYARD_NODE_GPUS="0"
        )
        return self.spawn(name, "node", env)

    def start_scheduler(self, name: str = "scheduler") -> subprocess.Popen[bytes]:
        """`trainyard scheduler` as a process of its own, to be killed and started again."""
        return self.spawn(name, "scheduler", self.environment())

    def submit(self, **overrides: object) -> int:
        spec = compile_job(JOB_TEXT, DIGITS, overrides=overrides).spec
        with self.db.session() as session:
            owner = get_user(session, "alice") or create_user(session, "alice")
            job = create_job(
                session,
                owner,
                NewJob(
                    name=spec.name,
                    spec_yaml=JOB_TEXT,
                    overrides=dict(overrides),
                    spec=spec.model_dump(mode="json", exclude_unset=True),
                    topology=resolve_topology(spec.cluster, spec.pipeline).to_dict(),
                    framework=spec.cluster.framework,
                    train_steps=spec.train_steps,
                ),
            )
            return job.id

    def job(self, job_id: int) -> Job:
        with self.db.session() as session:
            job = session.get(Job, job_id)
            assert job is not None
            return job

    def allocations(self, job_id: int) -> list[tuple[Allocation, str]]:
        with self.db.session() as session:
            rows = session.execute(
                select(Allocation, Node.name)
                .join(Node, Node.id == Allocation.node_id)
                .where(Allocation.job_id == job_id)
                .order_by(Allocation.id)
            ).all()
            return [(alloc, name) for alloc, name in rows]

    def events(self, job_id: int) -> list[tuple[str, str]]:
        with self.db.session() as session:
            rows = session.scalars(
                select(JobEvent).where(JobEvent.job_id == job_id).order_by(JobEvent.id)
            ).all()
            return [(e.state, e.reason) for e in rows]

    def cancel(self, job_id: int) -> None:
        with self.db.session() as session:
            job = session.get(Job, job_id)
            assert job is not None
            request_cancel(session, job, self.client, self.keys)

    def cancel_unfinished(self) -> list[int]:
        """Cancel every job not yet ended (what a failed test left running, which would hold
        the slots that the next test's jobs wait for); their ids."""
        with self.db.session() as session:
            jobs = session.scalars(select(Job)).all()
            running = [job for job in jobs if not JobState(job.state).terminal]
            for job in running:
                request_cancel(session, job, self.client, self.keys)
            return [job.id for job in running]

    def wait_for(self, what: str, check: Callable[[], bool], timeout: float = TIMEOUT) -> float:
        started = time.monotonic()
        while time.monotonic() - started < timeout:
            if check():
                return time.monotonic() - started
            for name, agent in self.agents.items():
                if agent.poll() is not None and name in self.vital:
                    raise ClusterError(f"{name} died:\n{(self.logs / f'{name}.log').read_text()}")
            time.sleep(0.1)
        logs = "\n".join(p.read_text()[-3000:] for p in self.logs.glob("*.log"))
        raise ClusterError(f"timed out waiting for {what}\n{logs}")

    def wait_state(self, job_id: int, *states: JobState, timeout: float = TIMEOUT) -> float:
        return self.wait_for(
            f"job {job_id} to be {'/'.join(states)}",
            lambda: self.job(job_id).state in states,
            timeout,
        )

    def slots_used(self, node: str) -> int:
        with self.db.session() as session:
            return next(n.slots_used for n in node_capacities(session) if n.name == node)

    def pid(self, alloc_id: int) -> int:
        return int(self.client.hget(self.keys.allocation(alloc_id), "pid") or 0)

    def metric_steps(self, job_id: int, name: str) -> list[int]:
        with self.db.session() as session:
            return list(
                session.scalars(
                    select(Metric.step).where(
                        Metric.job_id == job_id,
                        Metric.name == name,
                        Metric.group == 0,
                        Metric.rank == 0,
                    )
                )
            )


def stop_process(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM a process group and wait (SIGKILL after 30 s)."""
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def start_cluster(
    data_dir: Path, redis_url: str, *, nodes: int = 1, restart_point_seconds: float = 1.0
) -> Cluster:
    """A scheduler and `nodes` node agents ("node-1", ... with 2 slots each), each a process
    of its own, with short timeouts and restart points every `restart_point_seconds` (the
    service's default is 300 s: the tests' second makes every fault find one)."""
    data_dir.mkdir(parents=True, exist_ok=True)
    settings = Settings(
        data_dir=data_dir,
        redis_url=redis_url,
        redis_prefix=f"f{uuid.uuid4().hex[:8]}",
        heartbeat_seconds=0.5,
        node_timeout_seconds=20.0,  # long enough for an agent killed here to come back first
        schedule_seconds=0.1,
        scheduler_lease_seconds=3.0,
        restart_point_seconds=restart_point_seconds,
    )
    migrate(settings.sql_url())
    found = Cluster(
        settings,
        Database(settings.sql_url()),
        redis.Redis.from_url(redis_url),
        Keys(settings.redis_prefix),
        {},
        data_dir,
    )
    found.vital = ()
    found.start_scheduler()
    for n in range(1, nodes + 1):
        found.start_agent(f"node-{n}", slots=2)
    return found


def stop_cluster(cluster: Cluster) -> None:
    for process in cluster.agents.values():
        stop_process(process)
    cluster.db.dispose()
    cluster.client.close()
