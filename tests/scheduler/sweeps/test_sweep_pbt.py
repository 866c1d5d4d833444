"""Population-based training on a real cluster: the scheduler with a node agent (real Celery), a
private redis-server and a SQLite file. Two members of the digits MLP train two generations of
20 steps; the one behind after the first continues from the leader's checkpoint."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from api.routes.sweeps import detail_of
from contract.rundir import job_run_dir
from scheduler.store.models import Sweep
from scheduler.store.states import JobState, SweepState
from tests.scheduler.sweeps.test_sweep_cluster import BASE, SweepCluster, cluster  # noqa: F401

pytestmark = pytest.mark.slow

PBT = (
    BASE.replace("train_steps: 60", "train_steps: 40")
    + """
search:
  metric: test/accuracy
  mode: max
  algorithm: random
  pruner: {type: pbt, interval: 20, quantile: 0.5, perturb: [0.8, 1.2]}
  max_parallel: 2
  seed: 4
  space:
    updater.lr.base: {loguniform: [0.0001, 0.5]}
    neuralnet.layers.fc1.units: {choice: [16, 32]}
"""
)


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_pbt_continues_the_trailing_member_from_the_leaders_checkpoint(
    cluster: SweepCluster,  # noqa: F811
) -> None:
    sweep_id = cluster.submit_sweep(PBT)
    cluster.wait_until("the sweep to end", lambda: cluster.sweep(sweep_id).state != "RUNNING")
    sweep, jobs = cluster.sweep(sweep_id), cluster.trials(sweep_id)
    assert sweep.state == SweepState.SUCCEEDED, sweep.error
    assert [j.trial_number for j in jobs] == [0, 1, 2, 3]  # 2 members x 2 generations
    assert all(j.state == JobState.SUCCEEDED for j in jobs), [(j.id, j.error) for j in jobs]
    assert [j.train_steps for j in jobs] == [20, 20, 40, 40]
    first = jobs[:2]
    accuracy = [j.summary["test/accuracy"] for j in first]
    leader, trailing = (0, 1) if accuracy[0] >= accuracy[1] else (1, 0)
    artifacts = cluster.settings.artifacts()
    leaders_checkpoint = job_run_dir(artifacts, first[leader].id) / "checkpoints"
    leaders_checkpoint /= "step-00000020.safetensors"
    by_source = {}
    for job in jobs[2:]:
        schedule = job.pbt_schedule or []
        assert [entry["step"] for entry in schedule] == [0, 20]
        by_source[schedule[1]["from_trial"]] = job
    # The trailing member took the leader's checkpoint and its values, perturbed.
    took = by_source[leader]
    leaders_lr = first[leader].overrides["updater.lr.base"]
    assert (
        took.overrides["neuralnet.layers.fc1.units"]
        == (first[leader].overrides["neuralnet.layers.fc1.units"])
    )
    assert took.overrides["updater.lr.base"] in (
        pytest.approx(min(leaders_lr * 0.8, 0.5)),
        pytest.approx(min(leaders_lr * 1.2, 0.5)),
    )
    assert took.pbt_schedule == [
        {"step": 0, "params": first[leader].overrides, "from_trial": None},
        {"step": 20, "params": took.overrides, "from_trial": leader},
    ]
    run_dir = job_run_dir(artifacts, took.id)
    copied = run_dir / "checkpoints" / "step-00000020.safetensors"
    assert digest(copied) == digest(leaders_checkpoint)
    assert (
        "resumed from step-00000020.safetensors at step 20" in (run_dir / "train.log").read_text()
    )
    # The leader went on from its own checkpoint with its own values.
    kept = by_source[None]
    assert kept.overrides == first[leader].overrides
    kept_dir = job_run_dir(artifacts, kept.id)
    assert digest(kept_dir / "checkpoints" / "step-00000020.safetensors") == digest(
        leaders_checkpoint
    )
    with cluster.db.session() as session:  # GET /sweeps/{id} shows each trial's schedule
        detail = detail_of(session, session.get_one(Sweep, sweep_id))
    [shown] = [t for t in detail.trials if t.job_id == took.id]
    assert [entry.model_dump() for entry in shown.schedule] == took.pbt_schedule
    assert first[trailing].id not in {j.id for j in jobs[2:]}
    assert sweep.best_value == max(j.summary["test/accuracy"] for j in jobs)
