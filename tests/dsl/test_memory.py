"""The peak-memory estimate of one worker (dsl/memory.py), part by part, from a compiled net."""

from __future__ import annotations

from pathlib import Path

from dsl.compiler import compile_job
from dsl.layers.base import BuildContext
from dsl.memory import FLOAT_BYTES, MB, RUNTIME_BYTES, estimate_memory
from dsl.topology import resolve_topology

MLP = (Path(__file__).resolve().parents[2] / "examples" / "digits_mlp.yaml").read_text()
DIGITS = BuildContext(sample_shape=(1, 8, 8), num_classes=10)


def test_each_part_of_the_estimate() -> None:
    job = compile_job(MLP, DIGITS, overrides={"data.batch_size": 64})
    topology = resolve_topology(job.spec.cluster)
    memory = estimate_memory(job, topology, data_bytes=10 * MB)
    params = 50_826 * FLOAT_BYTES
    # SGD with momentum keeps one buffer per parameter.
    assert (memory.parameters, memory.gradients, memory.updater_state) == (params,) * 3
    # Every training layer's outputs for the batch (the input's 64, fc1/tanh1's 256, fc2/tanh2's
    # 128, fc3's 10, the loss's scalar), plus the largest again for its gradient.
    outputs = [64, 256, 256, 128, 128, 10, 1]
    assert memory.activations == (sum(outputs) + 256) * 64 * FLOAT_BYTES
    assert (memory.data, memory.runtime) == (10 * MB, RUNTIME_BYTES)
    assert memory.total == 3 * params + memory.activations + 10 * MB + RUNTIME_BYTES


def test_workers_of_a_group_each_hold_their_share_of_the_batch() -> None:
    overrides = {"data.batch_size": 64, "cluster.framework": "allreduce"}
    job = compile_job(MLP, DIGITS, overrides={**overrides, "cluster.nworkers_per_group": 4})
    one = compile_job(MLP, DIGITS, overrides={"data.batch_size": 64})
    four = estimate_memory(job, resolve_topology(job.spec.cluster), 0)
    alone = estimate_memory(one, resolve_topology(one.spec.cluster), 0)
    assert four.activations * 4 == alone.activations


def test_a_pipelines_estimate_is_its_largest_stages() -> None:
    job = compile_job(MLP, DIGITS)
    topology = resolve_topology(job.spec.cluster)
    stages = [["data", "fc1", "tanh1"], ["fc2", "tanh2", "fc3", "loss"]]
    memory = estimate_memory(job, topology, 0, stages)
    first, second = (estimate_memory(job, topology, 0, [stage]) for stage in stages)
    assert first.parameters == (64 * 256 + 256) * FLOAT_BYTES  # fc1's
    assert second.parameters == (256 * 128 + 128 + 128 * 10 + 10) * FLOAT_BYTES  # fc2's, fc3's
    assert memory == max(first, second, key=lambda estimate: estimate.total)
    assert memory.total < estimate_memory(job, topology, 0).total
