"""A sweep's Optuna study: its storage beside the job store, its sampler, pruner and trials.

Optuna keeps a study's trials, their values and the samplers' state in its own tables
(`studies`, `trials`, ... and an `alembic_version` of its own), which would collide with ours:
they live in a SQLite file of their own next to the job store's (`<db>-optuna.db`), or in a
PostgreSQL schema of their own (`optuna`) of the same database, so a sweep survives a restart
of the scheduler with its sampler's history. Sampling and pruning are Optuna's (its samplers
and pruners, configured from the job language's `search:`); this module only maps the
language onto them and numbers the trials.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
import sqlalchemy as sa
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)
from optuna.pruners import (
    BasePruner,
    HyperbandPruner,
    MedianPruner,
    NopPruner,
    SuccessiveHalvingPruner,
)
from optuna.samplers import (
    BaseSampler,
    CmaEsSampler,
    GPSampler,
    GridSampler,
    NSGAIISampler,
    RandomSampler,
    TPESampler,
)
from optuna.storages import RDBStorage
from optuna.study import StudyDirection
from optuna.study._multi_objective import _get_pareto_front_trials_by_trials
from optuna.trial import FrozenTrial, TrialState

from dsl.search import SearchConfig, SpaceEntry

OPTUNA_SCHEMA = "optuna"
# On a trial seeded from an earlier sweep (scheduler/sweeps/warm_start.py): [its sweep, its number].
WARM_ATTR = "warm_start"
SEED_STRIDE = 1_000_003  # the sampler of trial n is seeded (seed * stride + n) mod 2**32

log = logging.getLogger("trainyard.sweeps")


class StudyUnavailable(RuntimeError):
    """The algorithm's library is not installed, or the storage cannot be opened."""


def optuna_location(sql_url: str) -> tuple[str, dict[str, Any]]:
    """Optuna's storage URL and engine options for the job store at `sql_url`."""
    if sql_url.startswith("sqlite"):
        path = sql_url.split("///", 1)[-1]
        if not path or path == ":memory:":
            raise StudyUnavailable("sweeps need a job store in a file or on PostgreSQL")
        db = Path(path)
        url = f"sqlite:///{db.with_name(f'{db.stem}-optuna.db')}"
        return url, {"connect_args": {"timeout": 30, "check_same_thread": False}}
    return sql_url, {
        "connect_args": {"options": f"-csearch_path={OPTUNA_SCHEMA}"},
        "pool_pre_ping": True,
    }


_STORAGES: dict[str, RDBStorage] = {}
_LOCK = threading.Lock()


def open_storage(sql_url: str) -> RDBStorage:
    """The process's Optuna storage for the job store at `sql_url` (created on first use)."""
    with _LOCK:
        storage = _STORAGES.get(sql_url)
        if storage is None:
            optuna.logging.set_verbosity(optuna.logging.WARNING)
            url, options = optuna_location(sql_url)
            if not url.startswith("sqlite"):
                engine = sa.create_engine(sql_url)
                try:
                    with engine.begin() as connection:
                        connection.execute(sa.text(f"CREATE SCHEMA IF NOT EXISTS {OPTUNA_SCHEMA}"))
                finally:
                    engine.dispose()
            storage = RDBStorage(url, engine_kwargs=options)
            if url.startswith("sqlite"):  # readers and the one writer need not wait for each other
                with storage.engine.connect() as connection:
                    connection.exec_driver_sql("PRAGMA journal_mode=WAL")
            _STORAGES[sql_url] = storage
        return storage


def close_storages() -> None:
    with _LOCK:
        for storage in _STORAGES.values():
            storage.engine.dispose()
        _STORAGES.clear()


def distribution(entry: SpaceEntry) -> BaseDistribution:
    if entry.loguniform is not None:
        return FloatDistribution(*entry.loguniform, log=True)
    if entry.uniform is not None:
        return FloatDistribution(*entry.uniform)
    if entry.int is not None:
        return IntDistribution(*entry.int)
    return CategoricalDistribution(entry.choice or [])


