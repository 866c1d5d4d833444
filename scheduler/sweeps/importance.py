"""Parameter importance of a sweep: which paths of its space its results depend on.

Optuna's evaluators over the sweep's study (its COMPLETE trials, seeded ones included): fANOVA
by default (`FanovaImportanceEvaluator`, seeded by the sweep's seed, so the same trials give the
same answer), or mean decrease in impurity or PED-ANOVA. Importances are normalised to sum to 1.
Too few finished trials is a `Conflict` (the sweep must run further), not a failure.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import optuna
from optuna.importance import (
    BaseImportanceEvaluator,
    FanovaImportanceEvaluator,
    MeanDecreaseImpurityImportanceEvaluator,
    PedAnovaImportanceEvaluator,
    get_param_importances,
)
from optuna.trial import TrialState

from scheduler.store.errors import Conflict, InvalidRequest
from scheduler.store.models import Sweep
from scheduler.store.sweeps import search_of
from scheduler.sweeps.study import open_storage

Evaluator = Literal["fanova", "mean_decrease_impurity", "ped_anova"]
MIN_TRIALS = 2  # an importance compares trials: Optuna needs two finished ones


@dataclass(frozen=True)
class Importance:
    metric: str
    importances: dict[str, float]  # space path -> share of the metric's variance, most first
    evaluator: Evaluator
    trials: int  # the finished trials it was computed from


def make_evaluator(name: Evaluator, seed: int) -> BaseImportanceEvaluator:
    if name == "mean_decrease_impurity":
        return MeanDecreaseImpurityImportanceEvaluator(seed=seed)
    if name == "ped_anova":
        return PedAnovaImportanceEvaluator()
    return FanovaImportanceEvaluator(seed=seed)


def sweep_importance(
    sweep: Sweep, sql_url: str, evaluator: Evaluator = "fanova", metric: str | None = None
) -> Importance:
    """The importance of each path of the sweep's space for `metric` (its first objective's
    by default)."""
    search = search_of(sweep)
    metrics = [objective.metric for objective in search.objective_list()]
    metric = metric or metrics[0]
    if metric not in metrics:
        raise InvalidRequest(f"sweep {sweep.id} is judged by {', '.join(metrics)}, not {metric}")
    index = metrics.index(metric)
    try:
        study = optuna.load_study(study_name=sweep.study_name, storage=open_storage(sql_url))
    except KeyError:  # no pass of the scheduler yet
        raise _too_few(sweep, 0) from None
    done = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    if len(done) < MIN_TRIALS:
        raise _too_few(sweep, len(done))
    try:
        found = get_param_importances(
            study,
            evaluator=make_evaluator(evaluator, search.seed),
            target=lambda trial: trial.values[index],
        )
    except (ValueError, RuntimeError) as exc:  # e.g. every finished trial has the same values
        raise Conflict(f"sweep {sweep.id}: no importance yet: {exc}") from None
    return Importance(metric, {path: float(v) for path, v in found.items()}, evaluator, len(done))


def _too_few(sweep: Sweep, count: int) -> Conflict:
    return Conflict(
        f"sweep {sweep.id} has {count} finished trial{'s' if count != 1 else ''}; parameter "
        f"importance needs at least {MIN_TRIALS}: try again when more have completed"
    )
