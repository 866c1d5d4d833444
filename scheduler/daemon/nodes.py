"""Nodes as the scheduler sees them: the agents' registrations in Redis synced into SQL rows,
and what a lost node means for the jobs that ran on it.

A node whose heartbeat value stops changing (on the scheduler's own clock) for the timeout, or
whose registration is gone, is lost: its processes are written off and their jobs placed again
from their restart points.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import redis
from sqlalchemy import select
from sqlalchemy.orm import Session

from contract.allocation import SEEN, AllocationState
from contract.codec import decode
from contract.keys import Keys
from contract.nodes import NodeRegistration
from scheduler.placement.cluster import ACTIVE_ALLOCATIONS
from scheduler.recovery.actions import fail, job_facts, requeue, write_off
from scheduler.recovery.policy import (
    Continue,
    Fail,
    Finish,
    JobFacts,
    NodeLost,
    Requeue,
    Silent,
    Unstarted,
    decide,
)
from scheduler.store.lifecycle import transition
from scheduler.store.models import Allocation, Job, Node
from scheduler.store.states import NodeState

log = logging.getLogger("trainyard.scheduler")

NODE_LOST = "node lost"


@dataclass
class NodeTracker:
    """When each node's heartbeat value last changed, on the scheduler's own clock (so node
    clocks may be skewed)."""

    seen: dict[str, tuple[str, float]] = field(default_factory=dict)

    def age(self, name: str, beat: str, now: float) -> float:
        last = self.seen.get(name)
        if last is None or last[0] != beat:
            self.seen[name] = (beat, now)
            return 0.0
        return now - last[1]


def read_nodes(client: redis.Redis, keys: Keys) -> dict[str, NodeRegistration]:
    """The registration of every node agent in Redis (a node that left has none; one that
    cannot be read is left out, and said so in the log)."""
    members: set[bytes] = client.smembers(keys.nodes)  # type: ignore[assignment]
    names = sorted(m.decode() for m in members)
    pipe = client.pipeline(transaction=False)
    for name in names:
        pipe.hgetall(keys.node(name))
    found = {}
    for name, raw in zip(names, pipe.execute(), strict=True):
        if not raw:
            continue
        try:
            found[name] = NodeRegistration.from_hash(decode(raw))
        except (KeyError, ValueError) as exc:
            log.warning("node %s: its registration cannot be read (%s); skipped", name, exc)
    return found


def sync_nodes(
    session: Session,
    reported: dict[str, NodeRegistration],
    tracker: NodeTracker,
    timeout: float,
    now: float | None = None,
    artifacts: Path | None = None,
) -> list[int]:
    """Bring Node rows up to date; returns the allocation ids to stop (their node is lost)."""
    now = time.monotonic() if now is None else now
    rows = {node.name: node for node in session.scalars(select(Node))}
    lost: list[tuple[Node, str]] = []
    for name, info in reported.items():
        fresh = tracker.age(name, repr(info.heartbeat), now) <= timeout
        row = rows.get(name)
        if row is None:
            if not fresh:
                continue
            row = Node(name=name, queue=info.queue, slots=info.slots)
            session.add(row)
            log.info("node %s joined", name)
        row.queue, row.slots, row.gpus = info.queue, info.slots, info.gpus
        row.memory_mb = info.memory_mb
        row.last_heartbeat = datetime.fromtimestamp(info.heartbeat, UTC)
        sync_reach(row, list(info.ps_unreachable))
        row.plugins = info.plugin_versions() or None
        if info.plugin_error != (row.plugin_error or ""):
            if info.plugin_error:
                log.warning("node %s takes no jobs: %s", name, info.plugin_error)
            row.plugin_error = info.plugin_error or None
        if info.draining and row.state != NodeState.DRAINING:
            # Its agent is stopping: no new work goes there; its jobs drain on their own.
            row.state = NodeState.DRAINING
            log.info("node %s is draining", name)
        elif fresh and not info.draining and row.state != NodeState.ALIVE:
            row.state = NodeState.ALIVE
            log.info("node %s is alive", name)
        elif not fresh and row.state in (NodeState.ALIVE, NodeState.DRAINING):
            lost.append((row, f"{NODE_LOST}: {name} sent no heartbeat for {timeout:g}s"))
    for name, row in rows.items():
        # A registration can vanish with its Redis (restarted empty) while the agent lives on
        # and registers again at its next heartbeat: lost only after the timeout, as silence.
        gone_for = tracker.age(name, "", now) if name not in reported else 0.0
        if name not in reported and row.state == NodeState.ALIVE and gone_for > timeout:
            lost.append((row, f"{NODE_LOST}: {name} is no longer registered"))
        elif name not in reported and row.state == NodeState.DRAINING:
            # A clean leave: what still ran there is placed again, not counted as a failure.
            lost.append((row, f"node {name} left (its agent stopped)"))
    stops: list[int] = []
    for row, reason in lost:
        counted = row.state != NodeState.DRAINING
        stops += mark_lost(session, row, reason, artifacts, counted=counted)
    return stops


def sync_reach(row: Node, unreachable: list[str]) -> None:
    """Keep what the node's agent last said it cannot reach (written when it changes)."""
    if (row.ps_unreachable or []) == unreachable:
        return
    if unreachable:
        log.warning(
            "node %s cannot reach parameter-server Redis %s", row.name, "; ".join(unreachable)
        )
    else:
        log.info("node %s reaches every parameter-server Redis", row.name)
    row.ps_unreachable = unreachable or None


