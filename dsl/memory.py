"""What one worker process of a job holds at its peak, estimated from the compiled net.

`trainyard validate` and the service show the estimate; the service refuses a job whose
estimate exceeds its memory limit (cluster.resources.memory_mb) or the largest share of a
node's memory its slots could get. The node agent enforces the limit on the worker process
(scheduler/agent/confine.py), so an estimate that is too low ends in a clear out-of-memory
failure of that worker, not in harm to its neighbours.

The parts, for the whole net (a pipeline's stage: for its own layers, the largest stage being
the estimate): parameters and their gradients (float32), the updater's state per parameter
(its moments), the activations of a training step for the worker's share of the batch (every
layer's outputs, which the backward pass reads, plus the gradient of the largest), every split
of the data the worker holds, and the interpreter and torch themselves.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from dsl.compiler import CompiledJob
from dsl.graph import phases_of
from dsl.schema import JobSpec
from dsl.topology import Topology

FLOAT_BYTES = 4
MB = 2**20
# The interpreter, torch and the trainer's own objects before any tensor: measured as a fresh
# worker's resident set (a forked worker shares most of these pages with its fork server).
RUNTIME_BYTES = 400 * MB


@dataclass(frozen=True)
class MemoryEstimate:
    """One worker process's peak memory, part by part, in bytes."""

    parameters: int
    gradients: int
    updater_state: int
    activations: int
    data: int
    runtime: int = RUNTIME_BYTES

    @property
    def total(self) -> int:
        return (
            self.parameters
            + self.gradients
            + self.updater_state
            + self.activations
            + self.data
            + self.runtime
        )

    @property
    def total_mb(self) -> int:
        return math.ceil(self.total / MB)

    def parts(self) -> dict[str, int]:
        """Each part in MB (rounded up), for a table."""
        return {
            "parameters": math.ceil(self.parameters / MB),
            "gradients": math.ceil(self.gradients / MB),
            "updater_state": math.ceil(self.updater_state / MB),
            "activations": math.ceil(self.activations / MB),
            "data": math.ceil(self.data / MB),
            "runtime": math.ceil(self.runtime / MB),
        }

    def describe(self) -> str:
        shown = ", ".join(f"{name.replace('_', ' ')} {mb}" for name, mb in self.parts().items())
        return f"{self.total_mb} MB ({shown})"


def updater_slots(spec: JobSpec) -> int:
    """Numbers of updater state per parameter: its momentum buffer, its moments."""
    updater = spec.updater
    kind = updater.type
    if kind == "sgd":
        return 1 if getattr(updater, "momentum", 0.0) > 0 else 0
    if kind in ("adam", "adamax"):
        return 3 if getattr(updater, "amsgrad", False) else 2
    if kind == "adadelta":
        return 2
    if kind == "rmsprop":
        return 2 if getattr(updater, "momentum", 0.0) > 0 else 1
    return 1  # nesterov's buffer, adagrad's sum of squares; a plugin updater's guessed at one


def estimate_memory(
    job: CompiledJob,
    topology: Topology,
    data_bytes: int | None,
    stages: list[list[str]] | None = None,
) -> MemoryEstimate:
    """One worker's peak; `data_bytes`: what its data takes in memory (None: unknown, 0);
    `stages`: a pipeline's layers per stage, each on a worker of its own (the largest's)."""
    if stages:
        return max(
            (_estimate(job, topology, data_bytes, set(layers)) for layers in stages),
            key=lambda estimate: estimate.total,
        )
    return _estimate(job, topology, data_bytes, None)


def _estimate(
    job: CompiledJob, topology: Topology, data_bytes: int | None, layers: set[str] | None
) -> MemoryEstimate:
    held = [c for c in job.net.compiled if layers is None or c.config.name in layers]
    params = sum(p.numel() for c in held for p in c.module.parameters()) * FLOAT_BYTES
    batch = job.spec.data.batch_size
    if topology.stages == 1 and topology.workers > 1:
        batch = math.ceil(batch / topology.nworkers_per_group)  # each reads its share
    outputs = [
        math.prod(shape) * batch * FLOAT_BYTES
        for layer in held
        if "train" in phases_of(layer.config)
        for shape in (layer.out_shape if isinstance(layer.out_shape, list) else [layer.out_shape])
    ]
    return MemoryEstimate(
        parameters=params,
        gradients=params,
        updater_state=params * updater_slots(job.spec),
        activations=sum(outputs) + max(outputs, default=0),
        data=data_bytes or 0,
    )
