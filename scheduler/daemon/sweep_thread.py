"""Running sweeps: the scheduler's sweep thread, and the ingester's pruning of trials.

Every pass, for each running sweep: tell its study the result of every trial job that ended
(COMPLETE with its metrics, PRUNED, or FAIL), then ask for new trials while fewer than
`max_parallel` are live and fewer than the sweep's trial count exist. A trial is an ordinary
job, checked and queued by the submission pipeline (scheduler/admission/submit.py) with the
sweep's priority, so trials take their turn with other users' jobs.

Restarts lose and repeat nothing: Optuna numbers a trial when it is asked, and the trial's job
records that number (unique per sweep). A trial asked but without a job (the scheduler stopped
between the two) gets its job at the next pass, with the parameters it was asked with.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import redis
from optuna.trial import FrozenTrial, TrialState
from sqlalchemy import select
from sqlalchemy.orm import Session

from contract.keys import Keys
from contract.settings import Settings
from dsl.search import SearchConfig
from scheduler.daemon.trial_checks import check_trial
from scheduler.ingest.batch import Pruned
from scheduler.store.database import Database
from scheduler.store.jobs import NewJob, create_job
from scheduler.store.models import Job, Sweep, User
from scheduler.store.states import JobState, SweepState
from scheduler.store.sweeps import cancel_live_trials, end_sweep, search_of, trial_values
from scheduler.sweeps.pbt import (
    PBT_ATTR,
    MissingCheckpoint,
    continue_member,
    plan_trials,
    segment_overrides,
)
from scheduler.sweeps.study import Asked, StudyUnavailable, SweepStudy, open_storage
from scheduler.sweeps.warm_start import seed_sweep

log = logging.getLogger("trainyard.sweeps")

SWEEP_SECONDS = 1.0
STUDY_CACHE = 64
TRIAL_CACHE = 4096  # jobs the ingester remembers as trials (or not)


class SweepFailed(Exception):
    """The sweep cannot go on: a trial's job is invalid, or its algorithm is not installed."""


class Studies:
    """Each sweep's SweepStudy, opened once per thread that uses it (least recent out)."""

    def __init__(self, sql_url: str) -> None:
        self.sql_url = sql_url
        self._items: OrderedDict[int, SweepStudy] = OrderedDict()

    def get(self, sweep: Sweep) -> SweepStudy:
        study = self._items.get(sweep.id)
        if study is None:
            train_steps = int(sweep.base_job.get("train_steps", 1))
            study = SweepStudy(
                open_storage(self.sql_url), sweep.study_name, search_of(sweep), train_steps
            )
            self._items[sweep.id] = study
        self._items.move_to_end(sweep.id)
        while len(self._items) > STUDY_CACHE:
            self._items.popitem(last=False)
        return study

    def drop(self, sweep_id: int) -> None:
        self._items.pop(sweep_id, None)


def run_sweeps(
    db: Database,
    settings: Settings,
    client: redis.Redis,
    keys: Keys,
    stop: threading.Event,
    due: threading.Event,
    created: threading.Event,
) -> None:
    """The scheduler's sweep thread: a pass every SWEEP_SECONDS, and one at once when `due` is
    set (the ingester saw a trial end: its successor is asked for without waiting), until
    `stop` is set. Whoever sets `stop` sets `due` too, to end the wait. `created` is set once
    a pass has created trials, for the scheduling loop to place them without waiting."""
    runner = SweepRunner(db, settings, client, keys)
    while not stop.is_set():
        due.clear()  # before the pass: a trial that ends during it is seen by the next one
        try:
            if runner.run_once():
                created.set()
        except Exception:
            log.exception("sweep pass failed; retrying")
        due.wait(SWEEP_SECONDS)