def make_sampler(search: SearchConfig, seed: int) -> BaseSampler:
    """The algorithm's Optuna sampler. It is built again for every trial, seeded by the sweep's
    seed and the trial's number, so a restarted scheduler samples what the first one would
    have (a sampler's random state lives in memory, its history in the storage)."""
    match search.algorithm:
        case "grid":
            space = {path: entry.grid_values() or [] for path, entry in search.space.items()}
            return GridSampler(space, seed=seed)
        case "random":
            return RandomSampler(seed=seed)
        case "tpe":
            return TPESampler(seed=seed)
        case "cmaes":
            _needs("cmaes", "cmaes")
            return CmaEsSampler(seed=seed, warn_independent_sampling=False)
        case "gp":
            _needs("gp", "scipy")
            return GPSampler(seed=seed, warn_independent_sampling=False)
        case "nsga2":
            population = max(4, min(50, search.trial_count() // 4))
            return NSGAIISampler(seed=seed, population_size=population)
    raise ValueError(f"algorithm {search.algorithm} has no sampler")


def _needs(algorithm: str, module: str) -> None:
    try:
        __import__(module)
    except ImportError:
        raise StudyUnavailable(
            f"algorithm {algorithm} needs the Python package '{module}', which this scheduler "
            f"lacks: install it, or choose another algorithm"
        ) from None


def make_pruner(search: SearchConfig, train_steps: int) -> BasePruner:
    pruner = search.pruner
    match pruner.type:
        case "asha":
            return SuccessiveHalvingPruner(
                min_resource=pruner.min_steps, reduction_factor=pruner.reduction_factor
            )
        case "hyperband":
            return HyperbandPruner(
                min_resource=pruner.min_steps,
                max_resource=train_steps,
                reduction_factor=pruner.reduction_factor,
            )
        case "median":
            return MedianPruner(n_startup_trials=1, n_warmup_steps=pruner.min_steps)
    return NopPruner()


@dataclass(frozen=True)
class Asked:
    number: int
    params: dict[str, Any]
    pbt: dict[str, Any] | None = None  # population-based training: the member's facts


class SweepStudy:
    """One sweep's study. Trials are asked for by the scheduler, told their results when their
    jobs end, and sent their intermediate values as the ingester writes them."""

    def __init__(
        self, storage: RDBStorage, name: str, search: SearchConfig, train_steps: int
    ) -> None:
        self.search = search
        self.storage = storage
        self.distributions = {path: distribution(e) for path, e in search.space.items()}
        directions = [
            StudyDirection.MAXIMIZE if o.mode == "max" else StudyDirection.MINIMIZE
            for o in search.objective_list()
        ]
        self.study = optuna.create_study(
            storage=storage,
            study_name=name,
            directions=directions,
            sampler=make_sampler(search, search.seed),
            pruner=make_pruner(search, train_steps),
            load_if_exists=True,
        )
        self.study_id = storage.get_study_id_from_name(name)

    def trials(self, states: Sequence[TrialState] | None = None) -> list[FrozenTrial]:
        """The sweep's own trials (each has a job), not those seeded by warm_start."""
        found = self.study.get_trials(deepcopy=False, states=states)
        return [trial for trial in found if not is_seeded(trial)]

    def ask(self) -> Asked:
        seed = self.search.seed
        if self.search.algorithm != "grid":  # the grid's order is its seed's shuffle
            seed = (seed * SEED_STRIDE + len(self.study.get_trials(deepcopy=False))) % 2**32
        self.study.sampler = make_sampler(self.search, seed)
        trial = self.study.ask(self.distributions)
        return Asked(trial.number, dict(trial.params))

    def tell(self, number: int, values: list[float] | None, state: TrialState) -> None:
        """Finish trial `number`: COMPLETE with its values, or FAIL / PRUNED (a trial already
        finished is left as it is)."""
        if self.search.algorithm == "grid":
            # GridSampler ends study.optimize once every point is told (study.stop(), which
            # raises outside optimize): ask-and-tell has no loop to end, max_trials does that.
            self.study.sampler = RandomSampler()
        if state == TrialState.COMPLETE:
            self.study.tell(number, values, skip_if_finished=True)
        else:
            self.study.tell(number, state=state, skip_if_finished=True)

    def report(self, number: int, points: list[tuple[int, float]]) -> int | None:
        """Record a running trial's intermediate values (step, value), in step order, asking
        the pruner at each new last step: the step at which it stops the trial, or None. Points
        recorded before (a batch read again) are asked about again, to the same answer."""
        trial_id = self.storage.get_trial_id_from_study_id_trial_number(self.study_id, number)
        trial = self.storage.get_trial(trial_id)
        if trial.state != TrialState.RUNNING:
            return None
        for step, value in sorted(points):
            if step not in trial.intermediate_values:
                self.storage.set_trial_intermediate_value(trial_id, step, value)
                trial = self.storage.get_trial(trial_id)
            if step == trial.last_step and self.study.pruner.prune(self.study, trial):
                return step
        return None

    def best(self) -> list[FrozenTrial]:
        """The best trials (one objective: those tied at the best value), or the Pareto front
        (several), of the sweep's own trials; none before one completes."""
        done = self.trials((TrialState.COMPLETE,))
        directions = self.study.directions
        if len(directions) > 1:
            return _get_pareto_front_trials_by_trials(done, directions)
        if not done:
            return []
        pick = max if directions[0] == StudyDirection.MAXIMIZE else min
        value = pick(trial.values[0] for trial in done)
        return [trial for trial in done if trial.values[0] == value]


def is_seeded(trial: FrozenTrial) -> bool:
    """Whether the trial was seeded from an earlier sweep (it has no job in this one)."""
    return WARM_ATTR in trial.user_attrs
