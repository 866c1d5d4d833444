"""Population-based training on our checkpoints (`pruner: {type: pbt, ...}`); Optuna has none.

A population of `max_parallel` members trains in generations of `interval` steps. Every trial
is one member's generation: a job that continues a checkpoint to step (g + 1) x interval and
saves its last one there (a completed run always does). When every member of generation g has
ended, the members are ranked by the metric: each of the bottom `quantile` (and any that
failed) continues from the latest checkpoint of one of the top `quantile` (exploit), with that
member's values perturbed (explore: each numeric value times one of the two `perturb` factors,
kept inside its range; choice values are copied as they are); the others continue from their
own checkpoint with their own values. Generation 0 is sampled by the sweep's algorithm.

A trial's PBT facts (member, generation, the trial whose checkpoint it continues) are Optuna
user attributes set when it is enqueued, so a trial asked before a restart gets the same job
afterwards; the plan of a generation depends only on the previous one's results and the seed,
so a plan cut short is completed with the same values. The checkpoint is copied into the new
job's run directory, where the worker resumes from it (workers/entry.py: a local job with a
checkpoint continues from it: parameters, updater state, step, data position).
"""

from __future__ import annotations

import os
import random
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from optuna.trial import FrozenTrial, TrialState
from sqlalchemy import select
from sqlalchemy.orm import Session

from contract.rundir import CHECKPOINTS, job_run_dir
from dsl.search import SearchConfig
from scheduler.store.artifacts import UnsafePath, confine_to_job
from scheduler.store.models import CheckpointRecord, Job
from scheduler.sweeps.study import Asked, SweepStudy
from workers.checkpoint import list_checkpoints

PBT_ATTR = "pbt"  # {"member": m, "generation": g, "source": trial number | None, "exploit": bool}


class MissingCheckpoint(RuntimeError):
    """The trial a member continues from left no checkpoint."""


def segment_overrides(search: SearchConfig, trial: Asked) -> dict[str, Any]:
    """What a member's job of generation g sets besides its values: it trains to the end of g."""
    if trial.pbt is None:
        return {}
    return {"train_steps": (trial.pbt["generation"] + 1) * (search.pruner.interval or 0)}


Planned = tuple[dict[str, Any], int | None, bool]  # values, source trial, exploited


@dataclass(frozen=True)
class Plan:
    trials: list[Asked]
    stuck: bool = False  # a generation ended with no member completed: the sweep can go no further


def plan_trials(study: SweepStudy, train_steps: int) -> Plan:
    """The trials to ask for now: generation 0, or the next generation once the current one
    has ended, or what a plan cut short by a restart left to ask."""
    search = study.search
    trials = study.trials()
    waiting = [t for t in trials if t.state == TrialState.WAITING]
    if waiting:  # enqueued before a restart, never asked
        return Plan([_ask(study) for _ in waiting])
    generations: dict[int, dict[int, FrozenTrial]] = {}
    for trial in trials:
        facts = trial.user_attrs[PBT_ATTR]
        generations.setdefault(facts["generation"], {})[facts["member"]] = trial
    population = search.max_parallel
    if not generations:
        return Plan([_enqueue(study, {}, member, 0, None, False) for member in range(population)])
    current = max(generations)
    if len(generations[current]) == population:
        if any(t.state == TrialState.RUNNING for t in generations[current].values()):
            return Plan([])
        if current + 1 >= search.generations(train_steps):
            return Plan([])
        current += 1
    planned: dict[int, Planned] | None = {m: ({}, None, False) for m in range(population)}
    if current > 0:  # (generation 0 cut short: sample the rest)
        planned = _next_generation(search, generations[current - 1], current)
    if planned is None:
        return Plan([], stuck=True)
    made = generations.get(current, {})
    return Plan(
        [
            _enqueue(study, params, member, current, source, exploit)
            for member, (params, source, exploit) in sorted(planned.items())
            if member not in made
        ]
    )


