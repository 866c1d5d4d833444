"""`warm_start: <sweep id>`: a new sweep's study begins with an earlier sweep's finished trials.

Checked at submission (`warm_start_issues`, changing nothing): the earlier sweep must be the
submitter's (another user's is "no sweep", as on GET /sweeps/{id}), judge its trials by the
same objectives, and search the same paths; each problem is located at `search.warm_start`.
The scheduler seeds the study on the sweep's first pass (`seed_study`): every COMPLETE trial of
the earlier study whose values all lie in the new space is added with Optuna's
`Study.add_trial`, its values and intermediate values included, so the sampler and the pruner
learn from it. Seeded trials are marked (user attribute `warm_start`), have no job, and count
neither towards max_trials nor for the best trial.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import optuna
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)
from optuna.trial import TrialState
from sqlalchemy.orm import Session

from dsl.errors import SpecIssue
from dsl.search import SearchConfig
from dsl.source import SourceMap
from scheduler.store.errors import NotFound
from scheduler.store.models import Sweep, User
from scheduler.store.sweeps import get_sweep, search_of
from scheduler.sweeps.study import WARM_ATTR, SweepStudy, is_seeded

AT = ("search", "warm_start")


def warm_start_issues(
    session: Session, owner: User, search: SearchConfig, source: SourceMap
) -> list[SpecIssue]:
    """Why `search.warm_start` cannot seed this sweep (empty when it can or is unset)."""
    if search.warm_start is None:
        return []
    try:
        earlier = get_sweep(session, owner, search.warm_start)
    except NotFound:
        return [
            source.issue(
                AT,
                f"you have no sweep {search.warm_start} to warm-start from",
                "`trainyard sweep list` shows your sweeps",
            )
        ]
    before = search_of(earlier)
    theirs = [(o.metric, o.mode) for o in before.objective_list()]
    ours = [(o.metric, o.mode) for o in search.objective_list()]
    if theirs != ours:
        return [
            source.issue(
                AT,
                f"sweep {earlier.id} judged its trials by {_objectives(theirs)}, and this one "
                f"by {_objectives(ours)}: its values do not compare",
                "warm-start from a sweep with the same metric and mode",
            )
        ]
    missing, extra = (
        sorted(set(search.space) - set(before.space)),
        sorted(set(before.space) - set(search.space)),
    )
    if missing or extra:
        parts = []
        if missing:
            parts.append(f"lacks {', '.join(missing)}")
        if extra:
            parts.append(f"also searched {', '.join(extra)}")
        return [
            source.issue(
                AT,
                f"sweep {earlier.id} searched other paths: it {' and '.join(parts)}",
                "warm-start from a sweep over the same paths (their ranges may differ)",
            )
        ]
    return []


def _objectives(pairs: Sequence[tuple[str, str]]) -> str:
    return ", ".join(f"{metric} ({mode})" for metric, mode in pairs)


def seed_study(
    study: optuna.Study, distributions: dict[str, BaseDistribution], earlier: optuna.Study, ref: int
) -> int:
    """Add the earlier study's finished trials that lie in `distributions` and are not seeded
    yet (a pass cut short seeds the rest next time); how many were added."""
    done = {
        tuple(t.user_attrs[WARM_ATTR]) for t in study.get_trials(deepcopy=False) if is_seeded(t)
    }
    added = 0
    for trial in earlier.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        source = trial.user_attrs.get(WARM_ATTR) or [ref, trial.number]
        if tuple(source) in done or not _inside(trial.params, distributions):
            continue
        study.add_trial(
            optuna.create_trial(
                values=trial.values,
                params=trial.params,
                distributions=distributions,
                intermediate_values=trial.intermediate_values,
                user_attrs={WARM_ATTR: list(source)},
            )
        )
        added += 1
    return added


def _inside(params: dict[str, Any], distributions: dict[str, BaseDistribution]) -> bool:
    if set(params) != set(distributions):
        return False
    return all(_contains(distributions[path], value) for path, value in params.items())


def _contains(dist: BaseDistribution, value: Any) -> bool:
    if isinstance(dist, CategoricalDistribution):
        return any(value == choice and type(value) is type(choice) for choice in dist.choices)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return False
    if isinstance(dist, IntDistribution):
        return float(value).is_integer() and dist.low <= value <= dist.high
    assert isinstance(dist, FloatDistribution)
    return dist.low <= value <= dist.high


def seed_sweep(session: Session, sweep: Sweep, study: SweepStudy) -> int:
    """Seed the sweep's study from the sweep its `warm_start` names; how many trials."""
    ref = study.search.warm_start
    earlier = None if ref is None else session.get(Sweep, ref)
    if ref is None or earlier is None:
        return 0
    try:
        before = optuna.load_study(study_name=earlier.study_name, storage=study.storage)
    except KeyError:  # it never had a pass: no trials to learn from
        return 0
    return seed_study(study.study, study.distributions, before, ref)