class SweepRunner:
    def __init__(self, db: Database, settings: Settings, client: redis.Redis, keys: Keys) -> None:
        self.db, self.settings, self.client, self.keys = db, settings, client, keys
        self.studies = Studies(settings.sql_url())
        self.checked_in = 0  # the process that checked the last trial

    def run_once(self) -> int:
        """A pass over every running sweep; the number of trial jobs it created."""
        with self.db.session() as session:
            running = session.scalars(
                select(Sweep.id).where(Sweep.state == SweepState.RUNNING).order_by(Sweep.id)
            ).all()
        created = 0
        for sweep_id in running:
            try:
                created += self.advance(sweep_id)
            except Exception:
                log.exception("sweep %s: pass failed; retrying", sweep_id)
                self.studies.drop(sweep_id)
        return created

    def advance(self, sweep_id: int) -> int:
        """One sweep's pass, in one transaction holding its row; the trial jobs it created
        (committed when this returns)."""
        created = 0
        with self.db.session() as session:
            sweep = session.get(Sweep, sweep_id, with_for_update=True)
            if sweep is None or SweepState(sweep.state).terminal:
                return 0
            try:
                try:
                    study = self.studies.get(sweep)
                except StudyUnavailable as exc:
                    raise SweepFailed(str(exc)) from None
                created = self._advance(session, sweep, study)
            except SweepFailed as exc:
                log.warning("sweep %s failed: %s", sweep.id, exc)
                cancel_live_trials(session, sweep, self.client, self.keys)
                end_sweep(sweep, SweepState.FAILED, str(exc))
            if SweepState(sweep.state).terminal:
                self.studies.drop(sweep.id)
        return created

    def _advance(self, session: Session, sweep: Sweep, study: SweepStudy) -> int:
        """Optuna's side first (tell, ask), then ours: on SQLite the job store's write lock is
        held only for the writes at the end, never while Optuna's file is waited on."""
        search = study.search
        jobs = {job.trial_number: job for job in session.scalars(_trial_jobs(sweep.id))}
        asked = {trial.number: trial for trial in study.trials()}
        if search.warm_start is not None and not asked:
            seeded = seed_sweep(session, sweep, study)
            log.info("sweep %s: %s trials of sweep %s seed it", sweep.id, seeded, search.warm_start)
        told = self._tell_ended(study, jobs, asked)
        # Trials asked before a restart whose jobs were never written get them now.
        todo = [
            Asked(number, dict(trial.params), trial.user_attrs.get(PBT_ATTR))
            for number, trial in sorted(asked.items())
            if trial.state == TrialState.RUNNING and number not in jobs
        ]
        if sweep.cancel_requested:
            for orphan in todo:
                study.tell(orphan.number, None, TrialState.FAIL)
            todo = []
        live = sum(not JobState(job.state).terminal for job in jobs.values()) + len(todo)
        train_steps = int(sweep.base_job.get("train_steps", 1))
        total, stuck = search.trial_count(train_steps), False
        if search.pruner.type == "pbt" and not sweep.cancel_requested:
            plan = plan_trials(study, train_steps)
            todo, stuck = todo + plan.trials, plan.stuck
            live += len(plan.trials)
        elif not sweep.cancel_requested:
            while live < search.max_parallel and len(asked) + len(todo) < total:
                todo.append(study.ask())
                live += 1
        count = len(study.trials())
        owner = session.get_one(User, sweep.owner_id)
        checked = [
            (trial, self._check_trial(session, sweep, owner, study, trial)) for trial in todo
        ]
        done = live == 0 and (sweep.cancel_requested or count >= total or stuck)
        best = study.best() if told or done else None
        for trial, submission in checked:
            jobs[trial.number] = self._create_trial(session, sweep, owner, submission)
            if trial.pbt is not None:
                try:
                    continue_member(
                        session, jobs[trial.number], trial, jobs, search, self.settings.artifacts()
                    )
                except MissingCheckpoint as exc:
                    raise SweepFailed(f"trial {trial.number} cannot continue: {exc}") from None
        if best is not None:
            _record_best(sweep, search, best)
        if done:
            _finish(sweep, jobs)
        return len(checked)

    def _tell_ended(
        self, study: SweepStudy, jobs: dict[int | None, Job], asked: dict[int, FrozenTrial]
    ) -> int:
        """Tell the study the result of every trial job that ended since; how many."""
        told = 0
        objectives = study.search.objective_list()
        for number, job in jobs.items():
            trial = asked.get(number) if number is not None else None
            if trial is None or trial.state != TrialState.RUNNING:
                continue
            state = JobState(job.state)
            if not state.terminal:
                continue
            values = trial_values(job, objectives)
            if state == JobState.SUCCEEDED and values is not None:
                study.tell(trial.number, values, TrialState.COMPLETE)
            elif state == JobState.PRUNED:
                study.tell(trial.number, None, TrialState.PRUNED)
            else:
                if state == JobState.SUCCEEDED:
                    names = ", ".join(o.metric for o in objectives)
                    log.warning("trial %s (job %s) reported no %s", trial.number, job.id, names)
                study.tell(trial.number, None, TrialState.FAIL)
            told += 1
        return told

    def _check_trial(
        self, session: Session, sweep: Sweep, owner: User, study: SweepStudy, trial: Asked
    ) -> NewJob:
        """The trial's job, through a submission's checks (not its owner's rate and quotas:
        the sweep was held to them when it was submitted), in the checking process
        (scheduler/daemon/trial_checks.py); an invalid one fails the sweep."""
        done = check_trial(
            self.settings,
            sweep.id,
            trial.number,
            trial.params,
            segment_overrides(study.search, trial),
        )
        self.checked_in = done.pid
        if done.new is None:
            study.tell(trial.number, None, TrialState.FAIL)
            raise SweepFailed(
                f"trial {trial.number} with {trial.params} is not a valid job: {done.error}"
            )
        return done.new

    def _create_trial(self, session: Session, sweep: Sweep, owner: User, new: NewJob) -> Job:
        job = create_job(session, owner, new)
        log.info(
            "sweep %s: trial %s is job %s with %s",
            sweep.id,
            job.trial_number,
            job.id,
            job.overrides,
        )
        return job


