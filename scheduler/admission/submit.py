"""Submitting a job or a sweep: the one pipeline that every caller goes through.

    the user's priority and rate -> job or sweep? (the parsed document's `search`, before any
    compile) -> check (the compile, a sweep's space too) -> the user's quotas -> create the row
    -> placement preview (a job) -> commit -> announce

POST /jobs and POST /sweeps run all of it (`submit_job`, `submit_sweep`); a run of every kind
ends in `admit_run` (queue, commit, announce), a prediction run after its own checks
(scheduler/admission/predict.py). POST /jobs/validate runs the checks without the user's
priority, rate and quotas, and writes nothing (`validate`); the sweep thread checks each trial
as a job and queues it (`check` with `admit=False`, then `queue_job`) in its own transaction,
which it commits, and it wakes placement itself.

Refusals are domain errors (JobSpecError, NotAllowed, RateLimited, QuotaExceeded); only the API
turns them into HTTP statuses.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
import yaml
from sqlalchemy.orm import Session

from contract.announcements import JOB, SWEEP, announce
from contract.keys import Keys
from contract.settings import Settings
from dsl.budget import CompileBudget
from dsl.errors import JobSpecError, SpecIssue
from dsl.overrides import effective_document
from dsl.source import read_document
from scheduler.admission.checks import CheckedJob, Kind, check_job, kind_of
from scheduler.admission.policy import admins_only, check_priority
from scheduler.admission.quotas import check_new_job
from scheduler.admission.rate_limit import check_rate, check_validation_rate
from scheduler.admission.sweep_checks import CheckedSweep, check_sweep
from scheduler.placement.plan import PlacementRequest
from scheduler.placement.preview import Preview, placement_preview
from scheduler.store import jobs as job_store
from scheduler.store.errors import InvalidRequest
from scheduler.store.jobs import NewJob
from scheduler.store.models import Job, Sweep, User
from scheduler.store.quotas import Limits, limits_for
from scheduler.store.sweeps import create_sweep

NAME_LENGTH = 100  # Job.name's column width


@dataclass(frozen=True)
class Backends:
    """What a submission reaches besides the SQL session: the settings (data folders, default
    quotas) and Redis (the rate limit's count, the announcement)."""

    settings: Settings
    redis: redis.Redis
    keys: Keys


@dataclass(frozen=True)
class Trial:
    """A sweep's trial: a job named after its sweep and numbered in it."""

    sweep_id: int
    number: int
    name: str
    params: dict[str, Any]  # what the study asked: the job's overrides as they are shown
    base_dir: Path  # where the sweep's relative file paths resolved


@dataclass(frozen=True)
class Submission:
    """A document to submit, as its caller read it."""

    document: str | Mapping[str, Any]
    spec_yaml: str  # the text stored with the job or sweep, and shown
    overrides: Mapping[str, Any] = field(default_factory=dict)
    priority: int = 0
    # The folder relative file paths resolve against (admins' jobs only read server files),
    # under the data directory (an absolute one replaces it); default the data directory.
    base_dir: str | None = None
    trial: Trial | None = None


def trial_submission(
    sweep: Sweep,
    number: int,
    params: Mapping[str, Any],
    *,
    extra: Mapping[str, Any],
    settings: Settings,
) -> Submission:
    """Trial `number` of `sweep` with the study's `params`, and `extra` overrides applied but
    not shown (a population-based member's segment); queued at the sweep's priority."""
    suffix = f"-trial{number}"
    return Submission(
        document=sweep.base_job,
        spec_yaml=yaml.safe_dump(sweep.base_job, sort_keys=False),
        overrides={**params, **extra},
        priority=sweep.priority,
        trial=Trial(
            sweep_id=sweep.id,
            number=number,
            name=sweep.name[: NAME_LENGTH - len(suffix)] + suffix,
            params=dict(params),
            base_dir=Path(sweep.base_dir or settings.resolved_data_dir()),
        ),
    )


@dataclass(frozen=True)
class Checked:
    """A submission that passed every check asked for; nothing is written yet."""

    submission: Submission
    job: CheckedJob  # the job, or a sweep's base job as its document gives it
    sweep: CheckedSweep | None  # a sweep: its search, with every value of its space checked
    base_dir: Path


def check(
    session: Session,
    owner: User,
    submission: Submission,
    backends: Backends,
    *,
    expect: Kind | None = None,
    admit: bool = True,
) -> Checked:
    """The pipeline's checks, in order: with `admit`, the owner's priority rule and rate
    (before anything is compiled, so a refused submission costs nothing); whether the document
    is a job or a sweep (refused if not what was `expect`ed); the compile; with `admit`, the
    owner's quotas. `admit` is False for a dry run and for a sweep's trial (its sweep was
    admitted when it was submitted)."""
    limits = _admit(session, owner, submission, backends) if admit else None
    overrides = submission.overrides
    base_dir = _base_dir(submission, owner, backends.settings)
    cache_dir = backends.settings.cache_dir()
    # One budget for the document, a sweep's probes included (dsl/budget.py).
    budget = CompileBudget(seconds=backends.settings.compile_seconds)
    sweep: CheckedSweep | None = None
    try:
        document = read_document(submission.document)  # parsed once, for every reader below
        if kind_of(document, overrides, expect=expect) == Kind.SWEEP:
            sweep = check_sweep(
                document,
                session=session,
                owner=owner,
                overrides=overrides,
                cache_dir=cache_dir,
                base_dir=base_dir,
                artifacts=backends.settings.artifacts(),
                budget=budget,
            )
            job = sweep.checked
        else:
            job = check_job(
                document,
                session=session,
                owner=owner,
                overrides=overrides,
                cache_dir=cache_dir,
                base_dir=base_dir,
                artifacts=backends.settings.artifacts(),
                budget=budget,
            )
    except RecursionError:
        raise JobSpecError(
            SpecIssue(
                "<document>",
                "the job document is nested too deeply",
                hint="a job is a few levels of mappings and lists",
            )
        ) from None
    if limits is not None:
        _check_quotas(session, owner, limits, job, sweep)
    return Checked(submission, job, sweep, base_dir)


def queue_job(session: Session, owner: User, checked: Checked) -> Job:
    """The checked job's row, queued (a trial's named and numbered in its sweep); flushed, not
    committed."""
    return job_store.create_job(session, owner, new_job(checked))


def new_job(checked: Checked) -> NewJob:
    """The row a checked job becomes (a trial's named and numbered in its sweep): plain data,
    which a process that checked a trial hands to the one that queues it."""
    submission, trial = checked.submission, checked.submission.trial
    new = checked.job.to_new_job(
        spec_yaml=submission.spec_yaml,
        overrides=trial.params if trial is not None else submission.overrides,
        # what the job runs: a trial's every override applied, those not shown too
        effective_yaml=effective_document(submission.spec_yaml, submission.overrides),
        priority=submission.priority,
    )
    if trial is not None:
        new = dataclasses.replace(
            new, name=trial.name, sweep_id=trial.sweep_id, trial_number=trial.number
        )
    return new


def submit_job(session: Session, owner: User, submission: Submission, backends: Backends) -> Job:
    """Check a job, queue it with where it would be placed now, commit, announce it."""
    checked = check(session, owner, submission, backends, expect=Kind.JOB)
    # Said at once when the cluster cannot hold the job now; refused when it never could;
    # the scheduler keeps the reason up to date from its next pass.
    preview = placement_preview(session, checked.job.topology, submission.priority)
    refuse_never_fit(checked.job, preview)
    return admit_run(session, owner, new_job(checked), preview, backends)


def admit_run(
    session: Session,
    owner: User,
    new: NewJob,
    preview: Preview,
    backends: Backends,
    *,
    keep: Callable[[Job], None] | None = None,
) -> Job:
    """The end of every run's admission, whatever its kind (a checked job, a prediction run:
    scheduler/admission/predict.py): its row queued with why the cluster cannot place it now,
    what else the run keeps (`keep`, given the row: a prediction run's own), commit, announce."""
    job = job_store.create_job(session, owner, new)
    if not preview.feasible:
        job.pending_reason = preview.reason
    if keep is not None:
        keep(job)
    session.commit()
    announce(backends.redis, backends.keys, JOB, job.id)  # placed now, not at the next pass
    return job


def submit_sweep(
    session: Session, owner: User, submission: Submission, backends: Backends
) -> Sweep:
    """Check a sweep (its base job held to the owner's quotas), start it, commit, announce it."""
    checked = check(session, owner, submission, backends, expect=Kind.SWEEP)
    assert checked.sweep is not None  # expect=SWEEP refused a job
    refuse_never_fit(
        checked.job, placement_preview(session, checked.job.topology, submission.priority)
    )
    sweep = create_sweep(
        session,
        owner,
        checked.sweep.to_new_sweep(
            spec_yaml=submission.spec_yaml,
            overrides=submission.overrides,
            base_dir=checked.base_dir,
            priority=submission.priority,
        ),
    )
    session.commit()
    announce(backends.redis, backends.keys, SWEEP, sweep.id)  # its first trials start now
    return sweep


def refuse_never_fit(job: CheckedJob, preview: Preview) -> None:
    """A job no alive node could ever hold, even idle, is refused rather than queued for
    ever (a cluster with no alive node yet refuses nothing: its nodes are still to come)."""
    if preview.never:
        raise JobSpecError(
            job.compiled.source.issue(
                ("cluster",),
                preview.reason,
                "ask for fewer workers, slots or GPUs per worker, or wait for larger nodes",
            )
        )


@dataclass(frozen=True)
class Validated:
    job: CheckedJob  # the job, or a sweep's base job
    preview: Preview


def validate(
    session: Session, owner: User, submission: Submission, backends: Backends
) -> Validated:
    """A dry run of a submission, job or sweep: its checks (a sweep's space too), without the
    owner's priority, submission rate and quotas, and where it would be placed now. Nothing is
    written but the count of the owner's dry runs, held to its own allowance
    (validations_per_minute) before anything is compiled."""
    limits = limits_for(session, owner, backends.settings)
    check_validation_rate(backends.redis, backends.keys, owner, limits)
    checked = check(session, owner, submission, backends, admit=False)
    preview = placement_preview(session, checked.job.topology, submission.priority)
    return Validated(checked.job, preview)


def _admit(session: Session, owner: User, submission: Submission, backends: Backends) -> Limits:
    """The owner's priority and rate; their quotas, for the checks after the compile."""
    check_priority(owner, submission.priority)
    limits = limits_for(session, owner, backends.settings)
    check_rate(backends.redis, backends.keys, owner, limits)
    return limits


def _check_quotas(
    session: Session, owner: User, limits: Limits, checked: CheckedJob, sweep: CheckedSweep | None
) -> None:
    """After compiling: train_steps, what the job would hold, the owner's storage and queue,
    and a sweep's trials."""
    request = PlacementRequest.from_topology(0, checked.topology)
    check_new_job(
        session,
        owner,
        limits,
        train_steps=checked.spec.train_steps,
        slots=request.slots,
        gpus=request.gpus,
        max_trials=sweep.search.trial_count(checked.spec.train_steps) if sweep else None,
    )


def _base_dir(submission: Submission, owner: User, settings: Settings) -> Path:
    if submission.trial is not None:
        return submission.trial.base_dir
    base = settings.resolved_data_dir()
    if not submission.base_dir:
        return base
    # A folder on the server: reading files there is an admin's right (a user's jobs read
    # their uploaded datasets).
    admins_only(owner, f"base_dir '{submission.base_dir}'")
    try:
        if "\0" in submission.base_dir:
            raise ValueError("it holds a NUL character")
        return base / Path(submission.base_dir).expanduser()  # an absolute one replaces it
    except (RuntimeError, ValueError) as error:  # ~nosuchuser, a NUL byte
        raise InvalidRequest(
            f"base_dir '{submission.base_dir}' names no folder on the server: {error}"
        ) from None
