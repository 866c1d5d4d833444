"""warm_start: a sweep's study begins with an earlier sweep's finished trials that lie in its
space (real SQL on both backends, real Optuna storage; trial jobs are ended by hand)."""

from __future__ import annotations

import pytest
from optuna.trial import TrialState

from dsl.errors import JobSpecError
from scheduler.admission.sweep_checks import check_sweep
from scheduler.store.states import JobState, SweepState
from scheduler.store.users import create_user, get_user
from scheduler.sweeps.study import WARM_ATTR
from tests.scheduler.daemon.test_sweep_thread import BASE, ROOT, SEARCH, Env, env  # noqa: F401

ACCURACY = [0.6, 0.9, 0.7, 0.8]


def run_to_the_end(env: Env, sweep_id: int) -> None:  # noqa: F811
    runner = env.runner()
    for _ in range(4):
        runner.run_once()
        for job in env.trials(sweep_id):
            if job.state == JobState.QUEUED:
                env.end(job.id, JobState.SUCCEEDED, accuracy=ACCURACY[job.trial_number % 4])
    runner.run_once()


def test_warm_start_seeds_the_study_with_the_trials_in_its_space(env: Env) -> None:  # noqa: F811
    first = env.submit()
    run_to_the_end(env, first)
    earlier = {job.trial_number: job for job in env.trials(first)}
    assert env.sweep(first).state == SweepState.SUCCEEDED and len(earlier) == 4
    # A narrower learning rate: only the earlier trials up to `cut` lie in the new space.
    cut = sorted(job.overrides["updater.lr.base"] for job in earlier.values())[1]
    inside = {n for n, job in earlier.items() if job.overrides["updater.lr.base"] <= cut}
    assert len(inside) == 2
    second = env.submit(
        SEARCH.replace("[0.01, 0.3]", f"[0.01, {cut!r}]") + f"  warm_start: {first}\n"
    )
    runner = env.runner()
    runner.run_once()
    study = runner.studies.get(env.sweep(second)).study
    trials = study.get_trials()
    seeded = [t for t in trials if WARM_ATTR in t.user_attrs]
    assert sorted(t.user_attrs[WARM_ATTR][1] for t in seeded) == sorted(inside)
    for trial in seeded:
        source = earlier[trial.user_attrs[WARM_ATTR][1]]
        assert trial.state == TrialState.COMPLETE
        assert trial.params == source.overrides
        assert trial.values == [ACCURACY[source.trial_number]]
    # The sweep's own trials follow them; only they have jobs and count towards max_trials.
    own = env.trials(second)
    assert [job.trial_number for job in own] == [len(seeded), len(seeded) + 1]
    assert all(job.overrides["updater.lr.base"] <= cut for job in own)
    runner.run_once()
    assert len(study.get_trials()) == len(seeded) + 2  # seeded once, not at every pass
    for job in own:
        env.end(job.id, JobState.SUCCEEDED, accuracy=0.1)  # worse than every seeded trial
    for _ in range(3):
        runner.run_once()
        for job in env.trials(second):
            if job.state == JobState.QUEUED:
                env.end(job.id, JobState.SUCCEEDED, accuracy=0.2)
    runner.run_once()
    sweep = env.sweep(second)
    assert sweep.state == SweepState.SUCCEEDED and len(env.trials(second)) == 4
    assert sweep.best_value == 0.2  # the best of its own trials, not of the seeded ones
    assert sweep.best_trial in {job.trial_number for job in env.trials(second)}


def test_warm_start_from_a_missing_foreign_or_incompatible_sweep_is_located(
    env: Env,  # noqa: F811
) -> None:
    first = env.submit()

    def issue_of(search: str, user: str = "ann") -> tuple[str, int | None, str]:
        text = BASE + search
        with env.db.session() as session:
            owner = get_user(session, user) or create_user(session, user)
            with pytest.raises(JobSpecError) as info:
                check_sweep(
                    text,
                    session=session,
                    owner=owner,
                    cache_dir=env.settings.cache_dir(),
                    base_dir=ROOT,
                    artifacts=env.settings.artifacts(),
                )
        [issue] = info.value.issues
        line = next(i for i, row in enumerate(text.splitlines(), 1) if "warm_start" in row)
        assert (issue.path, issue.line, issue.column) == ("search.warm_start", line, 3)
        return issue.message

    warm = f"  warm_start: {first}\n"
    assert issue_of(SEARCH + "  warm_start: 999\n") == "you have no sweep 999 to warm-start from"
    assert issue_of(SEARCH + warm, user="bob") == f"you have no sweep {first} to warm-start from"
    message = issue_of(SEARCH.replace("mode: max", "mode: min") + warm)
    assert message.startswith(f"sweep {first} judged its trials by test/accuracy (max)")
    message = issue_of(SEARCH.replace("updater.lr.base", "updater.momentum") + warm)
    assert message == (
        f"sweep {first} searched other paths: it lacks updater.momentum and also searched "
        "updater.lr.base"
    )
    assert len(env.trials(first)) == 0 and env.sweep(first).state == SweepState.RUNNING