def _finish(sweep: Sweep, jobs: dict[int | None, Job]) -> None:
    if sweep.cancel_requested:
        end_sweep(sweep, SweepState.CANCELLED)
    elif sweep.best_trial is not None or sweep.pareto_trials:
        end_sweep(sweep, SweepState.SUCCEEDED)
    else:
        states = sorted(str(job.state) for job in jobs.values())
        counts = ", ".join(f"{states.count(s)} {s}" for s in dict.fromkeys(states))
        end_sweep(sweep, SweepState.FAILED, f"no trial completed ({counts})")
    log.info("sweep %s %s", sweep.id, sweep.state)


def _trial_jobs(sweep_id: int) -> Any:
    return select(Job).where(Job.sweep_id == sweep_id).order_by(Job.trial_number)


def _record_best(sweep: Sweep, search: SearchConfig, best: list[FrozenTrial]) -> None:
    if len(search.objective_list()) > 1:
        sweep.pareto_trials = sorted(trial.number for trial in best)
    elif best:
        # Ties: the earliest trial with the best value.
        first = min(best, key=lambda trial: trial.number)
        sweep.best_trial, sweep.best_value = first.number, first.values[0]


@dataclass(frozen=True)
class _Trial:
    sweep_id: int
    number: int
    train_steps: int


class TrialPruning:
    """The ingester's hook: a trial job's intermediate values of its sweep's metric go to the
    sweep's pruner before the batch is written; a trial that trails is stopped (PRUNED at the
    step, the rung, where it fell behind). Best effort: a failure is logged and ingestion goes
    on. Optuna is consulted outside the job store's transaction."""

    def __init__(self, db: Database, sql_url: str) -> None:
        self.db = db
        self.studies = Studies(sql_url)
        self._trials: OrderedDict[int, _Trial | None] = OrderedDict()  # job id -> trial

    def pruned_at(self, job_id: int, rows: list[dict[str, Any]]) -> Pruned | None:
        try:
            trial = self._trial(job_id)
            if trial is None:
                return None
            with self.db.session() as session:
                sweep = session.get(Sweep, trial.sweep_id)
                if sweep is None or sweep.search.get("pruner", {}).get("type", "none") == "none":
                    return None
                study = self.studies.get(sweep)
            metric = study.search.metric
            points = {
                row["step"]: row["value"]
                for row in rows
                if row["name"] == metric
                and row["grp"] == 0
                and row["rank"] == 0
                and row["step"] < trial.train_steps  # the last step's value is the result
            }
            step = study.report(trial.number, sorted(points.items())) if points else None
        except Exception:
            log.exception("job %s: cannot consult its sweep's pruner", job_id)
            return None
        if step is None:
            return None
        pruner = study.search.pruner.type
        reason = (
            f"pruned at step {step} by the sweep's {pruner} pruner: {metric} {points[step]:.4g}"
        )
        return Pruned(step, f"{reason} trails the other trials")

    def _trial(self, job_id: int) -> _Trial | None:
        """Whether the job is a sweep's trial (it never changes): read once, then remembered."""
        if job_id not in self._trials:
            with self.db.session() as session:
                row = session.execute(
                    select(Job.sweep_id, Job.trial_number, Job.train_steps).where(Job.id == job_id)
                ).first()
            found = None
            if row is not None and row.sweep_id is not None and row.trial_number is not None:
                found = _Trial(row.sweep_id, row.trial_number, row.train_steps)
            self._trials[job_id] = found
            while len(self._trials) > TRIAL_CACHE:
                self._trials.popitem(last=False)
        return self._trials[job_id]
