"""Sweeps on a real cluster: the scheduler (its placement, ingest and sweep threads) with a node
agent (`trainyard node`, real Celery), a private redis-server and a SQLite file. Trials train
the digits MLP for a few dozen steps."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest
import redis
from sqlalchemy import select

from contract.allocation import AllocationState
from contract.keys import Keys
from contract.settings import Settings
from harness.service_cluster import Cluster, stop_process
from scheduler.admission.sweep_checks import check_sweep
from scheduler.daemon.loop import run_scheduler
from scheduler.store.database import Database, migrate
from scheduler.store.models import Allocation, Job, Sweep
from scheduler.store.states import JobState, SweepState
from scheduler.store.sweeps import create_sweep, request_sweep_cancel, trials
from scheduler.store.users import create_user, get_user

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[3]
BASE = """\
name: digits-sweep
data: {source: digits, batch_size: 32}
neuralnet:
  layers:
    - {name: data, type: input}
    - {name: fc1, type: dense, srclayers: [data], units: 32}
    - {name: relu1, type: relu, srclayers: [fc1]}
    - {name: fc2, type: dense, srclayers: [relu1]}
    - {name: loss, type: softmax_loss, srclayers: [fc2]}
updater: {type: sgd, momentum: 0.9, lr: {base: 0.1}}
train_steps: 60
disp_freq: 10
test: {freq: 10}
"""
TIMEOUT = 180.0


class SweepCluster(Cluster):
    scheduler: threading.Thread
    stop: threading.Event

    def start_scheduler(self) -> None:
        self.stop = threading.Event()
        self.scheduler = threading.Thread(
            target=run_scheduler, args=(self.settings, self.stop), daemon=True
        )
        self.scheduler.start()

    def stop_scheduler(self) -> None:
        self.stop.set()
        self.scheduler.join(timeout=30)

    def submit_sweep(self, text: str) -> int:
        with self.db.session() as session:
            owner = get_user(session, "alice") or create_user(session, "alice")
            checked = check_sweep(
                text,
                session=session,
                owner=owner,
                cache_dir=self.settings.cache_dir(),
                base_dir=ROOT,
                artifacts=self.settings.artifacts(),
            )
            new = checked.to_new_sweep(spec_yaml=text, overrides={}, base_dir=ROOT)
            return create_sweep(session, owner, new).id

    def sweep(self, sweep_id: int) -> Sweep:
        with self.db.session() as session:
            return session.get_one(Sweep, sweep_id)

    def trials(self, sweep_id: int) -> list[Job]:
        with self.db.session() as session:
            return trials(session, sweep_id)

    def wait_until(self, what: str, check: Callable[[], bool]) -> float:
        return self.wait_for(what, check, TIMEOUT)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> Iterator[SweepCluster]:
    data_dir = tmp_path_factory.mktemp("sweep-data")
    settings = Settings(
        data_dir=data_dir,
        redis_url=redis_url,
        redis_prefix=f"t{uuid.uuid4().hex[:8]}",
        heartbeat_seconds=0.5,
        # No node is lost here: long enough that no stall of a busy machine trips it.
        node_timeout_seconds=120.0,
        schedule_seconds=0.1,
    )
    migrate(settings.sql_url())
    db = Database(settings.sql_url())
    client = redis.Redis.from_url(redis_url)
    found = SweepCluster(settings, db, client, Keys(settings.redis_prefix), {}, data_dir)
    found.start_agent("node-1", slots=2)
    found.start_scheduler()
    try:
        yield found
    finally:
        found.stop_scheduler()
        for process in found.agents.values():
            stop_process(process)
        db.dispose()
        client.close()


def test_a_sweep_runs_on_a_node_agent_through_a_scheduler_restart(cluster: SweepCluster) -> None:
    sweep_id = cluster.submit_sweep(
        BASE
        + """
search:
  metric: test/accuracy
  mode: max
  algorithm: tpe
  max_trials: 4
  max_parallel: 2
  space:
    updater.lr.base: {loguniform: [0.01, 0.3]}
    neuralnet.layers.fc1.units: {choice: [16, 32]}
