"""The recovery policy: every branch of `decide`, from plain facts, no database and no Redis."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from contract.allocation import AllocationState, ExitCode, not_started
from scheduler.recovery.policy import (
    MAX_SHARD_REPLACEMENTS,
    MEMORY_HINT,
    Continue,
    Decision,
    Ended,
    Event,
    Fail,
    Finish,
    JobFacts,
    NodeLost,
    PlaceAgain,
    ReplaceShard,
    Requeue,
    RestartAlone,
    Silent,
    Unstarted,
    Vacant,
    decide,
    headline,
)
from scheduler.store.states import JobState

DONE, FAILED, RUNNING = AllocationState.DONE, AllocationState.FAILED, AllocationState.RUNNING
GANG = JobFacts(
    state=JobState.RUNNING,
    cancel_requested=False,
    restart="gang",
    pipelined=False,
    restarts=0,
    max_restarts=3,
)
ALONE = replace(GANG, restart="alone")  # downpour, hogwild
WHO = "worker 0/1 on n1"
KILLED = "exited -9 (killed by SIGKILL)"
CANCELLED_BY_USER = Finish(JobState.CANCELLED, "cancelled by the user")
LOST = "node lost: n1 sent no heartbeat for 3s"
SILENT = "worker 0/1 on n1: no word from its node agent for 3s"
NOT_STARTED = not_started("its memory cgroup could not be made", PermissionError(13, "denied"))
UNSTARTED = "worker 0/1 on n1 did not start within 3s"
NO_START_LEFT = f"{UNSTARTED} (no restarts left: cluster.max_restarts is 3)"


def ended(
    end: AllocationState = FAILED,
    job: JobFacts = GANG,
    *,
    role: str = "worker",
    exit_code: int | None = -9,
    reason: str = KILLED,
    shard_failures: int = 0,
    workers: tuple[AllocationState, ...] = (RUNNING, RUNNING),
    step: int = 0,
    **job_changes: Any,
) -> Ended:
    who = WHO if role == "worker" else "server 0/0 on n1"
    return Ended(
        job=replace(job, **job_changes),
        who=who,
        role=role,
        state=end,
        exit_code=exit_code,
        reason=reason,
        shard_failures=shard_failures,
        workers=workers,
        step=step,
    )


def shard(failures: int, **changes: Any) -> Ended:
    return ended(role="server", shard_failures=failures, **changes)


def fail(reason: str = KILLED, who: str = WHO) -> Fail:
    return Fail(error=reason, reason=f"{who} failed: {reason}")


def lost_fail(max_restarts: int = 3) -> Fail:
    error = f"{LOST} (no restarts left: cluster.max_restarts is {max_restarts})"
    return Fail(error=error, reason=error)


OUT_OF_MEMORY = "exceeded its 2048 MB limit\n(peak memory 2.0 GB; exit code 6)\nKilled"


def memory_fail() -> Fail:
    error = f"{WHO} exceeded its 2048 MB limit at step 1200; {MEMORY_HINT}"
    return Fail(error=error, reason=error)


REPLACED = ReplaceShard(
    f"server 0/0 on n1 failed: {KILLED}; it is placed again and continues from Redis"
)
CASES: list[tuple[str, Event, Decision]] = [
    # -- a process ended: failed -------------------------------------------------------------
    ("failed worker: the gang restarts", ended(), Requeue(f"{WHO} {KILLED}", counted=True)),
    ("the last restart left", ended(restarts=2), Requeue(f"{WHO} {KILLED}", counted=True)),
    ("restarts reached max_restarts", ended(restarts=3), fail()),
    ("max_restarts 0", ended(max_restarts=0), fail()),
    (
        "a scheduled job restarts too",
        ended(state=JobState.SCHEDULED),
        Requeue(f"{WHO} {KILLED}", counted=True),
    ),
    ("a queued job cannot be placed again", ended(state=JobState.QUEUED), fail()),
    ("cancel during a failure", ended(cancel_requested=True), fail()),
    ("INVALID: would fail again", ended(exit_code=ExitCode.INVALID, reason="bad"), fail("bad")),
    (
        "DIVERGED: would diverge again",
        ended(exit_code=ExitCode.DIVERGED, reason="nan"),
        fail("nan"),
    ),
    (
        "OUT_OF_MEMORY: past its limit again, not a lost machine",
        ended(exit_code=ExitCode.OUT_OF_MEMORY, reason=OUT_OF_MEMORY, step=1200),
        memory_fail(),
    ),
    (
        "OUT_OF_MEMORY of a worker that would restart alone",
        ended(job=ALONE, exit_code=ExitCode.OUT_OF_MEMORY, reason=OUT_OF_MEMORY, step=1200),
        memory_fail(),
    ),
    ("a failure without a reason", ended(reason=""), Requeue(f"{WHO} failed", counted=True)),
    (
        "the exception's last line",
        ended(exit_code=1, reason="exited 1\nTraceback\nValueError: x"),
        Requeue(f"{WHO} exited 1: ValueError: x", counted=True),
    ),
    (
        "its last restart, failing for good",
        ended(exit_code=1, reason="a\nb", restarts=3),
        fail("a\nb"),
    ),
    (
        "a process that did not start: placed again, the step in the cause",
        ended(exit_code=None, reason=NOT_STARTED, state=JobState.SCHEDULED),
        Requeue(f"{WHO} {NOT_STARTED}", counted=True),
    ),
    (
        "a process that did not start, no restarts left",
        ended(exit_code=None, reason=NOT_STARTED, restarts=3),
        fail(NOT_STARTED),
    ),
    # an asynchronous worker restarts alone; a pipelined one with its pipeline's other stages
    ("asynchronous worker", ended(job=ALONE), RestartAlone(f"{WHO} {KILLED}")),
    (
        "asynchronous worker, last restart",
        ended(job=ALONE, restarts=2),
        RestartAlone(f"{WHO} {KILLED}"),
    ),
    ("asynchronous worker, no restarts left", ended(job=ALONE, restarts=3), fail()),
    ("asynchronous worker, cancelling", ended(job=ALONE, cancel_requested=True), fail()),
    ("asynchronous worker, INVALID", ended(job=ALONE, exit_code=ExitCode.INVALID), fail()),
    (
        "pipelined asynchronous worker",
        ended(job=ALONE, pipelined=True),
        RestartAlone(f"{WHO} {KILLED}", group=True),
    ),
    (
        "pipelined asynchronous worker, no restarts left",
        ended(job=ALONE, pipelined=True, restarts=3),
        fail(),
    ),
    ("pipelined synchronous worker", ended(pipelined=True), Requeue(f"{WHO} {KILLED}", True)),
    ("synchronous worker", ended(job=GANG), Requeue(f"{WHO} {KILLED}", counted=True)),
    # a server shard is placed again, up to MAX_SHARD_REPLACEMENTS times per placement
    ("first shard failure", shard(1), REPLACED),
    ("a shard's last replacement", shard(MAX_SHARD_REPLACEMENTS), REPLACED),
    (
        "a shard's replacement past the limit: the gang restarts",
        shard(MAX_SHARD_REPLACEMENTS + 1),
        Requeue(f"server 0/0 on n1 {KILLED}", counted=True),
    ),
    (
        "a shard past the limit, no restarts left",
        shard(MAX_SHARD_REPLACEMENTS + 1, max_restarts=0),
        fail(who="server 0/0 on n1"),
    ),
    (
        "a shard of a job being cancelled",
        shard(1, cancel_requested=True),
        fail(who="server 0/0 on n1"),
    ),
    ("a shard of a queued job", shard(1, state=JobState.QUEUED), fail(who="server 0/0 on n1")),
    ("a shard of a scheduled job", shard(1, state=JobState.SCHEDULED), REPLACED),
    (
        "a shard's INVALID exit: replaced all the same",
        ended(role="server", shard_failures=1, exit_code=ExitCode.INVALID),
        REPLACED,
    ),
    ("a shard of an asynchronous job", shard(1, job=ALONE), REPLACED),
    # -- drained: placed again, not counted ---------------------------------------------------
    (
        "drained",
        ended(AllocationState.DRAINED, reason="node n1 is draining"),
        Requeue(f"{WHO}: node n1 is draining", counted=False),
    ),
    (
        "drained, restarts at max_restarts",
        ended(AllocationState.DRAINED, reason="draining", restarts=3, max_restarts=3),
        Requeue(f"{WHO}: draining", counted=False),
    ),
    (
        "drained, asynchronous worker: the gang",
        ended(AllocationState.DRAINED, job=ALONE, reason="draining"),
        Requeue(f"{WHO}: draining", counted=False),
    ),
    (
        "drained while cancelling",
        ended(AllocationState.DRAINED, cancel_requested=True),
        CANCELLED_BY_USER,
    ),
    ("drained, a queued job", ended(AllocationState.DRAINED, state=JobState.QUEUED), Continue()),
    # -- cancelled ----------------------------------------------------------------------------
    (
        "cancelled by the user",
        ended(AllocationState.CANCELLED, cancel_requested=True),
        CANCELLED_BY_USER,
    ),
    (
        "cancelled by its agent",
        ended(AllocationState.CANCELLED, reason="stopped"),
        Finish(JobState.CANCELLED, f"{WHO}: stopped"),
    ),
    # -- done ---------------------------------------------------------------------------------
    (
        "the last worker done",
        ended(DONE, exit_code=0, workers=(DONE, DONE)),
        Finish(JobState.SUCCEEDED, "all 2 worker(s) finished"),
    ),
    ("one worker still running", ended(DONE, exit_code=0, workers=(DONE, RUNNING)), Continue()),
    (
        "a worker waiting for its new process",
        ended(DONE, exit_code=0, workers=(DONE, FAILED)),
        Continue(),
    ),
    ("a server done, no workers", ended(DONE, role="server", workers=()), Continue()),
    (
        "the last worker done while cancelling",
        ended(DONE, workers=(DONE,), cancel_requested=True),
        Finish(JobState.SUCCEEDED, "all 1 worker(s) finished"),
    ),
    # -- a job that has ended already: nothing changes ----------------------------------------
    *[
        (f"{how} of a {state} job", ended(how, state=state), Continue())
        for state in (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.PRUNED)
        for how in (FAILED, AllocationState.DRAINED, AllocationState.CANCELLED, DONE)
    ],
    ("not an end", ended(AllocationState.PENDING), Continue()),
    # -- a node lost: the whole gang ----------------------------------------------------------
    ("node lost", NodeLost(GANG, LOST, counted=True), Requeue(LOST, counted=True)),
    (
        "node lost, restarts at max_restarts",
        NodeLost(replace(GANG, restarts=3), LOST, counted=True),
        lost_fail(),
    ),
    (
        "node lost, max_restarts 0",
        NodeLost(replace(GANG, max_restarts=0), LOST, counted=True),
        lost_fail(0),
    ),
    (
        "a draining node left: not counted",
        NodeLost(replace(GANG, restarts=3), LOST, counted=False),
        Requeue(LOST, counted=False),
    ),
    (
        "node lost while cancelling",
        NodeLost(replace(GANG, cancel_requested=True), LOST, counted=True),
        Finish(JobState.CANCELLED, f"cancelled by the user ({LOST})"),
    ),
    (
        "node lost, a queued job",
        NodeLost(replace(GANG, state=JobState.QUEUED), LOST, counted=False),
        lost_fail(),
    ),
    (
        "node lost, an asynchronous job: the gang",
        NodeLost(ALONE, LOST, counted=True),
        Requeue(LOST, counted=True),
    ),
    (
        "node lost, an ended job",
        NodeLost(replace(GANG, state=JobState.FAILED), LOST, counted=True),
        Continue(),
    ),
    # -- a process its agent no longer vouches for --------------------------------------------
    ("silent", Silent(GANG, SILENT), Requeue(SILENT, counted=True)),
    (
        "silent, restarts at max_restarts",
        Silent(replace(GANG, restarts=3), SILENT),
        Fail(SILENT, SILENT),
    ),
    ("silent while cancelling", Silent(replace(GANG, cancel_requested=True), SILENT), Continue()),
    (
        "silent, a queued job",
        Silent(replace(GANG, state=JobState.QUEUED), SILENT),
        Fail(SILENT, SILENT),
    ),
    ("silent, an ended job", Silent(replace(GANG, state=JobState.SUCCEEDED), SILENT), Continue()),
    # -- a placed process that never started -------------------------------------------------
    ("unstarted", Unstarted(GANG, UNSTARTED), Requeue(UNSTARTED, counted=True)),
    (
        "unstarted, a scheduled job",
        Unstarted(replace(GANG, state=JobState.SCHEDULED), UNSTARTED),
        Requeue(UNSTARTED, counted=True),
    ),
    (
        "unstarted, restarts at max_restarts",
        Unstarted(replace(GANG, restarts=3), UNSTARTED),
        Fail(NO_START_LEFT, NO_START_LEFT),
    ),
    (
        "unstarted while cancelling",
        Unstarted(replace(GANG, cancel_requested=True), UNSTARTED),
        Finish(JobState.CANCELLED, f"cancelled by the user ({UNSTARTED})"),
    ),
    (
        "unstarted, an ended job",
        Unstarted(replace(GANG, state=JobState.CANCELLED), UNSTARTED),
        Continue(),
    ),
    # -- a failed process that nothing replaced yet -------------------------------------------
    ("vacant shard", Vacant(GANG, "server"), PlaceAgain()),
    ("vacant asynchronous worker", Vacant(ALONE, "worker"), PlaceAgain()),
    ("vacant synchronous worker", Vacant(GANG, "worker"), Continue()),
    (
        "vacant shard, cancelling",
        Vacant(replace(GANG, cancel_requested=True), "server"),
        Continue(),
    ),
    (
        "vacant asynchronous worker, cancelling",
        Vacant(replace(ALONE, cancel_requested=True), "worker"),
        Continue(),
    ),
]


@pytest.mark.parametrize(("event", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_decide(event: Event, expected: Decision) -> None:
    assert decide(event) == expected


def test_the_cases_have_names_of_their_own() -> None:
    names = [name for name, _, _ in CASES]
    assert len(names) == len(set(names))


def test_every_decision_is_made_somewhere() -> None:
    made = {type(expected) for _, _, expected in CASES}
    assert made == {Continue, Finish, Fail, Requeue, RestartAlone, ReplaceShard, PlaceAgain}


@pytest.mark.parametrize(
    ("reason", "exit_code", "expected"),
    [
        ("exited 1\nTraceback\n  ...\nValueError: boom", 1, "exited 1: ValueError: boom"),
        ("exited -9 (killed by SIGKILL)\nstep 40", -9, "exited -9 (killed by SIGKILL)"),
        ("lost\nlast words", None, "lost"),
        ("exited 1", 1, "exited 1"),
        ("  \n exited 1 \n\n", 1, "exited 1"),
        ("", 1, ""),
        ("\n", 1, "\n"),
    ],
)
def test_a_failures_headline(reason: str, exit_code: int | None, expected: str) -> None:
    assert headline(reason, exit_code) == expected