def mark_lost(
    session: Session,
    node: Node,
    reason: str,
    artifacts: Path | None = None,
    *,
    counted: bool = True,
) -> list[int]:
    """The node's processes are written off; each job they belonged to is placed again from its
    latest restart point, a restart counted against cluster.max_restarts, or fails, as the
    recovery policy decides (scheduler/recovery/policy.py). Returns the allocations to stop."""
    log.warning("%s", reason)
    node.state = NodeState.LOST
    session.flush()
    on_node = session.scalars(
        select(Allocation).where(
            Allocation.node_id == node.id, Allocation.state.in_(ACTIVE_ALLOCATIONS)
        )
    ).all()
    stops: list[int] = []
    for job_id in sorted({a.job_id for a in on_node}):
        job = session.get(Job, job_id, with_for_update=True)
        if job is not None:
            lost = NodeLost(job_facts(job), reason, counted=counted)
            stops += carry_out(session, job, decide(lost), artifacts)
    return stops


def silent_allocations(
    session: Session,
    client: redis.Redis,
    keys: Keys,
    tracker: NodeTracker,
    timeout: float,
    now: float | None = None,
) -> list[Allocation]:
    """Running processes whose agent has not said it supervises them (Keys.allocation's SEEN,
    refreshed every heartbeat) for `timeout` seconds on the scheduler's clock: the agent is
    stuck, or Redis restarted empty and lost the records. A node that is lost is handled by
    `mark_lost`; this catches the processes of nodes that are still heard from."""
    now = time.monotonic() if now is None else now
    running = session.scalars(
        select(Allocation).where(Allocation.state == AllocationState.RUNNING)
    ).all()
    seen = seen_times(client, keys, running)
    return [
        alloc
        for alloc, value in zip(running, seen, strict=True)
        if tracker.age(f"allocation {alloc.id}", value, now) > timeout
    ]


def seen_times(client: redis.Redis, keys: Keys, allocations: Sequence[Allocation]) -> list[str]:
    """Each allocation's `seen` time as its agent last wrote it ("" for none), in one round trip."""
    if not allocations:
        return []
    pipe = client.pipeline(transaction=False)
    for alloc in allocations:
        pipe.hget(keys.allocation(alloc.id), SEEN)
    return [v.decode() if isinstance(v, bytes) else "" for v in pipe.execute()]


def write_off_silent(
    session: Session, silent: list[Allocation], timeout: float, artifacts: Path | None
) -> list[int]:
    """Place the jobs of silent processes again (a counted restart) or fail them."""

    def reason(alloc: Allocation, where: str) -> str:
        return (
            f"{alloc.role} {alloc.group}/{alloc.rank}{where}: no word from its node agent for "
            f"{timeout:g}s (the agent is stuck, or Redis restarted and lost its records)"
        )

    return write_off_jobs(session, silent, Silent, reason, artifacts)


def write_off_jobs(
    session: Session,
    lost: list[Allocation],
    event: Callable[[JobFacts, str], Silent | Unstarted],
    reason: Callable[[Allocation, str], str],
    artifacts: Path | None,
) -> list[int]:
    """For each job with processes in `lost` (its first one named in the reason, with where it
    was placed), what the recovery policy decides of `event`, carried out; the allocations to
    stop."""
    stops: list[int] = []
    for job_id in sorted({alloc.job_id for alloc in lost}):
        job = session.get(Job, job_id, with_for_update=True)
        if job is None:
            continue
        theirs = [a for a in lost if a.job_id == job_id]
        nodes = {a.node_id: session.get(Node, a.node_id) for a in theirs}
        node = nodes[theirs[0].node_id]
        said = reason(theirs[0], f" on {node.name}" if node is not None else "")
        log.warning("job %s: %s", job_id, said)
        # Placed again, the job avoids the nodes its processes were stuck on, if it can.
        avoid = sorted(n.name for n in nodes.values() if n is not None)
        decision = decide(event(job_facts(job), said))
        stops += carry_out(session, job, decision, artifacts, avoid=avoid)
    return stops


def carry_out(
    session: Session,
    job: Job,
    decision: Continue | Finish | Fail | Requeue,
    artifacts: Path | None,
    *,
    avoid: Iterable[str] = (),
) -> list[int]:
    """What the policy decided for a job whose processes were lost. A gang is all or nothing,
    and a lost process cannot report its end: whatever the decision, what still runs of the job
    is written off (a requeue does it as its first step; `avoid`: the nodes it should be placed
    away from). Returns the allocations to stop."""
    match decision:
        case Requeue(cause=cause, counted=counted):
            return requeue(session, job, cause, artifacts=artifacts, counted=counted, avoid=avoid)
        case Fail():
            stops = write_off(session, job)
            fail(session, job, decision)
            return stops
        case Finish(state=state, reason=reason):
            stops = write_off(session, job)
            transition(session, job, state, reason)
            return stops
        case Continue():
            return write_off(session, job)
