"""Where the scheduler would put a job if it placed it now, or why it would wait: said at
submission (POST /jobs, POST /jobs/validate), from the same nodes and rules as placement."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from scheduler.placement.cluster import node_capacities
from scheduler.placement.plan import (
    Assignment,
    PlacementRequest,
    fits_empty_cluster,
    plan_placement,
    plugin_error_note,
    unreachable_note,
)
from scheduler.store.models import Job
from scheduler.store.states import JobState

if TYPE_CHECKING:  # dsl.topology imports the job language, and with it torch
    from dsl.topology import Topology


@dataclass(frozen=True)
class Preview:
    feasible: bool  # whether the job would be placed right now
    reason: str
    assignments: list[Assignment]  # where each process would run; empty when not feasible
    # Not even on the idle cluster of the alive nodes (all of them reaching what it needs):
    # submission refuses such a job instead of queueing it for ever.
    never: bool = False


def placement_preview(session: Session, topology: Topology, priority: int) -> Preview:
    """Where a job of `topology` and `priority` would be placed now, or why it would wait."""
    nodes = node_capacities(session)
    alive = [node for node in nodes if node.alive]
    request = PlacementRequest.from_topology(0, topology, priority=priority)
    if not alive:
        return Preview(
            feasible=False,
            reason="no node agent is alive; start one with `trainyard node` (or `trainyard up`)",
            assignments=[],
        )
    plan = plan_placement(request, nodes)
    if plan is None:
        usable = [node for node in alive if node.takes(request)]
        # Nodes that cannot reach the parameter-server Redis may reach it later, and a node
        # whose plugin failed may load it once its agent restarts: not "never".
        note = unreachable_note(request, alive) + plugin_error_note(alive)
        if not fits_empty_cluster(request, usable):
            reason = (
                f"{'cannot run on this cluster now' if note else 'can never run on this cluster'}"
                f": needs {request.describe()}; it has {len(usable)} node(s), "
                f"{sum(n.slots for n in usable)} slot(s), {sum(n.gpus for n in usable)} GPU(s)"
                f"{note}"
            )
            return Preview(feasible=False, reason=reason, assignments=[], never=not note)
        free_slots = sum(node.free_slots for node in usable)
        free_gpus = sum(node.free_gpus for node in usable)
        reason = (
            f"would wait for free resources: needs {request.describe()}; free now: "
            f"{free_slots} slot(s), {free_gpus} GPU(s){note}"
        )
        return Preview(feasible=False, reason=reason, assignments=[])
    ahead = session.scalar(
        select(func.count()).where(Job.state == JobState.QUEUED, Job.priority >= priority)
    )
    reason = f"fits now: {plan.describe()}"
    if ahead:
        reason += f"; {ahead} queued job(s) would be placed first"
    return Preview(feasible=True, reason=reason, assignments=list(plan.assignments))
