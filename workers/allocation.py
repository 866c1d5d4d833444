"""One placed process of a job, as the scheduler writes it to Redis and a worker reads it.

The scheduler fills the hash Keys.allocation(id) before it dispatches the Celery task that
carries only the id; the node agent and the worker process read everything else from here.
The agent and the scheduler add their own bookkeeping fields (CLAIMED, STOP, ...).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

from workers.events import Keys

# Bookkeeping fields of the allocation hash besides the AllocationInfo ones.
CLAIMED = "claimed"  # set once (HSETNX) by the agent that runs it: redeliveries are no-ops
FINISHED = "finished"  # the final state the agent reported
STOP = "stop"  # the scheduler wants this one process stopped (its node was lost)
DISPATCHED = "dispatched"  # the Celery task was sent


@dataclass(frozen=True)
class AllocationInfo:
    allocation_id: int
    job_id: int
    role: str  # worker | server
    group: int
    rank: int
    world: int  # workers in this worker group
    slots: int
    gpus: int
    node: str
    framework: str
    topology: dict[str, Any]
    spec: dict[str, Any]  # the execution spec: validated, dataset names resolved to paths
    run_dir: Path

    def to_hash(self) -> dict[str, str]:
        return {
            "job_id": str(self.job_id),
            "role": self.role,
            "group": str(self.group),
            "rank": str(self.rank),
            "world": str(self.world),
            "slots": str(self.slots),
            "gpus": str(self.gpus),
            "node": self.node,
            "framework": self.framework,
            "topology": json.dumps(self.topology),
            "spec": json.dumps(self.spec),
            "run_dir": str(self.run_dir),
        }

    @classmethod
    def from_hash(cls, allocation_id: int, fields: dict[str, str]) -> AllocationInfo:
        return cls(
            allocation_id=allocation_id,
            job_id=int(fields["job_id"]),
            role=fields["role"],
            group=int(fields["group"]),
            rank=int(fields["rank"]),
            world=int(fields["world"]),
            slots=int(fields["slots"]),
            gpus=int(fields["gpus"]),
            node=fields["node"],
            framework=fields["framework"],
            topology=json.loads(fields["topology"]),
            spec=json.loads(fields["spec"]),
            run_dir=Path(fields["run_dir"]),
        )


def stop_requested(client: redis.Redis, keys: Keys, job_id: int, allocation_id: int) -> bool:
    """The user cancelled the job, or the scheduler stopped this allocation."""
    pipe = client.pipeline(transaction=False)
    pipe.exists(keys.cancel(job_id))
    pipe.hexists(keys.allocation(allocation_id), STOP)
    cancelled, stopped = pipe.execute()
    return bool(cancelled) or bool(stopped)
