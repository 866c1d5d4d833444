"""Carrying out recovery's decisions (scheduler/recovery/policy.py): the rows and files they change.

A job that lost a process or a node is placed again from its latest restart point.

Every placement of a job is an attempt (`Job.attempt`); its processes mark their stream records
with it, and the ingester drops the metrics of attempts the job has moved past. Placing a job
again (`requeue`):

1. writes off the job's live processes (the caller stops them through Redis);
2. takes the newest checkpoint or restart point in its run directory and links it under the
   next attempt's name, so the old processes cannot prune it while they stop;
3. deletes the metrics past that step: the new attempt reports them again, so no step is
   counted twice on a chart or in the best metric;
4. moves the job back to QUEUED with the cause, the restart count and the step, as an event.

A failure (a process that died, a lost node) counts against cluster.max_restarts; a drain (the
node agent stopped cleanly) does not. Restart points are deleted when the job ends.

In the asynchronous frameworks (downpour, hogwild) a worker that died restarts alone
(`restart_alone`): the others train on, the server shards keep the parameters, and the
scheduler places a new process for it (placing.replace_processes) that continues from the last step
it reported, pulling the shards' current parameters. A pipeline's stage restarts with the
other stages of its pipeline (its worker group), which are stopped, and they go on together
from the earliest of their steps.

`job_facts` reads what the policy needs to know of a job from its row.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Iterable
from pathlib import Path

from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

from contract.allocation import AllocationState
from contract.rundir import RESTART, attempt_point, job_run_dir, latest_restart_point
from dsl.frameworks import restarting_alone
from dsl.run_kinds import RUN_KINDS
from scheduler.placement.cluster import ACTIVE_ALLOCATIONS
from scheduler.recovery.policy import Fail, JobFacts, ReplaceShard, RestartAlone
from scheduler.store.lifecycle import transition
from scheduler.store.models import Allocation, Job, JobEvent, Metric, utcnow
from scheduler.store.states import JobState

log = logging.getLogger("trainyard.recovery")

DEFAULT_MAX_RESTARTS = 3


def max_restarts(job: Job) -> int:
    cluster = (job.spec or {}).get("cluster") or {}
    return int(cluster.get("max_restarts", DEFAULT_MAX_RESTARTS))


def job_facts(job: Job) -> JobFacts:
    """What the recovery policy needs to know of `job`."""
    return JobFacts(
        state=JobState(job.state),
        cancel_requested=job.cancel_requested,
        restart="alone" if _restarts_alone(job) else "gang",
        pipelined=int((job.topology or {}).get("stages", 1) or 1) > 1,
        restarts=job.restarts,
        max_restarts=max_restarts(job),
    )


def _restarts_alone(job: Job) -> bool:
    """Whether a failed worker of `job` restarts alone: its run kind's rule (a prediction run's
    workers score disjoint shards: one that failed scores its own again), else its
    framework's."""
    return RUN_KINDS.get(job.kind).restarts_alone or job.framework in restarting_alone()


def write_off(session: Session, job: Job) -> list[int]:
    """Mark the job's live processes failed; their ids, for the caller to stop."""
    live = session.scalars(
        select(Allocation).where(
            Allocation.job_id == job.id, Allocation.state.in_(ACTIVE_ALLOCATIONS)
        )
    ).all()
    for alloc in live:
        alloc.state, alloc.ended_at = AllocationState.FAILED, utcnow()
    return [alloc.id for alloc in live]


def requeue(
    session: Session,
    job: Job,
    cause: str,
    *,
    artifacts: Path | None,
    counted: bool = True,
    avoid: Iterable[str] = (),
) -> list[int]:
    """Place `job` again from its latest restart point (see the module's steps), as the policy
    decided (`Requeue`); `avoid`: nodes its processes did not start on (or were stuck on),
    added to those it avoids already, where placement sends it elsewhere if it can. Returns
    the allocations to stop."""
    avoided = sorted(set(job.avoided_nodes or ()) | set(avoid))
    job.avoided_nodes = avoided or None
    stops = write_off(session, job)
    job.attempt += 1
    if counted:
        job.restarts += 1
    step = resume_point(job, artifacts)
    lost = max(job.step - step, 0)
    truncate_metrics(session, job, step)
    where = f"from step {step}" + (f" ({lost} steps to train again)" if lost else "")
    if counted:
        reason = f"{cause}; restart {job.restarts} of {max_restarts(job)} {where}"
    else:
        reason = f"{cause}; placed again {where}"
    transition(session, job, JobState.QUEUED, reason)
    log.warning("job %s: %s", job.id, reason)
    return stops


def fail(session: Session, job: Job, decision: Fail) -> None:
    job.error = decision.error
    transition(session, job, JobState.FAILED, decision.reason)


