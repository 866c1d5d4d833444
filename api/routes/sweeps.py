"""/sweeps: submit, list, inspect and cancel hyperparameter sweeps (trials run as jobs)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query

from api.deps import MAX_INT, CurrentUser, ServicesDep, SessionDep
from api.routes.jobs import detail_of as job_detail
from api.schemas import (
    ImportanceOut,
    ObjectiveOut,
    ScheduleEntry,
    SweepDetail,
    SweepOut,
    SweepPage,
    TestEstimate,
    TrialOut,
    errors,
    finite,
)
from api.submission import SUBMIT_BODY, SubmissionDep
from dsl.objective import Objective, on_test_split, search_warnings
from scheduler.admission import submit
from scheduler.store.jobs import owner_names
from scheduler.store.models import Job, Sweep, aware
from scheduler.store.states import JobState, SweepState
from scheduler.store.sweeps import (
    cancel_sweep,
    get_sweep,
    list_sweeps,
    search_of,
    trial_counts,
    trial_values,
    trials,
)
from scheduler.sweeps.importance import Evaluator, sweep_importance

router = APIRouter(prefix="/sweeps", tags=["sweeps"])

SweepId = Annotated[int, Path(ge=1, le=MAX_INT, description="the sweep's id")]


def sweep_out(sweep: Sweep, owner: str, created: int, ended: int) -> SweepOut:
    search = search_of(sweep)
    return SweepOut(
        id=sweep.id,
        name=sweep.name,
        owner=owner,
        state=SweepState(sweep.state),
        algorithm=search.algorithm,
        pruner=search.pruner.type,
        objectives=[ObjectiveOut(**o.model_dump()) for o in search.objective_list()],
        trial_count=search.trial_count(int(sweep.base_job.get("train_steps", 1))),
        max_parallel=search.max_parallel,
        trials_created=created,
        trials_ended=ended,
        best_trial=sweep.best_trial,
        best_value=finite(sweep.best_value),
        cancel_requested=sweep.cancel_requested,
        error=sweep.error,
        created_at=aware(sweep.created_at),
        ended_at=aware(sweep.ended_at) if sweep.ended_at else None,
        warnings=search_warnings(search),
    )


def trial_of(job: Job, objectives: list[Objective]) -> TrialOut:
    values = trial_values(job, objectives)
    first = (job.summary or {}).get(objectives[0].metric)
    return TrialOut(
        number=job.trial_number or 0,
        job_id=job.id,
        state=JobState(job.state),
        params=finite(job.overrides or {}),
        value=finite(first) if isinstance(first, int | float) else None,
        values=finite(values),
        step=job.step,
        train_steps=job.train_steps,
        pruned_step=job.pruned_step,
        schedule=[ScheduleEntry(**finite(entry)) for entry in job.pbt_schedule or []],
    )


def detail_of(session: SessionDep, sweep: Sweep) -> SweepDetail:
    owner = owner_names(session, {sweep.owner_id})[sweep.owner_id]
    jobs = trials(session, sweep.id)
    objectives = search_of(sweep).objective_list()
    by_number = {job.trial_number: job for job in jobs}
    outs = {job.trial_number: trial_of(job, objectives) for job in jobs}
    best_job = by_number.get(sweep.best_trial) if sweep.best_trial is not None else None
    ended = sum(JobState(job.state).terminal for job in jobs)
    held_out = on_test_split(objectives[0].metric)
    best_test = None
    if best_job is not None and held_out is not None and len(objectives) == 1:
        value = (best_job.summary or {}).get(held_out)
        best_test = TestEstimate(
            metric=held_out, value=finite(value) if isinstance(value, int | float) else None
        )
    return SweepDetail(
        **sweep_out(sweep, owner, len(jobs), ended).model_dump(),
        search=sweep.search,
        spec_yaml=sweep.spec_yaml,
        trials=list(outs.values()),
        best=outs.get(sweep.best_trial) if sweep.best_trial is not None else None,
        best_job=job_detail(session, best_job) if best_job is not None else None,
        best_test=best_test,
        pareto_front=[outs[number] for number in sweep.pareto_trials or [] if number in outs],
    )


@router.post(
    "",
    status_code=201,
    response_model=SweepDetail,
    summary="Submit a sweep",
    description="The body is a job document with a `search` section, as YAML or JSON (as for "
    "POST /jobs). The base job and every value of the search space are checked first (422 "
    "with located errors); then the scheduler runs the trials, each an ordinary job. The "
    "base job is held to the user's quotas, and the submission to their rate, as for POST /jobs.",
    openapi_extra=SUBMIT_BODY,
    responses=errors(401, 403, 413, 415, 422, 429),
)
def submit_sweep(
    user: CurrentUser, submission: SubmissionDep, session: SessionDep, services: ServicesDep
) -> SweepDetail:
    sweep = submit.submit_sweep(session, user, submission, services.backends)
    return detail_of(session, sweep)


@router.get(
    "",
    response_model=SweepPage,
    name="list",  # the operation id: sweeps-list (api/openapi.py)
    summary="List sweeps",
    description="Newest first. A user sees their own sweeps, an admin every sweep.",
    responses=errors(401, 422),
)
def list_all(
    session: SessionDep,
    user: CurrentUser,
    limit: Annotated[int, Query(ge=1, le=1000, description="page size")] = 50,
    before: Annotated[
        int | None, Query(ge=1, le=MAX_INT, description="next_before of the previous page")
    ] = None,
) -> SweepPage:
    sweeps = list_sweeps(session, user, limit=limit + 1, before_id=before)
    page = sweeps[:limit]
    owners = owner_names(session, {sweep.owner_id for sweep in page})
    counts = trial_counts(session, [sweep.id for sweep in page])
    items = [sweep_out(sweep, owners[sweep.owner_id], *counts[sweep.id]) for sweep in page]
    return SweepPage(items=items, next_before=page[-1].id if len(sweeps) > limit else None)


@router.get(
    "/{sweep_id}",
    response_model=SweepDetail,
    name="get",  # sweeps-get
    summary="Get a sweep",
    description="Its trials (parameters, state, metric values, the rung a pruned one stopped "
    "at), the best trial with its whole job, and the Pareto front for several objectives.",
    responses=errors(401, 404, 422),
)
def get_one(sweep_id: SweepId, session: SessionDep, user: CurrentUser) -> SweepDetail:
    return detail_of(session, get_sweep(session, user, sweep_id))


@router.get(
    "/{sweep_id}/importance",
    response_model=ImportanceOut,
    summary="Parameter importance of a sweep",
    description="How much the metric depends on each path of the search space, by one of "
    "Optuna's evaluators (fANOVA by default) over the sweep's finished trials. 409 while fewer "
    "than two trials have finished; 422 for a metric the sweep is not judged by.",
    responses=errors(401, 404, 409, 422),
)
def importance(
    sweep_id: SweepId,
    session: SessionDep,
    user: CurrentUser,
    services: ServicesDep,
    evaluator: Annotated[Evaluator, Query(description="Optuna's importance evaluator")] = "fanova",
    metric: Annotated[
        str | None,
        Query(max_length=64, description="one of the sweep's objectives; default the first"),
    ] = None,
) -> ImportanceOut:
    sweep = get_sweep(session, user, sweep_id)
    found = sweep_importance(sweep, services.settings.sql_url(), evaluator, metric)
    return ImportanceOut(
        metric=found.metric,
        importances=finite(found.importances),
        evaluator=found.evaluator,
        trials=found.trials,
    )


@router.post(
    "/{sweep_id}/cancel",
    response_model=SweepDetail,
    summary="Cancel a sweep",
    description="No trial is started any more and the live ones are cancelled (a queued one at "
    "once); the sweep is CANCELLED once they have stopped, within seconds "
    "(`cancel_requested` is true meanwhile). 409 if the sweep has already ended.",
    responses=errors(401, 404, 409, 422),
)
def cancel(
    sweep_id: SweepId, session: SessionDep, user: CurrentUser, services: ServicesDep
) -> SweepDetail:
    sweep = cancel_sweep(session, user, sweep_id, services.redis, services.keys)
    return detail_of(session, sweep)
