"""What each layer costs a training step: the pipeline planner's input.

`estimate_costs` derives the costs from the compiled net alone, from its shapes and weights (so
it also works on torch's meta device, where the service compiles a job); `profile_costs`
measures them on real batches. Both give, per layer, the forward plus backward time and the
bytes of its outputs for one batch of `data.batch_size` samples.
"""

from __future__ import annotations

import copy
import math
import statistics
import time
from collections import defaultdict
from collections.abc import Iterable
from typing import NamedTuple

import torch

from dsl.compiler import CompiledJob
from dsl.graph import SourceRef, phases_of
from dsl.layers.base import Shape
from dsl.net import CompiledLayer

# Turns estimated operations into time: one CPU core's rate in matrix products, 50 GFLOP/s.
# Only the ratios between layers choose the cuts; the milliseconds of an estimate are on this
# scale.
NOMINAL_FLOPS_PER_MS = 5e7
# A backward pass computes the gradients of the inputs and of the weights: two products for
# each of the forward pass's.
BACKWARD_FACTOR = 2.0
FLOAT_BYTES = 4


class LayerCost(NamedTuple):
    """One layer's cost for one batch of `data.batch_size` samples."""

    time_ms: float  # forward and backward
    activation_bytes: int  # its outputs, which the backward pass reads


def runs_in_training(layer: CompiledLayer) -> bool:
    """Layers of the test phase only cost a training step nothing."""
    return "train" in phases_of(layer.config)


def estimate_costs(job: CompiledJob) -> dict[str, LayerCost]:
    """Layer name -> its estimated cost, from each module's `forward_flops` per sample."""
    batch = job.spec.data.batch_size
    shapes = {layer.config.name: layer.out_shape for layer in job.net.compiled}
    costs = {}
    for layer in job.net.compiled:
        if not runs_in_training(layer):
            costs[layer.config.name] = LayerCost(0.0, 0)
            continue
        in_shapes = [_source_shape(shapes[ref.layer], ref) for ref in layer.sources]
        flops = layer.module.forward_flops(in_shapes, layer.out_shape) * batch
        costs[layer.config.name] = LayerCost(
            flops * (1 + BACKWARD_FACTOR) / NOMINAL_FLOPS_PER_MS,
            _numel(layer.out_shape) * FLOAT_BYTES * batch,
        )
    return costs


def _source_shape(shape: Shape | list[Shape], ref: SourceRef) -> Shape:
    """The shape of the output `ref` names (a layer with several outputs has a list)."""
    return shape[ref.output or 0] if isinstance(shape, list) else shape


def _source_value(value: torch.Tensor | tuple[torch.Tensor, ...], ref: SourceRef) -> torch.Tensor:
    return value[ref.output or 0] if isinstance(value, tuple) else value


def _numel(shape: Shape | list[Shape]) -> int:
    shapes = shape if isinstance(shape, list) else [shape]
    return sum(math.prod(part) for part in shapes)


Batch = tuple[torch.Tensor, torch.Tensor]


def profile_costs(
    job: CompiledJob, batches: Iterable[Batch], *, repeats: int = 3
) -> dict[str, LayerCost]:
    """Layer name -> its cost measured on `batches` of (samples, labels).

    A forward pass of the whole net records what every layer reads; then each layer runs alone
    on those inputs, forward and backward (from its outputs, all ones), `repeats` times after
    one untimed run. The median time and the outputs' bytes are scaled from each batch's size
    to `data.batch_size`. The job's own net is left alone (a copy runs: batch norm's statistics
    and recurrent state change when a layer runs in training mode).
    """
    net = copy.deepcopy(job.net).train()
    batch_size = job.spec.data.batch_size
    times: dict[str, list[float]] = defaultdict(list)
    sizes: dict[str, list[float]] = defaultdict(list)
    for x, y in batches:
        scale = batch_size / len(x)
        net.reset_state()
        with torch.no_grad():
            outputs = net(x, y).outputs
        for layer in net.compiled:
            name = layer.config.name
            if not runs_in_training(layer) or layer.config.type == "input":
                size = _nbytes(outputs[name]) if name in outputs else 0
                times[name].append(0.0)
                sizes[name].append(size * scale)
                continue
            inputs = [_source_value(outputs[ref.layer], ref) for ref in layer.sources]
            labels = [y] if layer.module.is_loss or layer.module.is_metric else []
            for attempt in range(repeats + 1):
                elapsed, size = _run_alone(layer, inputs, labels)
                if attempt:  # the first run warms up allocators and kernels
                    times[name].append(elapsed * scale)
            sizes[name].append(size * scale)
    if not times:
        raise ValueError("profile_costs needs at least one batch")
    return {
        name: LayerCost(statistics.median(times[name]), round(statistics.median(sizes[name])))
        for name in times
    }


def _run_alone(
    layer: CompiledLayer, inputs: list[torch.Tensor], labels: list[torch.Tensor]
) -> tuple[float, int]:
    """(milliseconds, output bytes) of one forward and backward pass of `layer` alone."""
    module = layer.module
    if module.stateful:
        module.reset_state()  # type: ignore[operator]  # a state from the last run has no graph
    leaves = [t.detach().requires_grad_(t.is_floating_point()) for t in inputs]
    _synchronize(leaves)
    start = time.perf_counter()
    out = module(*leaves, *labels)
    parts = out if isinstance(out, tuple) else (out,)
    needs = [part for part in parts if part.requires_grad]
    if needs:
        torch.autograd.backward(needs, [torch.ones_like(part) for part in needs])
    _synchronize(leaves)
    return (time.perf_counter() - start) * 1e3, _nbytes(out)


def _synchronize(tensors: list[torch.Tensor]) -> None:
    """Wait for a GPU's queued kernels, so that the clock measures them."""
    if any(t.is_cuda for t in tensors):
        torch.cuda.synchronize()


def _nbytes(value: torch.Tensor | tuple[torch.Tensor, ...]) -> int:
    parts = value if isinstance(value, tuple) else (value,)
    return sum(part.numel() * part.element_size() for part in parts)