def resume_point(job: Job, artifacts: Path | None) -> int:
    """Link the job's newest checkpoint or restart point as its next attempt's; its step."""
    job.restart_from = None
    if artifacts is None:
        return 0
    run_dir = job_run_dir(artifacts, job.id)
    # Metrics every disp_freq steps: those after job.step (the last one stored) may have been
    # lost (Redis restarted empty before they were ingested). A point at or past the next
    # report would leave that report missing for good; the new attempt reports it again from
    # an earlier point.
    every = int((job.spec or {}).get("disp_freq", 100) or 100)
    found = latest_restart_point(run_dir, below=(job.step // every + 1) * every)
    if found is None:
        return 0
    step, path = found
    target = attempt_point(run_dir, job.attempt)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.unlink(missing_ok=True)
        try:
            os.link(path, target)
        except OSError:  # a file system without hard links: a copy
            shutil.copyfile(path, target)
    except OSError as exc:  # pruned by the stopping process just now, or the disk is full
        log.warning("job %s: cannot keep restart point %s: %s", job.id, path, exc)
        return 0
    job.restart_from = str(target)
    return step


def truncate_metrics(session: Session, job: Job, step: int) -> None:
    """Forget the metrics past `step` (the next attempt reports them again), and the best
    value of the job's objective among them."""
    session.execute(delete(Metric).where(Metric.job_id == job.id, Metric.step > step))
    job.step = step
    _recount_best(session, job)


def _recount_best(session: Session, job: Job) -> None:
    """The best value of the job's objective among the metrics it keeps."""
    points = session.execute(
        select(Metric.step, Metric.value).where(
            Metric.job_id == job.id,
            Metric.name == job.objective,
            Metric.group == 0,
            Metric.rank == 0,
        )
    )
    found = best_of(((int(s), float(v)) for s, v in points), job.objective_mode)
    job.best_step, job.best_metric = found if found is not None else (None, None)


def best_of(
    points: Iterable[tuple[int, float]],
    mode: str,
    best: tuple[int | None, float] | None = None,
) -> tuple[int | None, float] | None:
    """The best (step, value) of `points` and `best` so far for an objective of `mode` (max or
    min); of equal values, the earliest step's. None: no point at all."""
    for step, value in points:
        if best is None:
            best = (step, value)
            continue
        at, top = best
        ahead = value > top if mode == "max" else value < top
        if ahead or (value == top and at is not None and step < at):
            best = (step, value)
    return best


def prune_restart_points(artifacts: Path, job_id: int) -> bool:
    """Delete an ended job's restart points (its user checkpoints stay); whether any were."""
    directory = job_run_dir(artifacts, job_id) / RESTART
    if not directory.is_dir():
        return False
    shutil.rmtree(directory, ignore_errors=True)
    return True


def restart_alone(
    session: Session, job: Job, alloc: Allocation, decision: RestartAlone
) -> list[int]:
    """A worker of an asynchronous job restarts alone, as the policy decided (`RestartAlone`;
    its new process is placed by the scheduler): counted against cluster.max_restarts, an
    event, the job's state unchanged. With `decision.group` the group's other live workers are
    written off too (their new processes are placed with its); their ids, for the caller to
    stop."""
    job.restarts += 1
    stops: list[int] = []
    who = "this worker alone"
    if decision.group:
        peers = session.scalars(
            select(Allocation).where(
                Allocation.job_id == job.id,
                Allocation.role == "worker",
                Allocation.group == alloc.group,
                Allocation.id != alloc.id,
                Allocation.state.in_(ACTIVE_ALLOCATIONS),
            )
        ).all()
        for peer in peers:
            peer.state, peer.ended_at = AllocationState.FAILED, utcnow()
        stops = [peer.id for peer in peers]
        who = f"pipeline {alloc.group} alone, its {len(peers) + 1} stages"
    alone = f"{decision.cause}; restart {job.restarts} of {max_restarts(job)}: {who}"
    if RUN_KINDS.get(job.kind).scores_rows:
        reason = f"{alone}, scoring its shard again"
    else:
        step = alone_restart_step(session, job, alloc.group, alloc.rank)
        reason = f"{alone}, from its step {step} (the server shards keep the parameters)"
    session.add(JobEvent(job_id=job.id, at=utcnow(), state=job.state, reason=reason))
    log.warning("job %s: %s", job.id, reason)
    return stops


def replace_shard(session: Session, job: Job, decision: ReplaceShard) -> None:
    """Not a transition: the job runs on, its workers waiting for the shard's updates (the
    scheduler places the shard's new process)."""
    session.add(JobEvent(job_id=job.id, at=utcnow(), state=job.state, reason=decision.note))


def alone_restart_step(session: Session, job: Job, group: int, rank: int) -> int:
    """The step a worker restarted alone goes on from: the last display step (a multiple of
    disp_freq) before the last step it reported, so that it reports that step again.

    A worker reports one step in several records, one after another: the parameter-server
    figures (ps/version, ps/staleness) in its update, then the training figures, then any
    evaluation. A process killed between two of them leaves its last step half reported, and
    going on from that step would leave the rest of it missing for good (faults.py once found
    one train/loss missing so). `forget_reports_past` drops what it reported after this step,
    which the new process reports again: none missing, none twice.

    A pipeline's stages go on from one step, the earliest of theirs."""
    stages = int((job.topology or {}).get("stages", 1) or 1)
    ranks = range(stages) if stages > 1 else (rank,)
    last = min(worker_step(session, job.id, group, r) for r in ranks)
    every = int((job.spec or {}).get("disp_freq", 100) or 100)
    return max(last - 1, 0) // every * every


def forget_reports_past(session: Session, job: Job, group: int, rank: int, step: int) -> None:
    """Delete the metrics worker (group, rank) of `job` reported after `step` (its process
    restarted alone from there reports them again)."""
    session.execute(
        delete(Metric).where(
            Metric.job_id == job.id,
            Metric.group == group,
            Metric.rank == rank,
            Metric.step > step,
        )
    )
    if group == 0 and rank == 0:  # the objective is read from worker 0/0's reports
        _recount_best(session, job)


def worker_step(session: Session, job_id: int, group: int, rank: int) -> int:
    """The last step worker (group, rank) of a job reported (0: none)."""
    step = session.scalar(
        select(func.max(Metric.step)).where(
            Metric.job_id == job_id, Metric.group == group, Metric.rank == rank
        )
    )
    return int(step or 0)
