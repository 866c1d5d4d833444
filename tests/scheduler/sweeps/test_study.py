"""The sampling layer against real Optuna storage beside both job stores: the grid enumerates
exactly, random and TPE keep to the bounds and the seed across a restart, ASHA stops a trailing
trial at its rung, NSGA-II returns a front, and Optuna's tables stay out of ours."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from optuna.trial import TrialState

from dsl.search import SearchConfig
from scheduler.store.database import migrate
from scheduler.sweeps.study import OPTUNA_SCHEMA, SweepStudy, close_storages, open_storage

SPACE: dict[str, Any] = {
    "updater.lr.base": {"loguniform": [0.001, 0.3]},
    "updater.momentum": {"uniform": [0.5, 0.9]},
    "neuralnet.layers.fc1.units": {"int": [8, 64]},
    "cluster.framework": {"choice": ["local", "allreduce"]},
}


@pytest.fixture
def url(sql_url: str) -> Iterator[str]:
    migrate(sql_url)
    yield sql_url
    close_storages()


def search(**given: Any) -> SearchConfig:
    return SearchConfig.model_validate(
        {"metric": "test/accuracy", "mode": "max", "max_trials": 8, "space": SPACE, **given}
    )


def study(url: str, config: SearchConfig, name: str | None = None) -> SweepStudy:
    return SweepStudy(open_storage(url), name or f"test-{uuid.uuid4().hex}", config, 100)


def run(sweep: SweepStudy, count: int) -> list[dict[str, Any]]:
    """Ask and tell `count` trials, each worth a fixed function of its parameters."""
    out = []
    for _ in range(count):
        asked = sweep.ask()
        out.append(asked.params)
        value = asked.params["updater.momentum"] - abs(asked.params["updater.lr.base"] - 0.05)
        sweep.tell(asked.number, [value], TrialState.COMPLETE)
    return out


def test_the_grid_enumerates_every_point_once(url: str) -> None:
    config = search(
        algorithm="grid",
        max_trials=None,
        space={"a": {"choice": ["x", "y", "z"]}, "b": {"int": [1, 2]}},
    )
    sweep = study(url, config)
    asked = [sweep.ask() for _ in range(config.trial_count())]  # all running at once
    points = sorted((a.params["a"], a.params["b"]) for a in asked)
    assert points == [(a, b) for a in "xyz" for b in (1, 2)]
    for a in asked:
        sweep.tell(a.number, [1.0], TrialState.COMPLETE)
    assert len(sweep.trials([TrialState.COMPLETE])) == 6


@pytest.mark.parametrize("algorithm", ["random", "tpe"])
def test_samples_keep_to_the_bounds_and_the_seed_across_a_restart(url: str, algorithm: str) -> None:
    config = search(algorithm=algorithm, max_trials=12)
    straight = run(study(url, config), 12)  # TPE models the trials after its first 10
    for params in straight:
        assert 0.001 <= params["updater.lr.base"] <= 0.3
        assert 0.5 <= params["updater.momentum"] <= 0.9
        assert params["neuralnet.layers.fc1.units"] in range(8, 65)
        assert params["cluster.framework"] in ("local", "allreduce")
    assert len({p["updater.lr.base"] for p in straight}) == 12
    # The same seed, with a restart (a new storage and study object) after three trials.
    name = f"restart-{uuid.uuid4().hex}"
    first = run(study(url, config, name), 3)
    close_storages()
    resumed = study(url, config, name)
    assert len(resumed.trials([TrialState.COMPLETE])) == 3  # the history survived
    assert first + run(resumed, 9) == straight
    other = run(study(url, search(algorithm=algorithm, seed=1)), 3)
    assert other != straight[:3]


def test_asha_stops_a_trailing_trial_at_its_first_rung(url: str) -> None:
    config = search(algorithm="random", pruner={"type": "asha", "min_steps": 10})
    sweep = study(url, config)
    leader = sweep.ask()
    assert sweep.report(leader.number, [(10, 0.9), (20, 0.9), (40, 0.9)]) is None
    sweep.tell(leader.number, [0.9], TrialState.COMPLETE)
    trailing = sweep.ask()
    assert sweep.report(trailing.number, [(5, 0.1)]) is None  # before the rung: never
    assert sweep.report(trailing.number, [(20, 0.1), (10, 0.1)]) == 10  # in step order
    sweep.tell(trailing.number, None, TrialState.PRUNED)
    [pruned] = sweep.trials([TrialState.PRUNED])
    assert pruned.number == trailing.number and pruned.last_step == 10  # not 20


def test_several_objectives_give_a_pareto_front(url: str) -> None:
    config = SearchConfig.model_validate(
        {
            "objectives": [
                {"metric": "test/accuracy", "mode": "max"},
                {"metric": "train/loss", "mode": "min"},
            ],
            "algorithm": "nsga2",
            "max_trials": 6,
            "space": {"x": {"uniform": [0.0, 1.0]}},
        }
    )
    sweep = study(url, config)
    values = {}
    for _ in range(6):
        asked = sweep.ask()
        x = asked.params["x"]
        values[asked.number] = (x, x * x)  # more accuracy costs more loss: all on the front
        sweep.tell(asked.number, list(values[asked.number]), TrialState.COMPLETE)
    assert sorted(t.number for t in sweep.best()) == sorted(values)


def test_optuna_tables_live_apart_from_the_job_store(url: str) -> None:
    run(study(url, search(algorithm="random")), 1)
    engine = sa.create_engine(url)
    try:
        ours = set(sa.inspect(engine).get_table_names())
        assert "sweeps" in ours and "trials" not in ours and "studies" not in ours
        if url.startswith("postgresql"):
            theirs = set(sa.inspect(engine).get_table_names(schema=OPTUNA_SCHEMA))
            assert {"studies", "trials", "alembic_version"} <= theirs
    finally:
        engine.dispose()
    if url.startswith("sqlite"):
        optuna_db = url.removesuffix(".db") + "-optuna.db"
        other = sa.create_engine(optuna_db)
        try:
            assert {"studies", "trials"} <= set(sa.inspect(other).get_table_names())
        finally:
            other.dispose()