def _next_generation(
    search: SearchConfig, previous: dict[int, FrozenTrial], generation: int
) -> dict[int, Planned] | None:
    done = [t for t in previous.values() if t.state == TrialState.COMPLETE]
    if not done:
        return None
    sign = -1.0 if search.objective_list()[0].mode == "max" else 1.0
    ranked = sorted(done, key=lambda t: (sign * t.values[0], t.number))  # best first
    count = max(1, int(search.pruner.quantile * len(previous)))
    top = ranked[:count]
    losers = {t.number for t in ranked[len(ranked) - count :] if t not in top}
    losers |= {t.number for t in previous.values() if t.state != TrialState.COMPLETE}
    out: dict[int, Planned] = {}
    replaced = 0
    for member, trial in sorted(previous.items()):
        if trial.number not in losers:
            out[member] = (dict(trial.params), trial.number, False)
            continue
        winner = top[replaced % len(top)]
        replaced += 1
        rng = random.Random(f"{search.seed}-{generation}-{member}")
        out[member] = (explore(search, winner.params, rng), winner.number, True)
    return out


def explore(search: SearchConfig, params: dict[str, Any], rng: random.Random) -> dict[str, Any]:
    """A winner's values perturbed: numeric ones times a `perturb` factor, clipped to their
    range (whole numbers rounded); choices kept."""
    out = dict(params)
    for path, entry in search.space.items():
        if entry.choice is not None or path not in params:
            continue
        low, high = entry.bounds
        value = min(max(params[path] * rng.choice(search.pruner.perturb), low), high)
        out[path] = round(value) if entry.int is not None else float(value)
    return out


def _enqueue(
    study: SweepStudy,
    params: dict[str, Any],
    member: int,
    generation: int,
    source: int | None,
    exploit: bool,
) -> Asked:
    facts = {"member": member, "generation": generation, "source": source, "exploit": exploit}
    study.study.enqueue_trial(params, user_attrs={PBT_ATTR: facts})
    return _ask(study)


def _ask(study: SweepStudy) -> Asked:
    asked = study.ask()  # takes the oldest enqueued trial, sampling any value it lacks
    storage = study.storage
    trial_id = storage.get_trial_id_from_study_id_trial_number(study.study_id, asked.number)
    return Asked(asked.number, asked.params, storage.get_trial(trial_id).user_attrs[PBT_ATTR])


def continue_member(
    session: Session,
    job: Job,
    trial: Asked,
    jobs: dict[int | None, Job],
    search: SearchConfig,
    artifacts: Path,
) -> None:
    """Set up a member's new job: its schedule, and the checkpoint it continues from copied
    into its run directory (generation 0 starts from scratch)."""
    assert trial.pbt is not None
    source = trial.pbt["source"]
    entry = {
        "step": trial.pbt["generation"] * (search.pruner.interval or 0),
        "params": dict(trial.params),
        "from_trial": source if trial.pbt["exploit"] else None,
    }
    if source is None:
        job.pbt_schedule = [entry]
        return
    before = jobs[source]
    job.pbt_schedule = [*(before.pbt_schedule or []), entry]
    found = latest_checkpoint(session, before, artifacts)
    if found is None:
        raise MissingCheckpoint(f"trial {source} (job {before.id}) left no checkpoint")
    folder = job_run_dir(artifacts, job.id) / CHECKPOINTS
    shutil.rmtree(folder, ignore_errors=True)  # a job id used before a rollback: start clean
    folder.mkdir(parents=True)
    tmp = folder / (found.name + ".tmp")
    shutil.copyfile(found, tmp)
    os.replace(tmp, folder / found.name)


def latest_checkpoint(session: Session, job: Job, artifacts: Path) -> Path | None:
    """The newest checkpoint the job recorded (or, unrecorded yet, left in its run directory),
    resolved inside the job's run directory: a recorded path or a link that leads elsewhere
    (another job's checkpoint, another user's dataset) is never copied into a trial."""
    paths = session.scalars(
        select(CheckpointRecord.path)
        .where(CheckpointRecord.job_id == job.id)
        .order_by(CheckpointRecord.step.desc())
    )
    on_disk = list_checkpoints(job_run_dir(artifacts, job.id) / CHECKPOINTS)
    for path in [*paths, *(path for _, path in reversed(on_disk))]:
        try:
            confined = confine_to_job(path, artifacts, job.id, what="checkpoint")
        except UnsafePath:
            continue
        if confined.is_file():
            return confined
    return None