"""
    )
    cluster.wait_until(
        "a trial to run", lambda: any(j.state == JobState.RUNNING for j in cluster.trials(sweep_id))
    )
    cluster.stop_scheduler()  # mid-sweep: its threads stop, the trials' processes run on
    cluster.start_scheduler()
    cluster.wait_until("the sweep to end", lambda: cluster.sweep(sweep_id).state != "RUNNING")
    sweep, jobs = cluster.sweep(sweep_id), cluster.trials(sweep_id)
    assert sweep.state == SweepState.SUCCEEDED, sweep.error
    assert [j.trial_number for j in jobs] == [0, 1, 2, 3]  # none lost, none run twice
    assert all(j.state == JobState.SUCCEEDED for j in jobs), [(j.id, j.error) for j in jobs]
    accuracy = {j.trial_number: j.summary["test/accuracy"] for j in jobs}
    assert sweep.best_value == max(accuracy.values())
    assert accuracy[sweep.best_trial] == sweep.best_value
    # At most max_parallel trials were live at once.
    moments = sorted(
        [(j.created_at, 1) for j in jobs] + [(j.ended_at, -1) for j in jobs if j.ended_at]
    )
    live = [sum(step for _, step in moments[: i + 1]) for i in range(len(moments))]
    assert max(live) == 2


def test_asha_stops_a_trailing_trial_within_seconds_and_cancel_stops_the_sweep(
    cluster: SweepCluster,
) -> None:
    # The grid's order is its seed's shuffle: with seed 6, trial 0 learns (lr 0.1) and ends
    # after 200 steps, trial 1 learns nothing (lr 1e-6) and would run for 100,000.
    sweep_id = cluster.submit_sweep(
        BASE.replace("test: {freq: 10}", "test: {freq: 20, steps: 4}")
        + """
search:
  metric: test/accuracy
  mode: max
  algorithm: grid
  pruner: {type: asha, min_steps: 40, reduction_factor: 2}
  max_parallel: 1
  seed: 6
  space:
    updater.lr.base: {choice: [0.1, 0.000001]}
    train_steps: {choice: [200, 100000]}
"""
    )
    cluster.wait_until("trial 1", lambda: len(cluster.trials(sweep_id)) >= 2)
    first, trailing = cluster.trials(sweep_id)[:2]
    assert (first.overrides, first.state) == (
        {"updater.lr.base": 0.1, "train_steps": 200},
        JobState.SUCCEEDED,
    )
    assert trailing.overrides == {"updater.lr.base": 0.000001, "train_steps": 100000}
    cluster.wait_state(trailing.id, JobState.PRUNED, timeout=TIMEOUT)
    pruned = cluster.job(trailing.id)
    assert pruned.pruned_step == 40 and pruned.step < 1000
    assert cluster.events(trailing.id)[-1][1].startswith(
        "pruned at step 40 by the sweep's asha pruner: test/accuracy"
    )
    [(alloc, _)] = cluster.allocations(trailing.id)
    pid = cluster.pid(alloc.id)
    cluster.wait_for("the pruned trial's process to stop", lambda: not psutil.pid_exists(pid))
    # Trial 3 (lr 0.1 for 100,000 steps) learns: it runs until the sweep is cancelled.
    cluster.wait_until("trial 3 to run", lambda: _running(cluster, sweep_id, 3))
    with cluster.db.session() as session:
        request_sweep_cancel(
            session, session.get_one(Sweep, sweep_id), cluster.client, cluster.keys
        )
    cluster.wait_until("the sweep to end", lambda: cluster.sweep(sweep_id).state != "RUNNING")
    sweep, jobs = cluster.sweep(sweep_id), cluster.trials(sweep_id)
    assert sweep.state == SweepState.CANCELLED
    assert jobs[3].state == JobState.CANCELLED
    assert sweep.best_trial == 0  # trial 2 (lr 1e-6, 200 steps) was pruned or trails
    with cluster.db.session() as session:
        states = session.scalars(
            select(Allocation.state).where(Allocation.job_id.in_([j.id for j in jobs]))
        ).all()
    assert AllocationState.RUNNING not in states and AllocationState.PENDING not in states


def _running(cluster: SweepCluster, sweep_id: int, number: int) -> bool:
    jobs = {job.trial_number: job for job in cluster.trials(sweep_id)}
    return number in jobs and jobs[number].state == JobState.RUNNING and jobs[number].step > 0
